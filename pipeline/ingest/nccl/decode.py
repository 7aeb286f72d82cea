"""lenient_json: strict JSON, or the truncated or Python-literal near-JSON that NCCL and PyTorch
tools write, for NCCL-family dumps. Flight Recorder pickles are read by unpickle.py.
"""

from __future__ import annotations

import ast
import json
import re

import msgspec

from ..errors import TraceError

# --- lenient JSON --------------------------------------------------------------------------------

_TOK = re.compile(
    r"""\s*(?:
    (?P<str>"(?:[^"\\\n]|\\.)*")
  | (?P<sstr>'(?:[^'\\\n]|\\.)*')
  | (?P<hex>0[xX][0-9a-fA-F]+\b)
  | (?P<num>-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<punct>[{}\[\](),:])
  | (?P<ell>\.\.\.|…)
  | (?P<word>[A-Za-z_][\w.+-]*)
)""",
    re.VERBOSE,
)
_WORDS = {
    "true": "true",
    "false": "false",
    "null": "null",
    "True": "true",
    "False": "false",
    "None": "null",
    "NaN": "null",
    "nan": "null",
    "Infinity": "null",
    "-Infinity": "null",
}


def lenient_json(text: str, notes: list[str]):
    """Decode JSON, or the near-JSON NCCL/PyTorch tools write, into Python objects.

    Strict JSON goes through msgspec. Otherwise the text is re-tokenized: Python tuples `( )`
    become arrays, single-quoted strings, True/False/None and bare words (2.28-2.29 profiler
    plugin's `ncclFloat32`, `0x5020...`) become JSON values, `...` elisions and trailing commas are
    dropped, and a truncated document is cut after its last complete element (of a top-level
    array, of an array that is a member of the top-level object such as a dump's entries, or a
    top-level member) and closed. Each repair adds a note.
    Raises TraceError (one line) when nothing usable remains.
    """
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError:
        pass
    out: list[str] = []
    stack: list[str] = []  # '{' or '['
    expect_key: list[bool] = []
    safe = None  # (len(out), stack copy, expect copy)
    repairs: set[str] = set()
    pos, n = 0, len(text)
    truncated = False

    def value_done():
        nonlocal safe
        if stack and stack[-1] == "{":
            expect_key[-1] = True
        # a safe cut: after an element of an array at depth <= 2 (a top-level event list, a dump's
        # entries) or after a member of the top-level object - never inside a half-read element
        if len(stack) == 1 or (len(stack) == 2 and stack[-1] == "["):
            safe = (len(out), list(stack), list(expect_key))

    while pos < n:
        m = _TOK.match(text, pos)
        if not m or m.end() == pos:
            if text[pos:].strip() == "":
                break
            if text[pos:].lstrip()[:1] in ('"', "'"):
                truncated = True  # unterminated string at the end
                break
            raise TraceError(f"not valid JSON (unexpected {text[pos:].lstrip()[:20]!r} at offset {pos})")
        pos = m.end()
        kind = m.lastgroup
        tok = m.group(kind)
        if kind == "punct":
            if tok in "{[(":
                out.append("{" if tok == "{" else "[")
                stack.append("{" if tok == "{" else "[")
                expect_key.append(tok == "{")
                if tok == "(":
                    repairs.add("Python tuples read as arrays")
            elif tok in "}])":
                if not stack:
                    raise TraceError(f"not valid JSON (unbalanced {tok!r} at offset {m.start(kind)})")
                while out and out[-1] == ",":
                    out.pop()
                    repairs.add("trailing commas dropped")
                out.append("}" if stack[-1] == "{" else "]")
                stack.pop()
                expect_key.pop()
                value_done()
            elif tok == ",":
                if out and out[-1] not in (",", "[", "{"):
                    out.append(",")
            else:  # ':'
                out.append(":")
                if expect_key:
                    expect_key[-1] = False
            continue
        if kind == "ell":
            repairs.add("'...' elisions dropped")
            continue
        _scalar(out, kind, tok, repairs)
        if stack and stack[-1] == "{" and expect_key[-1]:
            continue  # a key: the pair completes with its value
        value_done()
    if stack or truncated:
        _cut_truncated(out, safe, repairs)
    try:
        obj = msgspec.json.decode("".join(out))
    except msgspec.DecodeError as e:
        raise TraceError(f"not valid JSON ({e})") from None
    if repairs:
        notes.append("lenient JSON: " + "; ".join(sorted(repairs)))
    return obj


def _scalar(out: list[str], kind: str, tok: str, repairs: set[str]) -> None:
    """Append the JSON text of one string, number, hex or bare-word token of lenient_json to `out`."""
    if kind == "str":
        out.append(tok)
    elif kind == "sstr":
        try:
            out.append(json.dumps(ast.literal_eval(tok)))
        except (ValueError, SyntaxError):
            out.append(json.dumps(tok[1:-1]))
        repairs.add("single-quoted strings read")
    elif kind == "num":
        out.append(tok)
    elif kind == "hex":
        out.append(json.dumps(tok))
        repairs.add("bare words read as strings")
    else:
        if tok in _WORDS:
            out.append(_WORDS[tok])
            if tok not in ("true", "false", "null"):
                repairs.add("Python literals read as JSON")
        else:
            out.append(json.dumps(tok))
            repairs.add("bare words read as strings")


def _cut_truncated(out: list[str], safe, repairs: set[str]) -> None:
    """Cut a truncated lenient_json token list after its last complete element (`safe`: the
    (length, stack, expect_key) there) and close the open containers."""
    if safe is None:
        raise TraceError("truncated JSON: no complete element")
    k, st, _ = safe
    del out[k:]
    while out and out[-1] in (",", ":"):
        out.pop()
    if out and st and st[-1] == "{" and out[-1].startswith('"') and (len(out) < 2 or out[-2] in ("{", ",")):
        out.pop()  # a dangling key
        while out and out[-1] == ",":
            out.pop()
    for s in reversed(st):
        out.append("}" if s == "{" else "]")
    repairs.add("truncated: cut after the last complete element")

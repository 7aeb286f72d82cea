"""Readers for the encoded forms of NCCL-family dumps: lenient_json (strict JSON, or the truncated
or Python-literal near-JSON that NCCL and PyTorch tools write) and safe_unpickle (the restricted
unpickler for Flight Recorder pickles: only plain containers and scalars are built).
"""

from __future__ import annotations

import ast
import json
import pickle
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


# --- restricted unpickling ------------------------------------------------------------------------


def _plain_list(*args):
    return list(args[0]) if args else []


#: The only globals a Flight Recorder pickle may name. torch's C++ pickler writes generic dicts,
#: lists, tuples, strings, ints, floats, bools and None with opcodes only; typed int/float/bool
#: lists go through torch.jit._pickle.build_* helpers, mapped here to a plain list. Anything else
#: (os.system, builtins.eval, torch tensors, ...) is refused before it is constructed.
MAX_PICKLE_ALLOC = 1 << 20  # bytes(n) / bytearray(n): the most a pickle may ask to allocate


def _buffer(ctor):
    """bytes / bytearray, refusing a size argument past MAX_PICKLE_ALLOC (a 35-byte pickle can
    ask bytearray(6 GiB))."""

    def make(*args):
        if args and isinstance(args[0], int) and not isinstance(args[0], bool) and args[0] > MAX_PICKLE_ALLOC:
            raise pickle.UnpicklingError(
                f"refused {ctor.__name__}({args[0]}): an allocation past {MAX_PICKLE_ALLOC}"
            )
        return ctor(*args)

    return make


def _text(*args):
    """str of text only: str(bytes, encoding) or str(str). str(obj) of a container renders it, and
    a 106-byte pickle of shared lists renders to gigabytes."""
    if args and not isinstance(args[0], (str, bytes, bytearray)):
        raise pickle.UnpicklingError(f"refused str() of a {type(args[0]).__name__} (text only)")
    return str(*args)


PICKLE_ALLOW = {
    ("builtins", "dict"): dict,
    ("builtins", "list"): list,
    ("builtins", "tuple"): tuple,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "str"): _text,
    ("builtins", "int"): int,
    ("builtins", "float"): float,
    ("builtins", "bool"): bool,
    ("builtins", "bytes"): _buffer(bytes),
    ("builtins", "bytearray"): _buffer(bytearray),
    ("builtins", "complex"): complex,
    ("collections", "OrderedDict"): dict,
    ("torch.jit._pickle", "build_intlist"): _plain_list,
    ("torch.jit._pickle", "build_doublelist"): _plain_list,
    ("torch.jit._pickle", "build_boollist"): _plain_list,
}


class RestrictedUnpickler(pickle.Unpickler):
    """pickle.Unpickler whose find_class resolves only PICKLE_ALLOW; persistent ids are refused."""

    def find_class(self, module, name):
        if module == "__builtin__":  # protocol <= 2 spelling of builtins
            module = "builtins"
        f = PICKLE_ALLOW.get((module, name))
        if f is None:
            raise pickle.UnpicklingError(f"refused to load {module}.{name} (not on the allow-list)")
        return f

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("refused a persistent id (tensor storage)")


CONTAINERS = (list, tuple, set, frozenset, dict)


def expanded_size(root, budget: int) -> int:
    """The number of values `root` holds counting every reference to a shared container again
    (what walking it, or writing its rows, costs), computed once per container: linear in the
    number of distinct objects however much they are shared. Raises TraceError as soon as the
    count passes `budget`, or for a reference cycle."""
    sizes: dict[int, int] = {}
    open_ids: set[int] = set()
    stack = [(root, False)]

    def kids(o):
        return [x for kv in o.items() for x in kv] if isinstance(o, dict) else list(o)

    while stack:
        obj, done = stack.pop()
        if not isinstance(obj, CONTAINERS):
            continue
        i = id(obj)
        if done:
            open_ids.discard(i)
            n = 1 + sum(sizes[id(k)] if isinstance(k, CONTAINERS) else 1 for k in kids(obj))
            if n > budget:
                raise TraceError(
                    f"pickle bomb: its values expand to more than {budget} through shared references "
                    "(a container referenced many times); refused"
                )
            sizes[i] = n
        elif i in sizes:
            continue
        elif i in open_ids:
            raise TraceError("pickle with a reference cycle (a container that holds itself); refused")
        else:
            open_ids.add(i)
            stack.append((obj, True))
            stack.extend((k, False) for k in kids(obj) if isinstance(k, CONTAINERS))
    return sizes.get(id(root), 1)


def safe_unpickle(data: bytes):
    """Unpickle `data` with RestrictedUnpickler. Raises TraceError (one line) for a refused class,
    a refused allocation (bytes/bytearray of a size, str of a container), a truncated or corrupt
    pickle, and for values that expand past max(10^6, 4 x its bytes) through shared references
    (expanded_size: a legitimate dump holds at most about one value per byte)."""
    import io

    try:
        obj = RestrictedUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as e:
        msg = str(e)
        if msg.startswith("refused"):
            raise TraceError(f"unsafe pickle: {msg}") from None
        if "truncated" in msg:
            raise TraceError("truncated pickle") from None
        raise TraceError(f"corrupt pickle ({msg})") from None
    except EOFError:
        raise TraceError("truncated pickle") from None
    except (
        ValueError,
        TypeError,
        KeyError,
        IndexError,
        AttributeError,
        UnicodeDecodeError,
        OverflowError,
        MemoryError,
        RecursionError,
    ) as e:
        raise TraceError(f"corrupt pickle ({type(e).__name__}: {str(e)[:80]})") from None
    expanded_size(obj, max(10**6, 4 * len(data)))  # TraceError (a ValueError): outside the try
    return obj

"""Kernel names a person can read: the one place the report's charts, tables and the findings'
text shorten GPU kernel names (the full name stays in tooltips, hover titles and the JSON).

short_name(name): the kernel's own name, without its return type, namespaces, template arguments
and parameter list, e.g.
  void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, ...>(...)
    -> vectorized_elementwise_kernel
  ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)
    -> ncclDevKernel_AllReduce_Sum_f32_RING_LL
  ampere_sgemm_128x64_nn -> ampere_sgemm_128x64_nn (unchanged)
A generic wrapper (cutlass::Kernel<X>, Kernel2<X>, device_kernel<X>, enable_sm90_or_later<X>)
names its first template argument instead; an Itanium-mangled name (_ZN5aiter24add_...) its last
nested name; a name that is not a C++ signature (Memcpy HtoD (Pageable -> Device), Triton and
cuBLAS names) is kept; anything longer than MAX_LEN characters is cut with an ellipsis.

short_names(names): {full name: label} with every label distinct, for a chart's or a table's
set of names. Names whose short forms collide get a bracketed suffix that tells them apart: the
first template argument where they differ, namespaces and parameter lists left out
(`vectorized_elementwise_kernel [CUDAFunctor_add<int>]` beside `[CUDAFunctor_add<float>]`), else
the first word of the name where they differ, else a number (#1, #2, in the order of the full
names).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MAX_LEN = 60
HOVER_LEN = 600
_ARG_LEN = 56
# wrappers whose own name says nothing: the kernel is their first template argument
_WRAPPERS = re.compile(r"^(?:Kernel2?|device_kernel|enable_sm\w*)$")
_ANON = re.compile(r"\(anonymous namespace\)::")
_LAMBDA = re.compile(r"::\{lambda[^{}]*\}|::operator\(\)\(\)(?: const)?")
_NAMESPACE = re.compile(r"\b\w+::")
_WORD = re.compile(r"\w+")


def _cut(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def _demangle_last(name: str) -> str | None:
    """The last nested name of an Itanium-mangled symbol (_ZN2ck16tensor_operation...): enough to
    read which kernel it is."""
    i = 2
    if name[i : i + 1] == "N":
        i += 1
    while name[i : i + 1] in ("r", "V", "K"):
        i += 1
    parts = []
    while i < len(name) and name[i].isdigit():
        j = i
        while j < len(name) and name[j].isdigit():
            j += 1
        n = int(name[i:j])
        parts.append(name[j : j + n])
        i = j + n
    return parts[-1] if parts and parts[-1] else None


def _close(s: str, i: int) -> int:
    """Index just past the bracket group opening at s[i] ('<' or '('), -1 when unbalanced."""
    depth = 0
    for j in range(i, len(s)):
        c = s[j]
        if c in "<(":
            depth += 1
        elif c in ">)":
            depth -= 1
            if depth == 0:
                return j + 1
    return -1


def _split_args(inner: str) -> list[str]:
    """Top-level comma-separated items of a template argument list (without its brackets)."""
    out, depth, start = [], 0, 0
    for j, c in enumerate(inner):
        if c in "<(":
            depth += 1
        elif c in ">)":
            depth -= 1
        elif c == "," and depth == 0:
            out.append(inner[start:j].strip())
            start = j + 1
    out.append(inner[start:].strip())
    return [a for a in out if a]


def _parse(name: str) -> tuple[str, list[str]] | None:
    """(qualified name, top-level template arguments) of a C++ signature, None when `name` is not
    one (a space or the end before any '<' or '(' at depth 0)."""
    s = _ANON.sub("", name.strip())
    if s.startswith("void "):
        s = s[5:]
    for i, c in enumerate(s):
        if c == " ":
            return None
        if c in "<(":
            if i == 0:
                return None
            qual = s[:i]
            if c == "(":
                return qual, []
            end = _close(s, i)
            return qual, ([] if end < 0 else _split_args(s[i + 1 : end - 1]))
    return None


def _base(qual: str) -> str:
    return qual.rsplit("::", 1)[-1]


def short_name(name: str) -> str:
    """The kernel's own name (module doc), at most MAX_LEN characters."""
    if name.startswith("_Z"):
        return _cut(_demangle_last(name) or name, MAX_LEN)
    parsed = _parse(name)
    if parsed is None:
        return _cut(name, MAX_LEN)
    qual, targs = parsed
    base = _base(qual)
    if _WRAPPERS.match(base) and targs and not targs[0][:1].isdigit():
        return short_name(targs[0])
    return _cut(base or name, MAX_LEN)


def hover_name(name: str) -> str:
    """The full name for a tooltip (cut at HOVER_LEN characters: some are 2,000 long)."""
    return _cut(name, HOVER_LEN)


def _clean(arg: str) -> str:
    """A template argument for reading: namespaces, lambdas and parameter lists left out."""
    s = _LAMBDA.sub("", _ANON.sub("", arg))
    out, i = [], 0
    while i < len(s):
        c = s[i]
        if c == "(" and i and (s[i - 1].isalnum() or s[i - 1] in "_>"):
            end = _close(s, i)
            if end < 0:
                break
            i = end
            continue
        out.append(c)
        i += 1
    return re.sub(r"\s*>", ">", _NAMESPACE.sub("", "".join(out))).strip()


def _arg_labels(args: list[list[str]], depth: int = 0) -> list[str] | None:
    """Per name (its template arguments), a label from the argument position that tells the most
    of them apart (descending into a shared wrapper of long arguments; names still alike get the
    next position too), or None when the arguments do not tell them apart."""
    width = max(map(len, args), default=0)
    cols = [[a[k] if k < len(a) else "" for a in args] for k in range(width)]
    k = max(range(width), key=lambda i: (len(set(cols[i])), -i), default=None)
    if k is None or len(set(cols[k])) == 1 or depth > 3:
        return None
    here = cols[k]
    parsed = [_parse(x) for x in here]
    if all(p and p[1] for p in parsed) and len({_base(p[0]) for p in parsed}) == 1:
        inner = _arg_labels([p[1] for p in parsed], depth + 1)
        if inner is not None and max(len(_clean(x)) for x in here) > 30:
            return inner
    labels = [_cut(_clean(x), _ARG_LEN) for x in here]
    for lab in {x for x in labels if labels.count(x) > 1}:
        idx = [i for i, x in enumerate(labels) if x == lab]
        rest = _arg_labels([args[i][:k] + args[i][k + 1 :] for i in idx], depth + 1)
        for i, r in zip(idx, rest or []):
            labels[i] = f"{lab}, {r}"
    return labels


def _template_labels(names: list[str]) -> list[str] | None:
    args = []
    for n in names:
        p = _parse(n)
        args.append(p[1] if p else [])
    return _arg_labels(args)


def _word_labels(names: list[str]) -> list[str] | None:
    """Per name, the part of its name from the first word where the names differ on (words split
    at '_' and non-word characters, namespaces left out), after its first words."""
    seqs = [re.findall(r"[A-Za-z0-9]+", _clean(n)) for n in names]
    k = next(
        (i for i in range(max(map(len, seqs))) if len({s[i] if i < len(s) else "" for s in seqs}) > 1),
        None,
    )
    if k is None:
        return None
    return [_cut("_".join(s[k:]) or "…", _ARG_LEN) for s in seqs]


def short_names(names: Iterable[str]) -> dict[str, str]:
    """{name: label}: short_name of each, with colliding short forms told apart (module doc)."""
    uniq = sorted(set(names))
    groups: dict[str, list[str]] = {}
    for n in uniq:
        groups.setdefault(short_name(n), []).append(n)
    out: dict[str, str] = {}
    for short, group in groups.items():
        if len(group) == 1:
            out[group[0]] = short
            continue
        labels = _template_labels(group) or _word_labels(group)
        got = [f"{short} [{x}]" for x in labels] if labels else [short] * len(group)
        for g in {x for x in got if got.count(x) > 1}:  # still alike: numbered, in full-name order
            idx = [i for i, x in enumerate(got) if x == g]
            for j, i in enumerate(idx, 1):
                got[i] = f"{g} #{j}"
        out.update(zip(group, got))
    return out

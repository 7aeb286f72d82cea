"""Restricted unpickling of Flight Recorder pickles (safe_unpickle): only plain containers and
scalars are built, and the CPU time and memory that reading a pickle costs are bounded in
proportion to its size (issue 39, items 1-3).

The unpickler is the standard library's pure-Python one (pickle._Unpickler) with its own table of
opcodes, about 8x slower than the C one (5 MB/s; a 6.4 MB dump of 20,000 entries in 1.2 s, of
5.3 s for the whole parse) but every object it builds passes through code that checks it:

- Classes: find_class resolves only PICKLE_ALLOW (plain containers, scalars and torch's typed-list
  helpers, each a function that checks what it builds); the opcodes that build other objects
  (INST, OBJ, NEWOBJ, NEWOBJ_EX, BUILD, EXT1/2/4), persistent ids (tensor storage) and
  out-of-band buffers are refused before anything is constructed.
- Colliding keys. Python's hash of an int is not randomized (hash(k * (2**61 - 1)) == 0 for every
  k), nor of a float, a complex or a tuple (a function of its items' hashes only), so a pickle can
  hold keys that all share one hash, and each insertion then compares with every earlier key:
  60,000 such keys, 779 KB, cost 89 s of CPU in the C unpickler. Two rules, both checked as each
  key is inserted (SETITEM, SETITEMS, DICT, ADDITEMS, FROZENSET, and dict/set/frozenset calls):
  a dict key or set member must be a str, bytes, int of at most 64 bits, float, bool or None (no
  tuple, frozenset or complex: their hash costs their size again at every use, and equal hashes
  are made at will); and at most MAX_SAME_HASH distinct keys of one dict or set may share a hash
  (a re-inserted equal key is a replacement, not a new key). An insertion therefore compares with
  at most MAX_SAME_HASH keys, and a pickle of colliding keys is refused at the key after them,
  before the rest is read. str and bytes hashes are randomized per process; the count holds
  without that.
- Memo indexes: PUT and LONG_BINPUT may name any index, and the C unpickler grows its memo array
  to twice the index (a 7-byte pickle made it zero 8 GiB); here an index past the pickle's length
  (more objects than bytes: no real pickle) is refused.
- Calls (REDUCE) build new objects from ones already read, so a 5-byte call can copy a shared
  megabyte list again: the bytes every call reads and builds (sys.getsizeof of its arguments and
  of its result, both linear in the work; bytes(n) and bytearray(n) before they allocate, at most
  MAX_PICKLE_ALLOC_BYTES each) count against the expansion budget below, and the call that
  passes it is refused.
- Expansion (expanded_bytes, after loading): what the parsed values stand for once every reference
  to a shared string or container is written out again - VALUE_BYTES per value plus the bytes of
  each string (UTF-8), bytes object or int (decimal digits), counted at every reference. A 1.05 MB
  pickle whose 2,000 entries share one 1 MiB profiling_name stands for 2.1 GB of strings. It may
  be at most expansion_budget_bytes(pickle bytes) = max(EXPANSION_FLOOR_BYTES, EXPANSION_RATIO x
  pickle bytes): a real dump shares its stack frames between entries (torch's pickler memoizes
  them and repeats a 5-byte reference), about 30 bytes written per pickle byte.

Errors: safe_unpickle raises TraceError (one line) for each refusal ('unsafe pickle: refused ...'),
for an expansion past the budget ('pickle bomb: ...'), and for a truncated or corrupt pickle.
"""

from __future__ import annotations

import io
import pickle
import struct
import sys

from ..errors import DATA_ERRORS, TraceError

MAX_PICKLE_ALLOC_BYTES = 1 << 20  # bytes(n) / bytearray(n): the most one call may ask to allocate
MAX_SAME_HASH = 8  # distinct keys of one dict (members of one set) that may share one hash
MAX_KEY_INT_BITS = 64  # an int key or member wider than this is refused
TRACK_FROM = 64  # a dict or set this large keeps its per-hash key counts (smaller ones recount)
EXPANSION_FLOOR_BYTES = 64 << 20  # the expansion budget of a small pickle
EXPANSION_RATIO = 64  # the expansion budget per pickle byte
VALUE_BYTES = 8  # what one value costs in expanded_bytes, besides its string's bytes

KEY_TYPES = (str, bytes, int, float, bool, type(None))
CONTAINERS = (list, tuple, set, frozenset, dict)


def expansion_budget_bytes(n_bytes: int) -> int:
    """The bytes a pickle of `n_bytes` bytes may stand for (expanded_bytes) and that its calls may
    build: max(EXPANSION_FLOOR_BYTES, EXPANSION_RATIO x n_bytes)."""
    return max(EXPANSION_FLOOR_BYTES, EXPANSION_RATIO * n_bytes)


# --- the allow-list --------------------------------------------------------------------------------


class _Refused(pickle.UnpicklingError):
    """A refusal (its message starts with 'refused')."""


def _check_key(k, what: str) -> None:
    """Raise _Refused for a dict key / set member that is not a plain scalar (KEY_TYPES) or an int
    past MAX_KEY_INT_BITS."""
    t = type(k)
    if t not in KEY_TYPES:
        raise _Refused(
            f"refused a {what} of type {t.__name__} (keys must be str, bytes, int, float, bool or None)"
        )
    if t is int and k.bit_length() > MAX_KEY_INT_BITS:
        raise _Refused(f"refused an int {what} of {k.bit_length()} bits (past {MAX_KEY_INT_BITS})")


def _guarded_insert(c, pairs, counts: dict, is_dict: bool) -> None:
    """Insert `pairs` ((key, value) for a dict, (member, None) for a set) into the dict or set `c`
    whose keys' hash counts are `counts` (hash -> distinct keys), refusing the key that would make
    more than MAX_SAME_HASH distinct keys of one hash: every insertion compares with at most
    MAX_SAME_HASH earlier keys."""
    what = "dict key" if is_dict else "set member"
    for k, v in pairs:
        _check_key(k, what)
        h = hash(k)
        n = counts.get(h, 0)
        if n:
            if k in c:  # an equal key again (at most n comparisons): a replacement
                if is_dict:
                    c[k] = v
                continue
            if n >= MAX_SAME_HASH:
                kind = "dict with more than {} keys" if is_dict else "set with more than {} members"
                raise _Refused(
                    f"refused a {kind.format(MAX_SAME_HASH)} of one hash (made to collide: each "
                    "insertion would compare with every earlier one)"
                )
        counts[h] = n + 1
        if is_dict:
            c[k] = v
        else:
            c.add(k)


def _fresh_counts(c) -> dict:
    counts: dict[int, int] = {}
    for k in c:
        h = hash(k)
        counts[h] = counts.get(h, 0) + 1
    return counts


def _pairs(items) -> list:
    """(key, value) pairs of dict(items): a dict, or an iterable of 2-item sequences."""
    if isinstance(items, dict):
        return list(items.items())
    out = []
    for kv in items:
        if not isinstance(kv, (list, tuple)) or len(kv) != 2:
            raise pickle.UnpicklingError("dict() of an item that is not a pair")
        out.append((kv[0], kv[1]))
    return out


def _dict(*args):
    """dict() / dict(pairs) / OrderedDict(...), built key by key under the collision rules."""
    d: dict = {}
    if args:
        _guarded_insert(d, _pairs(args[0]), {}, True)
    return d


def _set_of(ctor):
    def make(*args):
        s: set = set()
        if args:
            _guarded_insert(s, ((m, None) for m in args[0]), {}, False)
        return s if ctor is set else frozenset(s)

    make.__name__ = ctor.__name__
    return make


def _plain_list(*args):
    return list(args[0]) if args else []


def _buffer(ctor):
    """bytes / bytearray, refusing a size argument past MAX_PICKLE_ALLOC_BYTES (a 35-byte pickle
    can ask bytearray(6 GiB)); the unpickler charges what it builds to the expansion budget."""

    def make(*args):
        if args and isinstance(args[0], int) and not isinstance(args[0], bool):
            if args[0] > MAX_PICKLE_ALLOC_BYTES:
                raise _Refused(
                    f"refused {ctor.__name__}({args[0]}): an allocation past {MAX_PICKLE_ALLOC_BYTES}"
                )
        return ctor(*args)

    make.__name__ = ctor.__name__
    return make


def _text(*args):
    """str of text only: str(bytes, encoding) or str(str). str(obj) of a container renders it, and
    a 106-byte pickle of shared lists renders to gigabytes."""
    if args and not isinstance(args[0], (str, bytes, bytearray)):
        raise _Refused(f"refused str() of a {type(args[0]).__name__} (text only)")
    return str(*args)


#: The only globals a Flight Recorder pickle may name. torch's C++ pickler writes generic dicts,
#: lists, tuples, strings, ints, floats, bools and None with opcodes only; typed int/float/bool
#: lists go through torch.jit._pickle.build_* helpers, mapped here to a plain list. Anything else
#: (os.system, builtins.eval, torch tensors, ...) is refused before it is constructed.
PICKLE_ALLOW = {
    ("builtins", "dict"): _dict,
    ("builtins", "list"): _plain_list,
    ("builtins", "tuple"): tuple,
    ("builtins", "set"): _set_of(set),
    ("builtins", "frozenset"): _set_of(frozenset),
    ("builtins", "str"): _text,
    ("builtins", "int"): int,
    ("builtins", "float"): float,
    ("builtins", "bool"): bool,
    ("builtins", "bytes"): _buffer(bytes),
    ("builtins", "bytearray"): _buffer(bytearray),
    ("builtins", "complex"): complex,
    ("collections", "OrderedDict"): _dict,
    ("torch.jit._pickle", "build_intlist"): _plain_list,
    ("torch.jit._pickle", "build_doublelist"): _plain_list,
    ("torch.jit._pickle", "build_boollist"): _plain_list,
}


# --- the unpickler ---------------------------------------------------------------------------------


def _refuse(what: str):
    def load(self):
        raise _Refused(f"refused {what}")

    return load


class _Dispatch(dict):
    def __missing__(self, code):
        raise pickle.UnpicklingError(f"unknown opcode {bytes([code])!r}")


class RestrictedUnpickler(pickle._Unpickler):
    """pickle._Unpickler (pure Python) with the opcode table of the module docstring: the
    allow-list, key rules, memo bound and call budget. RestrictedUnpickler(data).load() returns
    the object or raises pickle.UnpicklingError (a refusal's message starts with 'refused'),
    EOFError or struct.error (truncated), or the ValueError / TypeError / ... of corrupt data."""

    def __init__(self, data: bytes, budget_bytes: int | None = None):
        super().__init__(io.BytesIO(data))
        self.max_memo = len(data)  # a real pickle memoizes fewer objects than it has bytes
        self.budget_bytes = expansion_budget_bytes(len(data)) if budget_bytes is None else budget_bytes
        self.built_bytes = 0  # what calls read and built (REDUCE)
        self.counts: dict[int, tuple[object, dict]] = {}  # id -> (container, hash counts) of large ones

    def find_class(self, module, name):
        if module == "__builtin__":  # protocol <= 2 spelling of builtins
            module = "builtins"
        f = PICKLE_ALLOW.get((module, name))
        if f is None:
            raise _Refused(f"refused to load {module}.{name} (not on the allow-list)")
        return f

    def persistent_load(self, pid):
        raise _Refused("refused a persistent id (tensor storage)")

    def _insert(self, c, pairs, is_dict: bool) -> None:
        if not isinstance(c, (dict, set)):
            raise pickle.UnpicklingError(f"items added to a {type(c).__name__}")
        kept = self.counts.get(id(c))
        counts = kept[1] if kept is not None else _fresh_counts(c)  # under TRACK_FROM keys: recount
        _guarded_insert(c, pairs, counts, is_dict)
        if kept is None and len(c) >= TRACK_FROM:
            self.counts[id(c)] = (c, counts)  # the container held too, so its id is not reused

    def _charge(self, n_bytes: int, commit: bool = True) -> None:
        if commit:
            self.built_bytes += n_bytes
        if self.built_bytes + (0 if commit else n_bytes) > self.budget_bytes:
            raise _Refused(
                f"refused a call past the budget: calls built more than {self.budget_bytes} bytes "
                "from the pickle's objects (a shared object copied many times)"
            )

    # --- opcodes that differ from pickle._Unpickler's ---------------------------------------------
    def load_setitem(self):
        stack = self.stack
        value = stack.pop()
        key = stack.pop()
        self._insert(stack[-1], ((key, value),), True)

    def load_setitems(self):
        items = self.pop_mark()
        if len(items) % 2:
            raise pickle.UnpicklingError("odd number of items for SETITEMS")
        self._insert(self.stack[-1], zip(items[::2], items[1::2]), True)

    def load_dict(self):
        items = self.pop_mark()
        if len(items) % 2:
            raise pickle.UnpicklingError("odd number of items for DICT")
        d: dict = {}
        self._insert(d, zip(items[::2], items[1::2]), True)
        self.append(d)

    def load_additems(self):
        items = self.pop_mark()
        self._insert(self.stack[-1], ((m, None) for m in items), False)

    def load_frozenset(self):
        items = self.pop_mark()
        s: set = set()
        self._insert(s, ((m, None) for m in items), False)
        self.append(frozenset(s))

    def load_reduce(self):
        stack = self.stack
        args = stack.pop()
        func = stack[-1]
        if type(args) is not tuple:
            raise pickle.UnpicklingError("REDUCE arguments are not a tuple")
        if func in _BUFFERS and args and type(args[0]) is int:
            self._charge(min(args[0], MAX_PICKLE_ALLOC_BYTES + 1), commit=False)  # before it allocates
        # what the call reads (a copy walks its argument: set() of a shared list of 100,000 equal
        # items builds one member, 3,000 times) and what it builds
        self._charge(sum(sys.getsizeof(a) for a in args))
        value = func(*args)
        self._charge(sys.getsizeof(value))
        stack[-1] = value

    def _memo_index(self, i: int) -> int:
        if i > self.max_memo:
            raise _Refused(f"refused memo index {i} (past the pickle's {self.max_memo} bytes)")
        return i

    def load_put(self):
        i = int(self.readline()[:-1])
        if i < 0:
            raise ValueError("negative PUT argument")
        self.memo[self._memo_index(i)] = self.stack[-1]

    def load_long_binput(self):
        (i,) = struct.unpack("<I", self.read(4))
        self.memo[self._memo_index(i)] = self.stack[-1]

    dispatch = _Dispatch(pickle._Unpickler.dispatch)
    dispatch[pickle.SETITEM[0]] = load_setitem
    dispatch[pickle.SETITEMS[0]] = load_setitems
    dispatch[pickle.DICT[0]] = load_dict
    dispatch[pickle.ADDITEMS[0]] = load_additems
    dispatch[pickle.FROZENSET[0]] = load_frozenset
    dispatch[pickle.REDUCE[0]] = load_reduce
    dispatch[pickle.PUT[0]] = load_put
    dispatch[pickle.LONG_BINPUT[0]] = load_long_binput
    for _op, _what in (
        (pickle.INST, "INST (an object of a class)"),
        (pickle.OBJ, "OBJ (an object of a class)"),
        (pickle.NEWOBJ, "NEWOBJ (an object of a class)"),
        (pickle.NEWOBJ_EX, "NEWOBJ_EX (an object of a class)"),
        (pickle.BUILD, "BUILD (an object's state)"),
        (pickle.EXT1, "an extension code (EXT1)"),
        (pickle.EXT2, "an extension code (EXT2)"),
        (pickle.EXT4, "an extension code (EXT4)"),
        (pickle.PERSID, "a persistent id (tensor storage)"),
        (pickle.BINPERSID, "a persistent id (tensor storage)"),
        (pickle.NEXT_BUFFER, "an out-of-band buffer"),
        (pickle.READONLY_BUFFER, "an out-of-band buffer"),
    ):
        dispatch[_op[0]] = _refuse(_what)
    del _op, _what


_BUFFERS = (PICKLE_ALLOW[("builtins", "bytes")], PICKLE_ALLOW[("builtins", "bytearray")])


# --- expansion -------------------------------------------------------------------------------------


def expanded_bytes(root, budget_bytes: int) -> int:
    """The bytes `root` stands for when every reference is written out again: VALUE_BYTES per value
    (container or scalar) plus the UTF-8 bytes of each str, the length of each bytes object and
    the decimal digits of each int, counted at every reference to it (a string shared by 2,000
    entries counts 2,000 times). Computed once per container, so the work is linear in the number
    of distinct objects however much they are shared. Raises TraceError as soon as a container's
    count passes `budget_bytes`, or for a reference cycle."""
    sizes: dict[int, int] = {}
    utf8: dict[int, int] = {}  # id -> UTF-8 bytes of a non-ASCII str (encoded once)
    open_ids: set[int] = set()
    stack = [(root, False)]

    def leaf(x) -> int:
        t = type(x)
        if t is str:
            if x.isascii():
                return VALUE_BYTES + len(x)
            n = utf8.get(id(x))
            if n is None:
                n = utf8[id(x)] = len(x.encode("utf-8", "surrogatepass"))
            return VALUE_BYTES + n
        if t is bytes or t is bytearray:
            return VALUE_BYTES + len(x)
        if t is int:
            return VALUE_BYTES + x.bit_length() // 3  # at least its decimal digits
        return VALUE_BYTES

    def kids(o):
        return [x for kv in o.items() for x in kv] if isinstance(o, dict) else o

    while stack:
        obj, done = stack.pop()
        i = id(obj)
        if done:
            open_ids.discard(i)
            n = VALUE_BYTES
            for k in kids(obj):
                n += sizes[id(k)] if isinstance(k, CONTAINERS) else leaf(k)
            if n > budget_bytes:
                raise TraceError(
                    f"pickle bomb: its values expand to more than {budget_bytes} bytes through shared "
                    "references (a string or container referenced many times); refused"
                )
            sizes[i] = n
        elif i in sizes:
            continue
        elif i in open_ids:
            raise TraceError("pickle with a reference cycle (a container that holds itself); refused")
        else:
            open_ids.add(i)
            stack.append((obj, True))
            stack.extend((k, False) for k in kids(obj) if isinstance(k, CONTAINERS) and id(k) not in sizes)
    return sizes[id(root)] if isinstance(root, CONTAINERS) else leaf(root)


def safe_unpickle(data: bytes):
    """Unpickle `data` (a Flight Recorder pickle's bytes) with RestrictedUnpickler and check its
    expansion (expanded_bytes against expansion_budget_bytes(len(data))); see the module docstring.
    Returns the object. Raises TraceError (one line) for a refused class, opcode, key, memo index,
    allocation or call ('unsafe pickle: refused ...'), for values that expand past the budget
    ('pickle bomb: ...'), a reference cycle, and a truncated or corrupt pickle."""
    try:
        obj = RestrictedUnpickler(data).load()
    except pickle.UnpicklingError as e:
        msg = str(e)
        if msg.startswith("refused"):
            raise TraceError(f"unsafe pickle: {msg}") from None
        if "truncated" in msg or "exhausted" in msg:
            raise TraceError("truncated pickle") from None
        raise TraceError(f"corrupt pickle ({msg[:120]})") from None
    except (EOFError, struct.error):
        raise TraceError("truncated pickle") from None
    except (*DATA_ERRORS, LookupError, MemoryError, RecursionError) as e:  # LookupError: an unknown codec
        raise TraceError(f"corrupt pickle ({type(e).__name__}: {str(e)[:80]})") from None
    expanded_bytes(obj, expansion_budget_bytes(len(data)))  # TraceError (a ValueError): outside the try
    return obj

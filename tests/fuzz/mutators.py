"""Mutators per input format, working from real corpus files.

Each format has seed files (real traces, logs and exports from ../shared/corpus or
sample_traces/) and mutations that turn one seed into one hostile input: byte flips, truncation,
huge / negative / NaN numbers, wrong types, duplicate keys and rows, dropped columns, recursive
views, invalid UTF-8, long lines, deep nesting, archive and pickle bombs; and the two kinds of
issue 39: large strings shared by many references (a pickle's 1 MiB profiling_name in every entry)
and keys made to share one hash (int keys k * (2**61 - 1), (pid, tid) pairs of one tuple hash:
Python randomizes neither), with a log whose every line opens a new process and communicator.
mutate(fmt, rng) returns (file name, bytes); the same seed of `rng` gives the same input.
"""

from __future__ import annotations

import gzip
import io
import json
import pickle
import random
import re
import sqlite3
import struct
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO.parent / "shared" / "corpus"

SEEDS = {
    "kineto": [
        REPO / "sample_traces" / "hta_trace_filter" / "sampled_rank-1.json.gz",
        CORPUS / "hta" / "tests" / "data" / "trace_compare" / "base" / "base.json.gz",
        *sorted(
            (CORPUS / "param" / "et_replay" / "tests" / "inputs" / "dlrm_kineto").glob("worker[01]_*.json")
        ),
    ],
    "nccl": sorted((CORPUS / "nccl").glob("*.log"))[:12],
    "nsys": [CORPUS / "nsys" / "nsys-ai" / "mfu_2gpu_before.sqlite"],
}
FORMATS = ("kineto", "nccl", "nsys", "archive", "pickle")


def _raw(p: Path) -> bytes:
    b = p.read_bytes()
    return gzip.decompress(b) if b[:2] == b"\x1f\x8b" else b


# ------------------------------------------------------------------ bytes-level


def flip(b: bytes, rng: random.Random) -> bytes:
    a = bytearray(b)
    for _ in range(rng.randint(1, 64)):
        a[rng.randrange(len(a))] = rng.randrange(256)
    return bytes(a)


def truncate(b: bytes, rng: random.Random) -> bytes:
    return b[: rng.randrange(len(b))]


def invalid_utf8(b: bytes, rng: random.Random) -> bytes:
    i = rng.randrange(len(b))
    return b[:i] + rng.choice([b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80"]) * 50 + b[i:]


def long_line(b: bytes, rng: random.Random) -> bytes:
    i = b.rfind(b"\n", 0, rng.randrange(len(b))) + 1
    run = rng.choice([b"a", b"1", b"[", b"a:", b"k=v,", b"comm 0x1 rank "]) * rng.choice([1 << 16, 1 << 20])
    return b[:i] + run + b"\n" + b[i:]


def duplicate(b: bytes, rng: random.Random) -> bytes:
    i, j = sorted(rng.randrange(len(b)) for _ in range(2))
    return b[:j] + b[i:j] * rng.randint(2, 20) + b[j:]


BYTES = [flip, truncate, invalid_utf8, long_line, duplicate]

# ------------------------------------------------------------------ keys made to collide

P61 = 2**61 - 1  # hash(k * P61) == 0 for every int k: Python does not randomize an int's hash
_M64 = 2**64
_XX1, _XX2, _XX5 = 11400714785074694791, 14029467366897019727, 2870177450012600261


def _acc1(h: int) -> int:
    """CPython's 64-bit tuple hash (Objects/tupleobject.c, xxHash-like) after one item of hash h."""
    acc = (_XX5 + h * _XX2) % _M64
    return (((acc << 31) | (acc >> 33)) % _M64) * _XX1 % _M64


def colliding_pairs(n: int, start: int = 1) -> list[tuple[int, int]]:
    """n (a, b) pairs of ints in [0, 2^61 - 1), all of one tuple hash: a tuple's hash depends only
    on its items' hashes, an int below 2^61 - 1 hashes to itself, and the second item's lane is
    solved for each first item (about 1 in 8 solutions fits). JSON and int64 columns hold them."""
    target = (_acc1(start) + 1 * _XX2) % _M64
    inv = pow(_XX2, -1, _M64)
    out, a = [], start
    while len(out) < n:
        b = (target - _acc1(a)) * inv % _M64
        if b < P61:
            out.append((a, b))
        a += 1
    return out


def colliding_threads(b: bytes, rng: random.Random) -> bytes:
    """A Kineto trace of N threads whose (pid, tid) pairs share one tuple hash, each with an
    nccl:all_reduce op around a kernel launch (a dict keyed by (pid, tid) compares every pair)."""
    n = rng.choice([2_000, 2_000, 10_000, 10_000, 50_000])
    ev = []
    for i, (pid, tid) in enumerate(colliding_pairs(n)):
        ts, c = 1000 + 10 * i, i + 1
        thread = {"ph": "X", "pid": pid, "tid": tid}
        ev += [
            {**thread, "cat": "cpu_op", "name": "nccl:all_reduce", "ts": ts, "dur": 8,
             "args": {"External id": c}},
            {**thread, "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts + 1, "dur": 2,
             "args": {"correlation": c, "External id": c}},
            {"ph": "X", "pid": 0, "tid": 7, "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING",
             "ts": ts + 3, "dur": 4, "args": {"correlation": c, "device": 0, "stream": 7, "External id": c}},
        ]  # fmt: skip
    return json.dumps({"schemaVersion": 1, "traceEvents": ev}).encode()


def new_processes(b: bytes, rng: random.Random) -> bytes:
    """A log whose every line opens a new process, thread and communicator (the held tables and
    maps grow with every line; issue 39 item 3), sometimes with a long host name."""
    n = rng.choice([2_000, 20_000, 60_000])
    host = rng.choice(["node01", "node01", "n" * rng.choice([1_000, 10_000])])
    n = n if len(host) < 100 else n // 20
    return "".join(
        f"{host}:{100000 + i}:{200000 + i} [{i % 8}] NCCL INFO ncclCommInitRank comm 0x{0x8EC0000 + i:x} "
        f"rank {i % 16} nranks 16 cudaDev {i % 8} busId c8000 commId 0x{0x49BBD779 + i:x} - Init START\n"
        for i in range(n)
    ).encode()


# ------------------------------------------------------------------ JSON (Kineto)

_NUM = re.compile(rb"(?<=[:\[,])\s*-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")


def numbers(b: bytes, rng: random.Random) -> bytes:
    pick = [b"1e308", b"-1e308", b"NaN", b"Infinity", b"-9223372036854775809", b"18446744073709551616",
            b"-1", b'"12"', b"null", b"true", b"[]", b"{}"]  # fmt: skip
    spans = [m.span() for m in _NUM.finditer(b[: 4 << 20])]
    out, last = bytearray(), 0
    for s, e in sorted(rng.sample(spans, min(len(spans), rng.randint(1, 200)))) if spans else []:
        out += b[last:s] + rng.choice(pick)
        last = e
    return bytes(out + b[last:])


def json_shape(b: bytes, rng: random.Random) -> bytes:
    try:
        doc = json.loads(b)
    except ValueError:
        return flip(b, rng)
    evs = doc.get("traceEvents", []) if isinstance(doc, dict) else []
    kind = rng.choice(["deep", "dupkeys", "types", "dup_events", "drop_keys"])
    if kind == "deep":
        n = rng.choice([1000, 100_000])
        return b'{"traceEvents": [' + b"[" * n + b"]" * n + b"]}"
    if kind == "dupkeys":
        text = json.dumps(doc)
        return text.replace('"ts":', '"ts": 1, "ts":', rng.randint(1, 500)).encode()
    if kind == "types":
        for e in rng.sample(evs, min(len(evs), 100)):
            k = rng.choice(list(e) or ["x"])
            e[k] = rng.choice([[1, 2], {"a": 1}, "x" * 1000, None, -1, 2**70, 1.5])
    elif kind == "dup_events":
        evs.extend(rng.sample(evs, min(len(evs), 2000)))
    else:
        for e in rng.sample(evs, min(len(evs), 200)):
            for k in rng.sample(list(e), min(len(e), 2)):
                e.pop(k)
    return json.dumps(doc).encode()


# ------------------------------------------------------------------ SQLite (Nsight Systems)


def sqlite_mutation(b: bytes, rng: random.Random) -> bytes:
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "x.sqlite"
        f.write_bytes(b)
        c = sqlite3.connect(f)
        tables = [r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        t = rng.choice([x for x in tables if x.startswith(("CUPTI", "StringIds", "NVTX"))] or tables)
        cols = [r[1] for r in c.execute(f'PRAGMA table_info("{t}")')]
        kind = rng.choice(["drop_column", "types", "view", "dup_rows", "empty"])
        col = rng.choice(cols)
        try:
            if kind == "drop_column" and len(cols) > 1:
                c.execute(f'ALTER TABLE "{t}" DROP COLUMN "{col}"') if _can_drop(c, t, col) else None
            elif kind == "types":
                v = rng.choice([1.5e300, -1e300, "text", b"\xff\xfe", 2**62, -(2**62)])
                c.execute(f'UPDATE "{t}" SET "{col}" = ? WHERE rowid % ? = 0', (v, rng.randint(1, 50)))
            elif kind == "view":
                c.execute(f'ALTER TABLE "{t}" RENAME TO "{t}_x"')
                rec = "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n)"
                c.execute(f'CREATE VIEW "{t}" AS {rec} SELECT * FROM "{t}_x", n')
            elif kind == "dup_rows":
                c.execute(f'INSERT INTO "{t}" SELECT * FROM "{t}"')
            else:
                c.execute(f'DELETE FROM "{t}"')
        except sqlite3.Error:  # e.g. duplicate rows under a primary key: keep the file as it is
            pass
        c.commit()
        c.close()
        return f.read_bytes()


def _can_drop(c, t, col) -> bool:
    try:
        c.execute("SAVEPOINT s")
        c.execute(f'ALTER TABLE "{t}" DROP COLUMN "{col}"')
        c.execute("ROLLBACK TO s")
        return True
    except sqlite3.Error:
        c.execute("ROLLBACK TO s")
        return False


# ------------------------------------------------------------------ archives and pickles


def archive(rng: random.Random) -> tuple[str, bytes]:
    member = _raw(rng.choice(SEEDS["kineto"][:2]))
    kind = rng.choice(["overlap", "ratio", "traversal", "nested", "corrupt"])
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        if kind == "ratio":
            for k in range(rng.randint(70, 120)):
                z.writestr(f"rank{k}.json", bytes(1 << 20))
        elif kind == "traversal":
            z.writestr("../../etc/rank0.json", member)
            z.writestr("/abs/rank1.json", member)
        elif kind == "nested":
            z.writestr("inner.zip", buf.getvalue() or b"PK\x05\x06" + bytes(18))
        else:
            z.writestr("rank0.json", member)
    data = buf.getvalue()
    if kind == "overlap":
        eocd = data.rindex(b"PK\x05\x06")
        _, _, _, _, n, size, off, _ = struct.unpack("<IHHHHIIH", data[eocd : eocd + 22])
        entry = data[off : off + size]
        copies = rng.randint(2, 200)
        cd = entry + b"".join(
            entry.replace(b"rank0.json", f"rank{k:04d}.j".encode()[:10]) for k in range(copies)
        )
        data = (
            data[:off]
            + cd
            + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, n + copies, n + copies, len(cd), off, 0)
        )
    elif kind == "corrupt":
        data = flip(data, rng)
    return "archive.zip", data


class _Reduce:
    def __init__(self, f, args):
        self.f, self.args = f, args

    def __reduce__(self):
        return self.f, self.args


def _pstr(s: str) -> bytes:
    b = s.encode()
    return pickle.BINUNICODE + len(b).to_bytes(4, "little") + b


def _plong(k: int) -> bytes:
    b = k.to_bytes((k.bit_length() + 8) // 8, "little", signed=True)
    return pickle.LONG1 + bytes([len(b)]) + b


def colliding_pickle(rng: random.Random) -> bytes:
    """A Flight Recorder dump whose pg_status holds 20,000-150,000 keys of one hash, written opcode
    by opcode (building it in Python would itself be quadratic): int keys k * (2^61 - 1) in a dict
    (SETITEMS, SETITEM, DICT, dict(pairs)), a set (ADDITEMS, set(list)) or a frozenset; or complex
    keys complex(1000003 k, -k), whose hashes are all 0 too."""
    n = rng.choice([20_000, 60_000, 150_000])
    kind = rng.choice(
        ["setitems", "setitem", "dict", "dict_call", "additems", "set_call", "frozenset", "complex"]
    )
    keys = [_plong(k * P61) for k in range(n)]
    one = pickle.BININT1 + b"\x01"
    if kind == "setitems":
        body = pickle.EMPTY_DICT + pickle.MARK + b"".join(k + one for k in keys) + pickle.SETITEMS
    elif kind == "setitem":
        body = pickle.EMPTY_DICT + b"".join(k + one + pickle.SETITEM for k in keys)
    elif kind == "dict":
        body = pickle.MARK + b"".join(k + one for k in keys) + pickle.DICT
    elif kind == "dict_call":
        pairs = pickle.MARK + b"".join(k + one + pickle.TUPLE2 for k in keys) + pickle.LIST
        body = b"cbuiltins\ndict\n" + pairs + pickle.TUPLE1 + pickle.REDUCE
    elif kind == "additems":
        body = pickle.EMPTY_SET + pickle.MARK + b"".join(keys) + pickle.ADDITEMS
    elif kind == "set_call":
        body = (
            b"cbuiltins\nset\n" + pickle.MARK + b"".join(keys) + pickle.LIST + pickle.TUPLE1 + pickle.REDUCE
        )
    elif kind == "frozenset":
        body = pickle.MARK + b"".join(keys) + pickle.FROZENSET
    else:
        body = (
            pickle.EMPTY_DICT
            + pickle.MARK
            + b"".join(
                b"cbuiltins\ncomplex\n"
                + _plong(1000003 * k)
                + _plong(-k)
                + pickle.TUPLE2
                + pickle.REDUCE
                + one
                for k in range(n // 4)
            )
            + pickle.SETITEMS
        )
    head = pickle.PROTO + bytes([rng.choice([2, 4])]) + pickle.EMPTY_DICT + pickle.MARK
    head += _pstr("version") + _pstr("2.1") + _pstr("entries") + pickle.EMPTY_LIST + _pstr("pg_status")
    return head + body + pickle.SETITEMS + pickle.STOP


def shared_string_pickle(rng: random.Random) -> bytes:
    """The issue 39 item 1 dump: N entries whose profiling_name is one large string (pickle memoizes
    it: N references of 2-5 bytes), e.g. 2,000 x 1 MiB = 2.1 GB of strings from 1.05 MB."""
    n = rng.choice([500, 2_000, 4_000])
    name = "nccl:all_reduce " + "x" * rng.choice([64 << 10, 256 << 10, 1 << 20, 2 << 20])
    field = rng.choice(["profiling_name", "state", "thread_name", "frames"])
    value = [{"name": name, "filename": name, "line": 1}] * 4 if field == "frames" else name
    entries = [{"record_id": i, "profiling_name": "nccl:all_reduce", field: value} for i in range(n)]
    return pickle.dumps({"version": "2.1", "pg_config": {}, "entries": entries}, protocol=rng.choice([2, 4]))


def pickle_bomb(rng: random.Random) -> tuple[str, bytes]:
    x: list = []
    for _ in range(rng.randint(3, 9)):
        x = [x] * rng.randint(10, 60)
    kind = rng.choice(["alloc", "str", "shared", "wide", "flip", "truncate", "shared_string", "shared_string",
                       "collide", "collide", "memo", "copies"])  # fmt: skip
    if kind == "shared_string":
        return "fr_dump.pkl", shared_string_pickle(rng)
    if kind == "collide":
        return "fr_dump.pkl", colliding_pickle(rng)
    if kind == "memo":  # the C unpickler zeroes a memo array twice the index
        idx = rng.choice([1 << 28, 1 << 30, (1 << 32) - 1])
        return "fr_dump.pkl", pickle.PROTO + b"\x02" + pickle.NONE + pickle.LONG_BINPUT + idx.to_bytes(
            4, "little"
        ) + b"."
    if kind == "copies":  # a shared list copied by a few bytes of call each time
        x = pickle.dumps(list(range(rng.choice([10_000, 100_000]))), protocol=2)[2:-1]
        call = b"cbuiltins\n" + rng.choice([b"list", b"tuple", b"set"]) + b"\nh\x00\x85R"
        return "fr_dump.pkl", pickle.PROTO + b"\x02" + x + b"q\x00(" + call * rng.choice([300, 3000]) + b"l."
    if kind == "alloc":
        n = rng.choice([1 << 31, 6 << 30, 1 << 40])
        data = b"\x80\x02cbuiltins\nbytearray\n\x8a\x06" + n.to_bytes(6, "little") + b"\x85R."
    elif kind == "str":
        data = pickle.dumps(_Reduce(str, (x,)), protocol=4)
    elif kind == "shared":
        data = pickle.dumps({"entries": x}, protocol=4)
    else:
        entry = {"record_id": 1, "profiling_name": "nccl:all_reduce", "frames": [], "state": "completed"}
        data = pickle.dumps({"version": "2.1", "entries": [entry] * rng.randint(10**5, 10**6)}, protocol=4)
        if kind == "flip":
            data = flip(data, rng)
        elif kind == "truncate":
            data = truncate(data, rng)
    return "fr_dump.pkl", data


# ------------------------------------------------------------------ entry point


def mutate(fmt: str, rng: random.Random) -> tuple[str, bytes]:
    """One hostile input of `fmt` (one of FORMATS): (file name, bytes)."""
    if fmt == "archive":
        return archive(rng)
    if fmt == "pickle":
        return pickle_bomb(rng)
    seed = rng.choice(SEEDS[fmt])
    b = _raw(seed)
    if fmt == "nsys":
        return "export.sqlite", (sqlite_mutation(b, rng) if rng.random() < 0.6 else rng.choice(BYTES)(b, rng))
    if fmt == "kineto":
        m = rng.choice(BYTES + [numbers, json_shape, json_shape, colliding_threads])
        return seed.name.replace(".gz", ""), m(b, rng)
    return seed.name, rng.choice(BYTES + [new_processes])(b, rng)

"""Parsers for the structured NCCL-family outputs other than Flight Recorder dumps (flightrec.py)
and RAS reports (ras.py): nccl-tests -J JSON (nccl.md 2.3, checked against nccl-tests
src/util.cu) -> nccl_tests_results, and NCCL's example profiler plugin output (nccl.md 3.1) ->
nccl_profiler_events.
"""

from __future__ import annotations

import math
import os

from ... import catalog
from ..errors import TraceError
from .common import (
    INT32,
    LogParsed,
    Rows,
    dumps,
    finish,
    infer_test,
    norm_hash,
    to_float,
    to_int,
    version_from_code,
)

# --- nccl-tests JSON --------------------------------------------------------------------------------------


def nccl_tests_json(obj, notes: list[str]) -> LogParsed:
    """nccl-tests -J output (src/util.cu: version, args, nccl_version, config, devices, results[{size,
    count, type, redop, root, out_of_place{time|cpu_time, alg_bw, bus_bw, nwrong}, in_place{...}}])
    -> nccl_tests_results (time in us -> time_ns)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("results"), list):
        raise TraceError("nccl-tests JSON without a 'results' list")
    out = Rows("nccl_tests_results")
    devices = [d for d in obj.get("devices") or [] if isinstance(d, dict)]
    n_ranks = len({d.get("rank") for d in devices}) or None
    n_nodes = len({d.get("hostname") for d in devices}) or None
    args = obj.get("args") or []
    test = os.path.basename(str(args[0])) if isinstance(args, list) and args else None
    code = to_int(obj.get("nccl_version"))
    versions = {
        "nccl_version": version_from_code(code) if code else None,
        "nccl_tests_json_version": obj.get("version"),
    }
    rows = []
    for res in obj["results"]:
        if not isinstance(res, dict):
            continue
        typ = None if res.get("type") is None else str(res.get("type"))
        for placement in ("out_of_place", "in_place"):
            body = res.get(placement)
            if not isinstance(body, dict):
                continue
            cpu = "cpu_time" in body
            t = to_float(body.get("cpu_time" if cpu else "time"))
            size, count = to_int(res.get("size")), to_int(res.get("count"))
            if t is None or size is None or count is None:
                continue
            nw = to_float(body.get("nwrong"))
            rows.append(
                out.add(
                    table_index=0,
                    size_bytes=size,
                    count=count,
                    type=typ,
                    dtype_bytes=catalog.dtype_bytes(typ),
                    redop=None if res.get("redop") is None else str(res.get("redop")).strip(),
                    root=to_int(str(res.get("root", "")).strip(), INT32),
                    placement=placement,
                    time_ns=round(t * 1000),
                    cpu_time=cpu,
                    algbw_gbps=to_float(body.get("alg_bw")),
                    busbw_gbps=to_float(body.get("bus_bw")),
                    wrong=round(nw) if nw is not None and math.isfinite(nw) else None,
                    n_ranks=n_ranks,
                    n_nodes=n_nodes,
                )
            )
    if not out.n:
        raise TraceError("nccl-tests JSON has no results")
    src = "stated" if test and test.endswith("_perf") else None
    if src is None:
        test = infer_test(
            [
                (
                    out.get(i, "size_bytes"),
                    out.get(i, "count"),
                    out.get(i, "dtype_bytes"),
                    out.get(i, "redop"),
                    out.get(i, "root"),
                )
                for i in rows
            ],
            n_ranks,
            True,
            True,
        )
        src = "inferred" if test else None
    for i in rows:
        out.set(i, test=test, test_source=src)
    return finish(
        "nccl_tests",
        {"nccl_tests_results": out},
        notes,
        versions,
        len(obj["results"]),
        {d.get("hostname") for d in devices},
        n_ranks,
    )


# --- NCCL example profiler plugin ---------------------------------------------------------------------------


def profiler_events(obj, notes: list[str]) -> LogParsed:
    """Example profiler plugin output (Chrome-trace-style list; nccl.md 3.1) -> nccl_profiler_events:
    one row per 'b' (or 'X') event, its 'e' matched on (pid, cat, id); ts is us since plugin init."""
    if isinstance(obj, dict) and isinstance(obj.get("traceEvents"), list):
        obj = obj["traceEvents"]
    if not isinstance(obj, list):
        raise TraceError("profiler plugin output is not a list of events")
    out = Rows("nccl_profiler_events")
    open_: dict[tuple, list[int]] = {}
    unmatched_e = 0
    for i, ev in enumerate(obj):
        if not isinstance(ev, dict) or not ev:
            continue
        ph = ev.get("ph")
        ts = to_float(ev.get("ts"))
        tns = round(ts * 1000) if ts is not None and math.isfinite(ts) else None
        key = (ev.get("pid"), ev.get("cat"), ev.get("id"))
        if ph == "e":
            stack = open_.get(key)
            if stack:
                r = stack.pop()
                start = out.get(r, "start_rel_ns")
                out.set(
                    r, end_rel_ns=tns, dur_ns=tns - start if tns is not None and start is not None else None
                )
            else:
                unmatched_e += 1
            continue
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        dur = to_float(ev.get("dur")) if ph == "X" else None
        end = tns + round(dur * 1000) if dur is not None and tns is not None else None
        r = out.add(
            event_index=i,
            name=_s(ev.get("name")),
            cat=_s(ev.get("cat")),
            pid=to_int(ev.get("pid")),
            tid=to_int(ev.get("tid")),
            id=to_int(ev.get("id")),
            start_rel_ns=tns,
            end_rel_ns=end,
            dur_ns=end - tns if end is not None else None,
            seq_num=to_int(args.get("SeqNum")),
            comm_id=norm_hash(args.get("CommHash")),
            rank=to_int(args.get("Rank"), INT32),
            count=to_int(args.get("Count")),
            datatype=_s(args.get("Datatype")),
            algorithm=_s(args.get("Algorithm")),
            protocol=_s(args.get("Protocol")),
            n_channels=to_int(args.get("nChannels"), INT32),
            args=dumps(args) if args else None,
        )
        if ph == "b":
            open_.setdefault(key, []).append(r)
    if not out.n:
        raise TraceError("profiler plugin output has no events")
    still = sum(len(v) for v in open_.values())
    if still:
        notes.append(f"{still} begin events without their end (output cut off)")
    if unmatched_e:
        notes.append(f"{unmatched_e} end events without a begin")
    return finish("nccl_profiler", {"nccl_profiler_events": out}, notes, {}, len(obj))


def _s(v):
    return None if v is None else str(v)

"""Parsers for the structured members of the NCCL family: PyTorch Flight Recorder dumps (pickle,
JSON, unpickled repr), the torchfrtrace analyzer's report, NCCL RAS reports (text and JSON),
nccl-tests -J JSON, and NCCL's example profiler plugin output.

Field lists: ../shared/reference/nccl.md sections 3.1 (profiler plugin), 3.3 (RAS), 3.4 (Flight
Recorder, checked against torch/csrc/distributed/c10d/FlightRecorderDetail.hpp), 2.3 (nccl-tests
JSON, checked against nccl-tests src/util.cu).
"""

from __future__ import annotations

import math
import os
import re

from .. import catalog
from .nccl_common import (INT32, LogParsed, Rows, TraceError, dumps, finish, norm_hash, to_float,
                          to_int, version_from_code)
from .nccl_log import infer_test

_RANK_IN_NAME = re.compile(r"(\d+)$")


def rank_from_name(name: str) -> int | None:
    """Trailing number of a dump's file name without extensions (<prefix><rank>: nccl_trace_rank_3, trace_0.json)."""
    base = os.path.basename(name or "")
    while True:
        stem, ext = os.path.splitext(base)
        if ext.lower() in (".json", ".pkl", ".pickle", ".txt", ".gz", ".pt") and stem:
            base = stem
        else:
            break
    m = _RANK_IN_NAME.search(base)
    return to_int(m.group(1), INT32) if m else None


def _ranks(text) -> list[int] | None:
    if text is None:
        return None
    if isinstance(text, (list, tuple, set, frozenset)):
        vals = [to_int(x, INT32) for x in text]
    else:
        vals = [to_int(x, INT32) for x in re.findall(r"-?\d+", str(text))]
    return [v for v in vals if v is not None]


def _numel(sizes) -> int | None:
    if not isinstance(sizes, (list, tuple)):
        return None
    total = 0
    for shape in sizes:
        if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) for d in shape):
            return None
        total += math.prod(shape)
    return total if total < 2**63 else None


def _ns_from_ms(v) -> int | None:
    f = to_float(v) if not isinstance(v, bool) else None
    if f is None or not math.isfinite(f):
        return None
    ns = round(f * 1_000_000)
    return ns if abs(ns) < 2**63 else None


def _nz(v) -> int | None:
    """An epoch-ns field: None and the JSON dump's 0 (absent) become None."""
    x = to_int(v) if not isinstance(v, bool) else None
    return x if x else None


def _strlist(v) -> list[str] | None:
    if not isinstance(v, (list, tuple)):
        return None
    return [str(x) for x in v]


def _frame_text(f) -> str:
    if isinstance(f, dict):
        return f"{f.get('name')} at {f.get('filename')}:{f.get('line')}"
    return str(f)


# --- Flight Recorder -------------------------------------------------------------------------------

def flight_recorder(obj, name: str, notes: list[str]) -> LogParsed:
    """A Flight Recorder dump (dict: version, pg_config, pg_status, entries[...]; nccl.md 3.4) ->
    flight_recorder (one row per entry) and flight_recorder_groups. Raises TraceError when `obj`
    is not shaped like a dump."""
    if not isinstance(obj, dict) or not ({"entries", "pg_config", "pg_status"} & set(obj)):
        if any("truncated" in n for n in notes):
            raise TraceError("truncated JSON: no complete Flight Recorder entry")
        raise TraceError("not a Flight Recorder dump (no entries, pg_config or pg_status)")
    rank = rank_from_name(name)
    version = None if obj.get("version") is None else str(obj.get("version"))
    pg_config = obj.get("pg_config") if isinstance(obj.get("pg_config"), dict) else {}
    pg_status = obj.get("pg_status") if isinstance(obj.get("pg_status"), dict) else {}
    entries = obj.get("entries") or []
    if not isinstance(entries, (list, tuple)):
        raise TraceError("Flight Recorder dump: 'entries' is not a list")
    fr, groups = Rows("flight_recorder"), Rows("flight_recorder_groups")
    name_of_id: dict[int, tuple] = {}
    bad = 0
    for e in entries:
        if not isinstance(e, dict):
            bad += 1
            continue
        pg = e.get("process_group")
        pg_name, pg_desc = (str(pg[0]), str(pg[1])) if isinstance(pg, (list, tuple)) and len(pg) >= 2 else (
            str(pg) if pg is not None else None, None)
        pg_id = to_int(e.get("pg_id"))
        if pg_id is not None and pg_name is not None:
            name_of_id.setdefault(pg_id, (pg_name, pg_desc))
        cfg = pg_config.get(pg_name) if pg_name is not None else None
        pname = e.get("profiling_name")
        op = None
        if isinstance(pname, str):
            op = pname.split(":", 1)[-1].split(" ", 1)[0] or None
        frames = e.get("frames")
        fr.add(rank=rank, version=version, record_id=to_int(e.get("record_id")), pg_id=pg_id, pg_name=pg_name,
               pg_desc=pg_desc, pg_ranks=_ranks(cfg.get("ranks")) if isinstance(cfg, dict) else None,
               collective_seq_id=to_int(e.get("collective_seq_id")), p2p_seq_id=to_int(e.get("p2p_seq_id")),
               op_id=to_int(e.get("op_id")), profiling_name=None if pname is None else str(pname), op=op,
               is_p2p=e.get("is_p2p") if isinstance(e.get("is_p2p"), bool) else None,
               state=None if e.get("state") is None else str(e.get("state")),
               time_created_ns=_nz(e.get("time_created_ns")),
               time_discovered_started_ns=_nz(e.get("time_discovered_started_ns")),
               time_discovered_completed_ns=_nz(e.get("time_discovered_completed_ns")),
               duration_ns=_ns_from_ms(e.get("duration_ms")),
               retired=e.get("retired") if isinstance(e.get("retired"), bool) else None,
               timeout_ns=_ns_from_ms(e.get("timeout_ms")),
               input_sizes=dumps(e["input_sizes"]) if e.get("input_sizes") is not None else None,
               output_sizes=dumps(e["output_sizes"]) if e.get("output_sizes") is not None else None,
               input_dtypes=_strlist(e.get("input_dtypes")), output_dtypes=_strlist(e.get("output_dtypes")),
               input_numel=_numel(e.get("input_sizes")), output_numel=_numel(e.get("output_sizes")),
               frames=[_frame_text(f) for f in frames] if isinstance(frames, (list, tuple)) else None,
               thread_id=None if e.get("thread_id") is None else str(e.get("thread_id")),
               thread_name=None if e.get("thread_name") is None else str(e.get("thread_name")))
    if bad:
        notes.append(f"{bad} Flight Recorder entries are not dicts and were skipped")
    id_of_name = {v[0]: k for k, v in name_of_id.items()}
    done_ids = set()
    for key, cfg in pg_config.items():
        cfg = cfg if isinstance(cfg, dict) else {}
        pname = str(cfg.get("name", key))
        pid = id_of_name.get(pname)
        st = pg_status.get(str(pid)) if pid is not None else None
        if st is not None:
            done_ids.add(str(pid))
        ranks = _ranks(cfg.get("ranks"))
        groups.add(rank=rank, version=version, pg_id=pid, pg_name=pname,
                   pg_desc=None if cfg.get("desc") is None else str(cfg.get("desc")), ranks=ranks,
                   group_size=len(ranks) if ranks is not None else None, **_status(st))
    for key, st in pg_status.items():
        if str(key) in done_ids:
            continue
        pid = to_int(key)
        nm = name_of_id.get(pid, (None, None))
        groups.add(rank=rank, version=version, pg_id=pid, pg_name=nm[0], pg_desc=nm[1], **_status(st))
    versions = {"flight_recorder_version": version}
    if obj.get("comm_lib_version"):
        versions["nccl_version"] = str(obj["comm_lib_version"])
    sizes = [len(r) for r in groups.column("ranks") if r]
    return finish("flight_recorder", {"flight_recorder": fr, "flight_recorder_groups": groups}, notes, versions,
                  len(entries), None, max(sizes) if sizes else None)


def _status(st) -> dict:
    if not isinstance(st, dict):
        return {}
    return {k: to_int(st.get(k)) for k in ("last_enqueued_collective", "last_started_collective", "last_completed_collective")}


# --- torchfrtrace report ------------------------------------------------------------------------------

FR_SEQ = re.compile(r"(?:collective|sequence number:)\s*(\d+)")
FR_ENTRY = re.compile(r"at entry (\d+)")
FR_KEY = re.compile(r"(?P<key>internal record id|group info|collective|missing ranks|total input numel|"
                    r"total output numel|input sizes|output sizes|world size|expected ranks|collective state|"
                    r"error msg|collective stack trace)\s*:\s*(?P<val>.*)$")


def torchfrtrace_report(text: str, notes: list[str]) -> LogParsed:
    """torchfrtrace (PyTorch flight_recorder analyzer) text output -> flight_recorder_mismatches:
    a finding starts at a non-indented line that is not 'key: value' (e.g. 'Not all ranks joining
    collective 5 at entry 4'); the known key lines and the indented stack lines that follow belong
    to it. Other lines become no rows but are counted in the notes."""
    out = Rows("flight_recorder_mismatches")
    cur = None
    in_stack = False
    other = 0
    lines = text.split("\n")
    for i, raw in enumerate(lines, 1):
        line = raw.rstrip("\r")
        if not line.strip():
            continue
        s = line.strip()
        if s.startswith("$") or s.startswith("torchfrtrace"):
            continue  # the command line
        if cur is not None and in_stack and line[:1].isspace():
            out.set(cur, frames=(out.get(cur, "frames") or []) + [s])
            continue
        mk = FR_KEY.match(s)
        if cur is not None and mk:
            key, val = mk.group("key"), mk.group("val").strip()
            in_stack = key == "collective stack trace"
            if key == "internal record id":
                out.set(cur, record_id=to_int(val))
            elif key == "group info":
                a, _, b = val.partition(":")
                out.set(cur, pg_name=a or None, pg_desc=b or None)
            elif key == "collective":
                out.set(cur, profiling_name=val)
            elif key == "missing ranks":
                out.set(cur, missing_ranks=_ranks(val))
            elif key in ("input sizes", "output sizes"):
                out.set(cur, **{key.replace(" ", "_"): val})
            elif key in ("world size", "expected ranks"):
                if re.fullmatch(r"\d+", val):
                    out.set(cur, world_size=to_int(val, INT32))
                else:
                    rk = _ranks(val)
                    out.set(cur, expected_ranks=rk)
                    if out.get(cur, "world_size") is None and rk:
                        out.set(cur, world_size=len(rk))
            elif key == "collective state":
                out.set(cur, state=val)
            elif key == "error msg":
                out.set(cur, error=val)
            elif key == "collective stack trace" and val:
                out.set(cur, frames=[val])
            continue
        if not line[:1].isspace() and s[:1].isupper() and not mk:
            ms, me = FR_SEQ.search(s), FR_ENTRY.search(s)
            cur = out.add(line_no=i, message=s, collective_seq_id=to_int(ms.group(1)) if ms else None,
                          record_id=to_int(me.group(1)) if me else None)
            in_stack = False
            continue
        other += 1
    if not out.n:
        raise TraceError("no torchfrtrace findings found")
    if other:
        notes.append(f"{other} report lines not recognized (not stored)")
    return finish("torchfrtrace", {"flight_recorder_mismatches": out}, notes, {}, len(lines))


# --- NCCL RAS -----------------------------------------------------------------------------------------

RAS_VERSION = re.compile(r"NCCL version (?P<v>\S+) compiled with CUDA (?P<cuda>\S+)")
RAS_CUDA = re.compile(r"CUDA runtime version (?P<rt>\d+), driver version (?P<drv>\d+)")
RAS_ISSUE = re.compile(r"#(?P<g>\d+)-(?P<c>\d+) \((?P<hash>[0-9a-fA-F]+)\) (?P<status>\w+)")
RAS_DIFF = re.compile(r"Communicator ranks have different (?:(?P<coll>\w+) )?(?:collective )?operation counts")
RAS_COUNT = re.compile(r"(?P<n>\d+) ranks? (?:have|has) launched up to operation (?P<op>\d+)")
RAS_NONE = re.compile(r"(?P<n>\d+) ranks? (?:have|has) not launched any operations")
RAS_RANK = re.compile(r"Rank (?P<rank>\d+)(?: has launched up to operation (?P<op>\d+))? -- GPU (?P<gpu>\S+) "
                      r"managed by process (?P<pid>\d+) on node (?P<host>\S+)")
RAS_DEAD = re.compile(r"Process (?P<pid>\d+) on node (?P<host>\S+) managing GPUs? (?P<gpu>\S+)")
RAS_MONITOR = re.compile(r"\[(?P<ts>[^\]]+)\] (?P<event>[A-Z_]+): (?P<msg>.*)$")


def ras_text(text: str, notes: list[str]) -> LogParsed:
    """ncclras text report (nccl.md 3.3; NCCL docs troubleshooting/ras.rst) -> nccl_ras rows.
    Column headers and '====' underlines are layout; every other line is a row (kind line when not
    recognized)."""
    out = Rows("nccl_ras")
    versions: dict = {}
    section = None
    issue: dict = {}
    collective = None
    lines = text.split("\n")
    for i, raw in enumerate(lines, 1):
        line = raw.rstrip("\r")
        s = line.strip()
        if not s or set(s) == {"="}:
            continue
        nxt = lines[i].strip() if i < len(lines) else ""
        if nxt and set(nxt) == {"="}:
            section = s.split("...")[0].split(" (")[0].strip().lower()
            continue
        m = RAS_VERSION.match(s)
        if m:
            versions.update(nccl_version=m.group("v"), cuda_version=m.group("cuda"))
            continue
        m = RAS_CUDA.match(s)
        if m:
            versions.update(cuda_runtime_version=int(m.group("rt")), cuda_driver_version=int(m.group("drv")))
            continue
        toks = s.split()
        if section == "job summary":
            nums = [to_int(t, INT32) for t in toks]
            if len(toks) == 5 and all(n is not None for n in nums):
                out.add(line_no=i, kind="job", nodes=nums[0], processes_per_node=nums[1], gpus_per_process=nums[2],
                        processes=nums[3], gpus=nums[4], message=s)
                continue
            if toks[0] in ("Nodes", "(total)"):
                continue
        if section == "communicators":
            if toks[0] in ("Group", "#"):
                continue
            if len(toks) >= 8 and toks[0].isdigit():
                n = [to_int(t, INT32) for t in toks[:6]]
                out.add(line_no=i, kind="comm_group", comm_group=n[0], comms_in_group=n[1], nodes_per_comm=n[2],
                        ranks_per_node=n[3], ranks_per_comm=n[4], ranks_in_group=n[5], status=toks[6],
                        errors=" ".join(toks[7:]), message=s)
                continue
        sev = {"errors": "error", "warnings": "warning"}.get(section or "")
        m = RAS_ISSUE.match(s)
        if m:
            issue = dict(comm_group=to_int(m.group("g"), INT32), comm_index=to_int(m.group("c"), INT32),
                         comm_id=norm_hash(m.group("hash")), severity=sev)
            collective = None
            out.add(line_no=i, kind="issue", status=m.group("status"), message=s, **issue)
            continue
        m = RAS_DIFF.search(s)
        if m:
            collective = m.group("coll")
            out.add(line_no=i, kind="line", message=s, collective=collective, **issue)
            continue
        m = RAS_RANK.search(s)
        if m:
            out.add(line_no=i, kind="rank", rank=to_int(m.group("rank"), INT32), cuda_dev=to_int(m.group("gpu"), INT32),
                    pid=to_int(m.group("pid")), host=m.group("host"), op_count=to_int(m.group("op")),
                    collective=collective if m.group("op") else None, message=s, **issue)
            continue
        m = RAS_COUNT.search(s) or RAS_NONE.search(s)
        if m:
            out.add(line_no=i, kind="op_count", n_ranks=to_int(m.group("n"), INT32),
                    op_count=to_int(m.groupdict().get("op") or 0), collective=collective, message=s, **issue)
            continue
        m = RAS_MONITOR.match(s)
        if m:
            d = RAS_DEAD.search(m.group("msg"))
            out.add(line_no=i, kind="event", status=m.group("event"), report_time=m.group("ts"), message=s,
                    pid=to_int(d.group("pid")) if d else None, host=d.group("host") if d else None,
                    cuda_dev=to_int(d.group("gpu"), INT32) if d else None)
            continue
        m = RAS_DEAD.search(s)
        if m:
            out.add(line_no=i, kind="dead_process", pid=to_int(m.group("pid")), host=m.group("host"),
                    cuda_dev=to_int(m.group("gpu"), INT32), severity=sev, message=s)
            continue
        if sev and re.fullmatch(r"[A-Z_]+", s):
            issue = dict(severity=sev)
            out.add(line_no=i, kind="issue", status=s, severity=sev, message=s)
            continue
        out.add(line_no=i, kind="line", severity=sev, message=s)
    if not out.n and not versions:
        raise TraceError("no NCCL RAS report lines found")
    gpus = [g for g in out.column("gpus") if g]
    return finish("nccl_ras", {"nccl_ras": out}, notes, versions, len(lines), None, max(gpus) if gpus else None)


def ras_json(obj, notes: list[str]) -> LogParsed:
    """ncclras -f json report (2.28.7+) or monitor events (one JSON object per line) -> nccl_ras."""
    out = Rows("nccl_ras")
    versions: dict = {}
    docs = obj if isinstance(obj, list) else [obj]
    for doc in docs:
        if not isinstance(doc, dict):
            continue
        if "event" in doc:
            peer = doc.get("peer") if isinstance(doc.get("peer"), dict) else {}
            devs = peer.get("cuda_devs") or []
            out.add(kind="event", status=str(doc.get("event")), report_time=str(doc.get("timestamp")),
                    host=peer.get("host"), pid=to_int(peer.get("pid")),
                    cuda_dev=to_int(devs[0], INT32) if isinstance(devs, list) and len(devs) == 1 else None,
                    message=dumps(doc.get("details")) if doc.get("details") is not None else None)
            continue
        for k in ("nccl_version", "cuda_runtime_version", "cuda_driver_version"):
            if doc.get(k) is not None:
                versions[k] = doc[k]
        ts = None if doc.get("timestamp") is None else str(doc.get("timestamp"))
        for ci, comm in enumerate(doc.get("communicators") or []):
            if not isinstance(comm, dict):
                continue
            cid = norm_hash(comm.get("hash"))
            out.add(kind="comm_group", comm_index=ci, comm_id=cid, ranks_per_comm=to_int(comm.get("size"), INT32),
                    report_time=ts, message=dumps({k: comm.get(k) for k in ("secondary_hash", "ranks_count",
                                                                             "missing_ranks_count") if k in comm}))
            for r in comm.get("ranks") or []:
                if not isinstance(r, dict):
                    continue
                st = r.get("status") if isinstance(r.get("status"), dict) else {}
                base = dict(comm_index=ci, comm_id=cid, rank=to_int(r.get("rank"), INT32), host=r.get("host"),
                            pid=to_int(r.get("pid")), cuda_dev=to_int(r.get("cuda_dev"), INT32),
                            nvml_dev=to_int(r.get("nvml_dev"), INT32), report_time=ts)
                out.add(kind="rank", status=None if st.get("init_state") is None else str(st.get("init_state")),
                        async_error=to_int(st.get("async_error"), INT32),
                        finalize_called=_bool(st.get("finalize_called")), destroy_flag=_bool(st.get("destroy_flag")),
                        abort_flag=_bool(st.get("abort_flag")), **base)
                counts = r.get("collective_counts") if isinstance(r.get("collective_counts"), dict) else {}
                for coll, n in counts.items():
                    out.add(kind="op_count", collective=str(coll), op_count=to_int(n), **base)
            for r in comm.get("missing_ranks") or []:
                if not isinstance(r, dict):
                    continue
                st = r.get("status") if isinstance(r.get("status"), dict) else {}
                out.add(kind="missing_rank", comm_index=ci, comm_id=cid, rank=to_int(r.get("rank"), INT32),
                        host=r.get("host"), pid=to_int(r.get("pid")), cuda_dev=to_int(r.get("cuda_dev"), INT32),
                        nvml_dev=to_int(r.get("nvml_dev"), INT32), unresponsive=_bool(st.get("unresponsive")),
                        considered_dead=_bool(st.get("considered_dead")), report_time=ts)
    if not out.n:
        raise TraceError("NCCL RAS JSON without communicators or events")
    sizes = [s for s in out.column("ranks_per_comm") if s]
    return finish("nccl_ras", {"nccl_ras": out}, notes, versions, len(docs), set(out.column("host")) - {None},
                  max(sizes) if sizes else None)


def _bool(v):
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return v != 0
    if isinstance(v, str) and v.lower() in ("true", "false", "0", "1"):
        return v.lower() in ("true", "1")
    return None


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
    versions = {"nccl_version": version_from_code(code) if code else None,
                "nccl_tests_json_version": obj.get("version")}
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
            rows.append(out.add(table_index=0, size_bytes=size, count=count, type=typ, dtype_bytes=catalog.dtype_bytes(typ),
                                redop=None if res.get("redop") is None else str(res.get("redop")).strip(),
                                root=to_int(str(res.get("root", "")).strip(), INT32), placement=placement,
                                time_ns=round(t * 1000), cpu_time=cpu, algbw_gbps=to_float(body.get("alg_bw")),
                                busbw_gbps=to_float(body.get("bus_bw")),
                                wrong=round(nw) if nw is not None and math.isfinite(nw) else None,
                                n_ranks=n_ranks, n_nodes=n_nodes))
    if not out.n:
        raise TraceError("nccl-tests JSON has no results")
    src = "stated" if test and test.endswith("_perf") else None
    if src is None:
        test = infer_test([(out.get(i, "size_bytes"), out.get(i, "count"), out.get(i, "dtype_bytes"),
                            out.get(i, "redop"), out.get(i, "root")) for i in rows], n_ranks, True, True)
        src = "inferred" if test else None
    for i in rows:
        out.set(i, test=test, test_source=src)
    return finish("nccl_tests", {"nccl_tests_results": out}, notes, versions, len(obj["results"]),
                  {d.get("hostname") for d in devices}, n_ranks)


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
                out.set(r, end_rel_ns=tns, dur_ns=tns - start if tns is not None and start is not None else None)
            else:
                unmatched_e += 1
            continue
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        dur = to_float(ev.get("dur")) if ph == "X" else None
        end = tns + round(dur * 1000) if dur is not None and tns is not None else None
        r = out.add(event_index=i, name=_s(ev.get("name")), cat=_s(ev.get("cat")), pid=to_int(ev.get("pid")),
                    tid=to_int(ev.get("tid")), id=to_int(ev.get("id")), start_rel_ns=tns, end_rel_ns=end,
                    dur_ns=end - tns if end is not None else None, seq_num=to_int(args.get("SeqNum")),
                    comm_id=norm_hash(args.get("CommHash")), rank=to_int(args.get("Rank"), INT32),
                    count=to_int(args.get("Count")), datatype=_s(args.get("Datatype")), algorithm=_s(args.get("Algorithm")),
                    protocol=_s(args.get("Protocol")), n_channels=to_int(args.get("nChannels"), INT32),
                    args=dumps(args) if args else None)
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

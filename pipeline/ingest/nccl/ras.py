"""NCCL RAS reports (nccl.md 3.3; NCCL docs troubleshooting/ras.rst) -> nccl_ras: the ncclras
text report, its -f json form (2.28.7+) and the RAS monitor's events (one JSON object per line).
"""

from __future__ import annotations

import re

from ..errors import TraceError
from .common import INT32, LogParsed, Rows, dumps, finish, norm_hash, to_int

RAS_VERSION = re.compile(r"NCCL version (?P<v>\S+) compiled with CUDA (?P<cuda>\S+)")
RAS_CUDA = re.compile(r"CUDA runtime version (?P<rt>\d+), driver version (?P<drv>\d+)")
RAS_ISSUE = re.compile(r"#(?P<g>\d+)-(?P<c>\d+) \((?P<hash>[0-9a-fA-F]+)\) (?P<status>\w+)")
RAS_DIFF = re.compile(
    r"Communicator ranks have different (?:(?P<coll>\w+) )?(?:collective )?operation counts"
)
RAS_COUNT = re.compile(r"(?<!\d)(?P<n>\d+) ranks? (?:have|has) launched up to operation (?P<op>\d+)")
RAS_NONE = re.compile(r"(?<!\d)(?P<n>\d+) ranks? (?:have|has) not launched any operations")
RAS_RANK = re.compile(
    r"Rank (?P<rank>\d+)(?: has launched up to operation (?P<op>\d+))? -- GPU (?P<gpu>\S+) "
    r"managed by process (?P<pid>\d+) on node (?P<host>\S+)"
)
RAS_DEAD = re.compile(r"Process (?P<pid>\d+) on node (?P<host>\S+) managing GPUs? (?P<gpu>\S+)")
RAS_MONITOR = re.compile(r"\[(?P<ts>[^\]]+)\] (?P<event>[A-Z_]+): (?P<msg>.*)$")


def ras_text(text: str, notes: list[str]) -> LogParsed:
    """ncclras text report (nccl.md 3.3; NCCL docs troubleshooting/ras.rst) -> nccl_ras rows.
    Column headers and '====' underlines are layout; every other line is a row (kind line when not
    recognized)."""
    out = Rows("nccl_ras")
    versions: dict = {}
    section = None
    finding = _RasFinding(out)
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
        if _ras_table_row(out, i, s, toks, section):
            continue
        sev = {"errors": "error", "warnings": "warning"}.get(section or "")
        finding.line(i, s, sev)
    if not out.n and not versions:
        raise TraceError("no NCCL RAS report lines found")
    gpus = [g for g in out.column("gpus") if g]
    return finish(
        "nccl_ras", {"nccl_ras": out}, notes, versions, len(lines), None, max(gpus) if gpus else None
    )


def _ras_table_row(out: Rows, i: int, s: str, toks: list[str], section: str | None) -> bool:
    """A row (or column header) of the job summary or communicators table: True when `s` was one."""
    if section == "job summary":
        nums = [to_int(t, INT32) for t in toks]
        if len(toks) == 5 and all(n is not None for n in nums):
            out.add(
                line_no=i,
                kind="job",
                nodes=nums[0],
                processes_per_node=nums[1],
                gpus_per_process=nums[2],
                processes=nums[3],
                gpus=nums[4],
                message=s,
            )
            return True
        if toks[0] in ("Nodes", "(total)"):
            return True
    if section == "communicators":
        if toks[0] in ("Group", "#"):
            return True
        if len(toks) >= 8 and toks[0].isdigit():
            n = [to_int(t, INT32) for t in toks[:6]]
            out.add(
                line_no=i,
                kind="comm_group",
                comm_group=n[0],
                comms_in_group=n[1],
                nodes_per_comm=n[2],
                ranks_per_node=n[3],
                ranks_per_comm=n[4],
                ranks_in_group=n[5],
                status=toks[6],
                errors=" ".join(toks[7:]),
                message=s,
            )
            return True
    return False


class _RasFinding:
    """The issue and collective that the finding lines of a ras_text report belong to."""

    def __init__(self, out: Rows):
        self.out = out
        self.issue: dict = {}
        self.collective = None

    def line(self, i: int, s: str, sev: str | None) -> None:
        """One line that is not layout, a version or a table row: issue, rank, count, event or line."""
        out = self.out
        m = RAS_ISSUE.match(s)
        if m:
            self.issue = dict(
                comm_group=to_int(m.group("g"), INT32),
                comm_index=to_int(m.group("c"), INT32),
                comm_id=norm_hash(m.group("hash")),
                severity=sev,
            )
            self.collective = None
            out.add(line_no=i, kind="issue", status=m.group("status"), message=s, **self.issue)
            return
        m = RAS_DIFF.search(s)
        if m:
            self.collective = m.group("coll")
            out.add(line_no=i, kind="line", message=s, collective=self.collective, **self.issue)
            return
        m = RAS_RANK.search(s)
        if m:
            out.add(
                line_no=i,
                kind="rank",
                rank=to_int(m.group("rank"), INT32),
                cuda_dev=to_int(m.group("gpu"), INT32),
                pid=to_int(m.group("pid")),
                host=m.group("host"),
                op_count=to_int(m.group("op")),
                collective=self.collective if m.group("op") else None,
                message=s,
                **self.issue,
            )
            return
        m = RAS_COUNT.search(s) or RAS_NONE.search(s)
        if m:
            out.add(
                line_no=i,
                kind="op_count",
                n_ranks=to_int(m.group("n"), INT32),
                op_count=to_int(m.groupdict().get("op") or 0),
                collective=self.collective,
                message=s,
                **self.issue,
            )
            return
        m = RAS_MONITOR.match(s)
        if m:
            d = RAS_DEAD.search(m.group("msg"))
            out.add(
                line_no=i,
                kind="event",
                status=m.group("event"),
                report_time=m.group("ts"),
                message=s,
                pid=to_int(d.group("pid")) if d else None,
                host=d.group("host") if d else None,
                cuda_dev=to_int(d.group("gpu"), INT32) if d else None,
            )
            return
        m = RAS_DEAD.search(s)
        if m:
            out.add(
                line_no=i,
                kind="dead_process",
                pid=to_int(m.group("pid")),
                host=m.group("host"),
                cuda_dev=to_int(m.group("gpu"), INT32),
                severity=sev,
                message=s,
            )
            return
        if sev and re.fullmatch(r"[A-Z_]+", s):
            self.issue = dict(severity=sev)
            out.add(line_no=i, kind="issue", status=s, severity=sev, message=s)
            return
        out.add(line_no=i, kind="line", severity=sev, message=s)


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
            out.add(
                kind="event",
                status=str(doc.get("event")),
                report_time=str(doc.get("timestamp")),
                host=peer.get("host"),
                pid=to_int(peer.get("pid")),
                cuda_dev=to_int(devs[0], INT32) if isinstance(devs, list) and len(devs) == 1 else None,
                message=dumps(doc.get("details")) if doc.get("details") is not None else None,
            )
            continue
        for k in ("nccl_version", "cuda_runtime_version", "cuda_driver_version"):
            if doc.get(k) is not None:
                versions[k] = doc[k]
        ts = None if doc.get("timestamp") is None else str(doc.get("timestamp"))
        for ci, comm in enumerate(doc.get("communicators") or []):
            if not isinstance(comm, dict):
                continue
            _ras_json_comm(out, ci, comm, ts)
    if not out.n:
        raise TraceError("NCCL RAS JSON without communicators or events")
    sizes = [s for s in out.column("ranks_per_comm") if s]
    return finish(
        "nccl_ras",
        {"nccl_ras": out},
        notes,
        versions,
        len(docs),
        set(out.column("host")) - {None},
        max(sizes) if sizes else None,
    )


def _ras_json_comm(out: Rows, ci: int, comm: dict, ts: str | None) -> None:
    """The rows of one communicator of an ncclras JSON report: comm_group, rank, op_count, missing_rank."""
    cid = norm_hash(comm.get("hash"))
    out.add(
        kind="comm_group",
        comm_index=ci,
        comm_id=cid,
        ranks_per_comm=to_int(comm.get("size"), INT32),
        report_time=ts,
        message=dumps(
            {k: comm.get(k) for k in ("secondary_hash", "ranks_count", "missing_ranks_count") if k in comm}
        ),
    )
    for r in comm.get("ranks") or []:
        if not isinstance(r, dict):
            continue
        st = r.get("status") if isinstance(r.get("status"), dict) else {}
        base = dict(
            comm_index=ci,
            comm_id=cid,
            rank=to_int(r.get("rank"), INT32),
            host=r.get("host"),
            pid=to_int(r.get("pid")),
            cuda_dev=to_int(r.get("cuda_dev"), INT32),
            nvml_dev=to_int(r.get("nvml_dev"), INT32),
            report_time=ts,
        )
        out.add(
            kind="rank",
            status=None if st.get("init_state") is None else str(st.get("init_state")),
            async_error=to_int(st.get("async_error"), INT32),
            finalize_called=_bool(st.get("finalize_called")),
            destroy_flag=_bool(st.get("destroy_flag")),
            abort_flag=_bool(st.get("abort_flag")),
            **base,
        )
        counts = r.get("collective_counts") if isinstance(r.get("collective_counts"), dict) else {}
        for coll, n in counts.items():
            out.add(kind="op_count", collective=str(coll), op_count=to_int(n), **base)
    for r in comm.get("missing_ranks") or []:
        if not isinstance(r, dict):
            continue
        st = r.get("status") if isinstance(r.get("status"), dict) else {}
        out.add(
            kind="missing_rank",
            comm_index=ci,
            comm_id=cid,
            rank=to_int(r.get("rank"), INT32),
            host=r.get("host"),
            pid=to_int(r.get("pid")),
            cuda_dev=to_int(r.get("cuda_dev"), INT32),
            nvml_dev=to_int(r.get("nvml_dev"), INT32),
            unresponsive=_bool(st.get("unresponsive")),
            considered_dead=_bool(st.get("considered_dead")),
            report_time=ts,
        )


def _bool(v):
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return v != 0
    if isinstance(v, str) and v.lower() in ("true", "false", "0", "1"):
        return v.lower() in ("true", "1")
    return None

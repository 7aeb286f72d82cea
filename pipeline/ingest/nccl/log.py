"""Line-oriented parser for NCCL_DEBUG logs, nccl-tests text output and PyTorch ProcessGroupNCCL
messages, in one pass over a file that may mix all three (stdout captures usually do).

Grammar and sources: ../shared/reference/nccl.md section 1 (NCCL lines: prefix regex 1.2, init
lines 1.4, channel lines 1.5, COLL lines 1.7, WARN 1.8), section 1.10 (PyTorch watchdog), section 2.1
(nccl-tests tables). Every non-blank line lands in exactly one table with its line number:
nccl_coll_calls, nccl_channels, nccl_rings, nccl_tests_results (2 rows: out-of-place, in-place),
nccl_watchdog, or nccl_events (everything else, recognized or not, with the raw text).

This module is the core: LogParser splits the file into lines, reads the NCCL line prefix
(host:pid:tid [dev], a launcher wrapper before it, an optional timestamp), bare version lines and
other glog lines, dispatches each line to its grammar and finishes the tables in close(). The
grammars are mixins: log_info.py (WARN/TRACE/CALL lines and the INFO dispatcher), log_comm.py
(COLL, tuning, lifecycle and communicator lines), log_topo.py (channels, rings, trees, net
devices), log_torch.py (PyTorch ProcessGroupNCCL lines), log_nccl_tests.py (nccl-tests output);
their shared state is LogState (log_state.py).
"""

from __future__ import annotations

import calendar
import re

from ..errors import DATA_ERRORS
from .common import INT32, LogParsed, TableFull, dumps, finish, to_int
from .log_comm import CommLines
from .log_info import InfoLines, WarnLines
from .log_nccl_tests import TestsLines, TestsTables
from .log_rates import RateLines
from .log_state import WRAPPER, split_wrapper, wrapper_rank
from .log_topo import NetLines, TopoLines
from .log_torch import APP_VERSION, GLOG, TorchLines, glog_time

# --- NCCL line prefix (nccl.md 1.2; wrappers 1.3) -----------------------------------------------------
# Searched (not anchored): whatever precedes the match is the launcher wrapper.
PREFIX = re.compile(
    r"(?:\[(?P<ts>[^\[\]]*\d{2}:\d{2}:\d{2}[^\[\]]*)\] )?"
    r"(?<![^\s:\[\]])(?P<host>[^\s:\[\]]*):(?P<pid>\d+):(?P<tid>\d+) "
    r"(?:\[(?P<dev>\d+)\] )?(?:(?P<ms>\d+\.\d+) )?"
    r"(?:(?P<src>[\w./-]+):(?P<sline>\d+)(?: \((?P<func>\w+)\))? )?"
    r"NCCL (?P<lvl>INFO|WARN|TRACE|CALL|ABORT) (?P<msg>.*)$"
)
TS_FULL = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?$")
BARE_VERSION = re.compile(
    r"NCCL version (?P<v>\d+\.\d+\.\d+[^\s+]*)(?:\+cuda(?P<cuda>\S+))?"
    r"(?: compiled with CUDA (?P<cuda2>\S+))?\s*$"
)


def _local_ns(ts: str | None) -> int | None:
    if not ts:
        return None
    m = TS_FULL.search(ts.strip())
    if not m:
        return None
    y, mo, d, h, mi, s, frac = m.groups()
    try:
        secs = calendar.timegm((int(y), int(mo), int(d), int(h), int(mi), int(s), 0, 0, 0))
    except (ValueError, OverflowError):
        return None
    return secs * 1_000_000_000 + (int((frac or "").ljust(9, "0")) if frac else 0)


class LogParser(
    WarnLines, InfoLines, CommLines, TopoLines, NetLines, RateLines, TorchLines, TestsLines, TestsTables
):
    """One pass over the lines of a text log; see the module docstring. Use parse_text()."""

    # --- dispatch -----------------------------------------------------------------------------------
    def feed(self, line_no: int, text: str) -> None:
        """Parse one line. Raises TableFull, before the line changed any held state, when it would
        add to what is held to the end of the file past MAX_HELD_BYTES (undo_line() removes the
        appended rows it added first)."""
        self.held.begin_line()
        self.marks = [(r, r.base, len(r.rows)) for r in self.appended]
        li = {"line_no": line_no, "text": text}
        if "NCCL " in text:
            m = PREFIX.search(text)
            if m:
                self.nccl_line(li, text, m)
                return
        if (
            "ProcessGroupNCCL" in text
            or "WorkNCCL(" in text
            or "watchdog" in text.lower()
            or "NCCL error in:" in text
            or "Heartbeat monitor" in text
        ):
            if self.torch_line(li, text):
                return
        if "NCCL version" in text:
            m = BARE_VERSION.search(text)
            if m and (m.start() == 0 or WRAPPER.fullmatch(text[: m.start()])):
                wrapper = text[: m.start()]
                li.update(level="VERSION", wrapper=wrapper, wrapper_rank=wrapper_rank(wrapper))
                cuda = m.group("cuda") or m.group("cuda2")
                if cuda and not re.fullmatch(r"[\d.]+", cuda):
                    cuda = None  # NCCL 2.4.7 '+cudaCUDA_MAJOR.CUDA_MINOR' build bug
                if (m.group("v"), cuda) not in self.bare_versions:
                    self.hold("versions", m.group("v"), cuda)
                    self.bare_versions[m.group("v"), cuda] = None
                self.event(li, "version", detail=dumps({"nccl_version": m.group("v"), "cuda_version": cuda}))
                self.recognized += 1
                return
        wrapper, rest, wrank = split_wrapper(text)
        s = rest.strip()
        if s.startswith("#") or (self.table is not None and s[:1].isdigit()):
            li.update(wrapper=wrapper, wrapper_rank=wrank)
            if self.tests_line(li, s):
                return
        m = GLOG.search(text)
        if m:
            li.update(
                level=m.group("lvl"),
                src_file=m.group("src"),
                src_line=to_int(m.group("sline"), INT32),
                log_time=glog_time(m),
                wrapper=text[: m.start()] or None,
                wrapper_rank=wrapper_rank(text[: m.start()]),
            )
            self.event(li, "torch")
            return
        if "<" in text and self.xml_line(li, text):
            return
        m = APP_VERSION.search(text)
        if m:
            self.versions.setdefault("nccl_version_app", m.group(1))
            self.event(li, "app_version", detail=dumps({"nccl_version": m.group(1)}))
            return
        self.event(li, "other")

    def undo_line(self) -> None:
        """Remove the appended-table rows the line being fed added (unless they were built into a
        frame already), after it raised TableFull: the line is then kept whole as one 'other' event."""
        for r, base, n in self.marks:
            if r.base == base:
                del r.rows[n:]

    # --- NCCL lines ---------------------------------------------------------------------------------
    def nccl_line(self, li: dict, text: str, m: re.Match) -> None:
        msg = m.group("msg")
        inner = PREFIX.search(msg) if "NCCL " in msg else None
        if inner:
            # two writers spliced: the first line was cut where the second one's prefix begins
            self.spliced += 1
            first = dict(li)
            self._prefix(first, text, m)
            first["message"] = msg[: inner.start()]
            self.event(first, "fragment")
            rest = msg[inner.start() :]
            self.nccl_line({"line_no": li["line_no"], "text": text}, rest, PREFIX.search(rest))
            return
        self._prefix(li, text, m)
        self.recognized += 1
        key = (li["host"], li["pid"], li["cuda_dev"])
        if key not in self.seen_devs:
            self.hold("devices", *key)
            self.seen_devs[key] = li["line_no"]
        self.nccl_message(li, msg)

    def _prefix(self, li: dict, text: str, m: re.Match) -> None:
        ts, host, pid, tid, dev, _ms, src, sline, func, lvl, msg = m.groups()
        start = m.start()
        wrapper = text[:start] if start else ""
        li.update(
            host=host,
            pid=int(pid),
            tid=int(tid),
            cuda_dev=int(dev) if dev is not None and len(dev) < 10 else None,
            level=lvl,
            src_file=src,
            src_line=int(sline) if sline is not None and len(sline) < 10 else None,
            func=func,
            wrapper=wrapper,
            wrapper_rank=wrapper_rank(wrapper) if wrapper else None,
            log_time=ts,
            local_time_ns=_local_ns(ts) if ts else None,
            message=msg,
        )

    # --- end of file ----------------------------------------------------------------------------------
    def close(self) -> None:
        """End of file: finish the tables, in this order (each step reads the rows the one before
        added): processes, nccl-tests device lists, ring truncation, nccl-tests ranks and test names.
        These add at most a row per entry already counted, so the held-bytes limit no longer refuses."""
        self.held.closing = True
        self.close_processes()
        self.close_rates()
        self.close_devices()
        self.close_rings()
        self.close_tests()
        if self.spliced:
            self.notes.append(f"{self.spliced} spliced lines (two writers on one line) split in two")


def parse_text(text: str, name: str, fmt: str) -> tuple[LogParsed, int]:
    """Parse a text log held whole (a str): parse_lines over its lines split on \n, NUL bytes left
    out (the padding of a log cut short, as stream.lines does)."""
    lines = text.replace("\0", "").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return parse_lines(lines, name, fmt)


def parse_lines(lines, name: str, fmt: str, spool=None) -> tuple[LogParsed, int]:
    """Parse a text log (NCCL_DEBUG output, nccl-tests output, PyTorch messages, mixed) into the
    LOG_TABLES frames, in one pass over `lines` (an iterable of str without their \n, numbered
    from 1; a trailing \r is dropped). Never raises on a line: a line whose handling fails is
    kept as an nccl_events row (kind other) and counted in the notes. spool: a
    pipeline.ingest.spool._Budget; then nccl_events, nccl_coll_calls and nccl_watchdog are built
    in batches into spools as the lines come (LogParsed.tables holds the spools for them), so
    memory stays bounded whatever the log's length. Returns (parsed, number of lines recognized
    as NCCL, nccl-tests or PyTorch lines)."""
    ps = LogParser(name, spool)
    n_lines = full = 0
    for i, line in enumerate(lines, 1):
        n_lines = i
        line = line.rstrip("\r")
        if not line.strip():
            continue
        try:
            ps.feed(i, line)
        except TableFull:
            full += 1
            ps.undo_line()
            ps.t["nccl_events"].add(line_no=i, kind="other", text=line)
        except DATA_ERRORS as e:  # never stop a file
            ps.failed_lines += 1
            ps.t["nccl_events"].add(
                line_no=i, kind="other", text=line, detail=dumps({"parse_error": f"{type(e).__name__}: {e}"})
            )
    if full:
        ps.notes.append(
            f"{full} lines kept as kind 'other': the rows and maps held to the end of the file (tables "
            "still open to later lines; threads, processes, devices, communicators) reached "
            f"{ps.held.limit_bytes >> 20} MiB"
        )
    ps.close()
    if ps.failed_lines:
        ps.notes.append(f"{ps.failed_lines} lines could not be parsed and were kept as kind 'other'")
    versions = dict(ps.versions)
    p = ps.t["nccl_processes"]
    procs = {v for v in p.column("nccl_version") if v}
    if not procs and ps.bare_versions:
        procs = {v for v, _ in ps.bare_versions}
    if not procs and versions.get("nccl_version_torch"):
        procs = {versions["nccl_version_torch"]}
    if not procs and versions.get("nccl_version_app"):
        procs = {versions["nccl_version_app"]}
    if procs:
        versions["nccl_version"] = ",".join(sorted(procs))
        if len(procs) > 1:
            ps.notes.append(f"several NCCL versions: {', '.join(sorted(procs))}")
    cudas = {c for c in p.column("cuda_version") if c} or {c for _, c in ps.bare_versions if c}
    if len(cudas) == 1:
        versions["cuda_version"] = next(iter(cudas))
    versions.pop("nccl_version_torch", None)
    versions.pop("nccl_version_app", None)
    hosts = p.values("host") | ps.t["nccl_events"].values("host")
    sizes = [
        v
        for v in p.values("nranks")
        | ps.t["nccl_coll_calls"].values("nranks")
        | ps.t["nccl_tests_results"].values("n_ranks")
        | ps.t["nccl_watchdog"].values("group_size")
        if v
    ]
    return finish(fmt, ps.t, ps.notes, versions, n_lines, hosts, max(sizes) if sizes else None), ps.recognized

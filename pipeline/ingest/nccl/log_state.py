"""State of the NCCL_DEBUG text-log parser (log.py), shared by its line grammars: the LOG_TABLES
rows, the per-thread records (Thread: the communicator being initialized, attributes and rows
printed before it, the open error chain), process-level attributes, the nccl-tests run and table
records (TestRun, Table), the launcher-wrapper helpers (nccl.md 1.3), and LogState: the base
class of every grammar mixin, with the row helpers and close_processes(), which finishes
nccl_processes at end of file.

Everything a parse holds to the end of the file - the held tables' rows and values, and every
entry of its maps and lists (threads, processes, devices, communicators, pending attributes,
nccl-tests runs, devices and tables, version lines) - is charged in estimated bytes to one
common.HeldBytes (LogState.held, common.MAX_HELD_BYTES; hold() for a map entry). Past it the line
that would add to them is kept as an nccl_events row of kind 'other' (log.parse_lines), so memory
stays bounded however many processes, threads or communicators a log opens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..spool import _Budget, _Spool
from .common import HELD_ENTRY_BYTES, HeldBytes, Rows, held_bytes

LOG_TABLES = (
    "nccl_processes",
    "nccl_net_devices",
    "nccl_channels",
    "nccl_rings",
    "nccl_coll_calls",
    "nccl_events",
    "nccl_watchdog",
    "nccl_tests_results",
    "nccl_link_rates",
)
#: append-only tables (no row is read or updated after it is added) -> the column whose distinct
#: values parse_lines still needs at the end; these are built into spools as the lines come
SPOOLED = {"nccl_events": ("host",), "nccl_coll_calls": ("nranks",), "nccl_watchdog": ("group_size",)}

WRAPPER = re.compile(
    r"(?:\[\d+,(?P<mpi>\d+)\]<std(?:out|err)>:|\[rank(?P<tr>\d+)\]:|\(\w+ pid=\d+(?:, ip=[^)]*)?\) "
    r"|(?P<srun>\d+): |\[\d+\] |[\w.-]+: )+"
)


@dataclass
class Thread:
    open: int | None = None  # processes row of the communicator being initialized on this thread
    last: int | None = None  # last communicator row identified on this thread
    pending: dict = field(default_factory=dict)
    pending_rows: list = field(default_factory=list)  # (table, row) printed before the comm was known
    chain: int | None = None  # error chain start line
    pending_dev: int | None = None


@dataclass
class TestRun:
    version: str | None = None
    test: str | None = None
    devices: list = field(default_factory=list)
    used: bool = False
    ranks: set = field(default_factory=set)  # the ranks of `devices`, as digits (a device line checks it)


@dataclass
class Table:
    index: int
    run: TestRun
    lead: list
    groups: list  # [(placement, [col names])]
    extra: int  # trailing timestamp tokens
    cpu: bool
    rows: list = field(default_factory=list)


def split_wrapper(line: str) -> tuple[str, str, int | None]:
    """(wrapper, rest, rank named by the wrapper) for known launcher prefixes."""
    m = WRAPPER.match(line)
    if not m:
        return "", line, None
    r = m.group("mpi") or m.group("tr") or m.group("srun")
    return m.group(0), line[m.end() :], int(r) if r is not None else None


def wrapper_rank(wrapper: str) -> int | None:
    m = WRAPPER.fullmatch(wrapper) if wrapper else None
    if not m:
        return None
    r = m.group("mpi") or m.group("tr") or m.group("srun")
    return int(r) if r is not None else None


class LogState:
    """One pass's tables and state (see the module docstring); LogParser (log.py) adds the line
    grammars."""

    def __init__(self, name: str, budget: _Budget | None = None):
        self.name = name
        budget = budget or _Budget(float("inf"), None)  # no budget: every spool stays in memory
        self.spools = [_Spool(n, budget) for n in SPOOLED]
        self.held = HeldBytes()
        self.t = {n: Rows(n, held=self.held) for n in LOG_TABLES}
        for sp in self.spools:
            self.t[sp.name] = Rows(sp.name, sp, SPOOLED[sp.name])
        self.appended = [self.t[n] for n in SPOOLED]
        self.marks: list[tuple] = []  # (table, base, unbuilt rows) of the appended tables at the line's start
        self.notes: list[str] = []
        self.versions: dict = {}
        self.comm_rows: dict[tuple, int] = {}
        self.threads: dict[tuple, Thread] = {}
        self.proc_attrs: dict[tuple, dict] = {}
        self.seen_devs: dict[tuple, int] = {}  # (host, pid, cuda_dev) -> first line
        self.loose: dict[tuple, dict] = {}  # (host, pid, cuda_dev) -> attrs never tied to a comm
        self.bare_versions: dict[tuple[str, str | None], None] = {}  # distinct (version, cuda)
        self.runs: list[TestRun] = []
        self.run: TestRun | None = None
        self.table: Table | None = None
        self.tables: list[Table] = []
        self.spliced = 0
        self.headless: list[int] = [0, 0]  # nccl-tests units lines without their header: first line, count
        self.failed_lines = 0
        self.recognized = 0

    # --- helpers ------------------------------------------------------------------------------------
    def hold(self, what: str, *parts) -> None:
        """Charge one new entry of a held map or list (HELD_ENTRY_BYTES and its parts' held_bytes);
        raises TableFull past the parse's MAX_HELD_BYTES."""
        self.held.charge(HELD_ENTRY_BYTES + sum(held_bytes(p) for p in parts), what)

    def event(self, li: dict, kind: str, **kw) -> None:
        self.t["nccl_events"].add(
            line_no=li["line_no"],
            kind=kind,
            text=li["text"],
            host=li.get("host"),
            pid=li.get("pid"),
            tid=li.get("tid"),
            cuda_dev=li.get("cuda_dev"),
            level=li.get("level"),
            src_file=li.get("src_file"),
            src_line=li.get("src_line"),
            func=li.get("func"),
            wrapper=li.get("wrapper") or None,
            wrapper_rank=li.get("wrapper_rank"),
            log_time=li.get("log_time"),
            local_time_ns=li.get("local_time_ns"),
            message=li.get("message"),
            **kw,
        )

    def thread(self, li: dict) -> Thread:
        key = (li["host"], li["pid"], li["tid"])
        t = self.threads.get(key)
        if t is None:
            self.hold("threads", *key)
            t = self.threads[key] = Thread()
        return t

    def attr(self, li: dict, **kw) -> None:
        """A communicator attribute printed without the communicator (channel counts, affinity, ...):
        onto the comm being initialized on this thread, else kept pending for the next one."""
        th = self.thread(li)
        if th.open is not None:
            self.t["nccl_processes"].fill(th.open, **kw)
        else:
            new = {k: v for k, v in kw.items() if v is not None}
            self.held.charge(sum(held_bytes(v) for v in new.values()), "thread attributes")
            th.pending.update(new)
            th.pending_dev = li.get("cuda_dev")

    def proc(self, li: dict, **kw) -> None:
        """A process-level attribute (version, driver, network)."""
        key = (li["host"], li["pid"])
        if key not in self.proc_attrs:
            self.hold("processes", *key)
        d = self.proc_attrs.setdefault(key, {})
        for k, v in kw.items():
            if v is not None and k not in d:
                self.held.charge(held_bytes(v), "process attributes")
                d[k] = v

    def comm_of(self, li: dict, table: str, row: int) -> None:
        """Tie a channel/ring row to the communicator initializing on its thread (or later)."""
        th = self.thread(li)
        if th.open is not None:
            p = self.t["nccl_processes"]
            self.t[table].set(row, comm_ptr=p.get(th.open, "comm_ptr"), comm_id=p.get(th.open, "comm_id"))
        else:
            self.held.charge(64, "rows waiting for their communicator")
            th.pending_rows.append((table, row))

    def comm_row(self, li: dict, comm: str, fields: dict, what: str) -> int:
        p = self.t["nccl_processes"]
        key = (li["host"], li["pid"], comm)
        r = self.comm_rows.get(key)
        if r is None or (what == "Init START" and p.get(r, "status") in ("destroyed", "aborted")):
            if r is None:
                self.hold("communicators", *key)
            r = p.add(
                host=li["host"],
                pid=li["pid"],
                tid=li["tid"],
                cuda_dev=li.get("cuda_dev"),
                comm_ptr=comm,
                first_line_no=li["line_no"],
            )
            self.comm_rows[key] = r
        p.fill(r, **fields)
        th = self.thread(li)
        if what in ("Init START", "topology", "Init COMPLETE"):
            if th.pending:
                p.fill(r, **th.pending)
                th.pending = {}
            if th.pending_rows and what != "Init START":
                for table, row in th.pending_rows:
                    self.t[table].set(row, comm_ptr=comm, comm_id=p.get(r, "comm_id"))
            th.pending_rows = []
            th.open = None if what == "Init COMPLETE" else r
            th.last = r
        elif th.open == r:
            th.open = None
        return r

    # --- end of file ----------------------------------------------------------------------------------
    def close_processes(self) -> None:
        """nccl_processes at end of file: rows for devices seen in NCCL lines without any
        communicator row, attributes never tied to a communicator, process-level attributes and
        the file's bare version line."""
        p = self.t["nccl_processes"]
        # rows for (host, pid, cudaDev) seen in NCCL lines without any communicator row
        covered = {(p.get(i, "host"), p.get(i, "pid"), p.get(i, "cuda_dev")) for i in range(p.n)}
        covered_procs = {(h, pid) for h, pid, _ in covered}
        for th_key, th in self.threads.items():
            if th.pending:
                key = (th_key[0], th_key[1], th.pending_dev)
                self.loose.setdefault(key, {}).update(th.pending)
        for (host, pid, dev), line in sorted(self.seen_devs.items(), key=lambda kv: kv[1]):
            if (host, pid, dev) in covered or (dev is None and (host, pid) in covered_procs):
                continue
            p.add(host=host, pid=pid, cuda_dev=dev, first_line_no=line)
            covered.add((host, pid, dev))
            covered_procs.add((host, pid))
        commless: dict[tuple, list[int]] = {}  # (host, pid, cuda_dev) -> rows without a communicator
        for i in range(p.n):
            if p.get(i, "comm_ptr") is None:
                commless.setdefault((p.get(i, "host"), p.get(i, "pid"), p.get(i, "cuda_dev")), []).append(i)
        for key, attrs in self.loose.items():
            for i in commless.get(key, ()):
                p.fill(i, **attrs)
        # process-level attributes, then the file's bare version line for processes without their own
        bare = {v for v, _ in self.bare_versions}
        bare_cuda = {c for _, c in self.bare_versions if c}
        for i in range(p.n):
            attrs = self.proc_attrs.get((p.get(i, "host"), p.get(i, "pid")), {})
            p.fill(i, **attrs)
            if len(bare) == 1:
                p.fill(
                    i,
                    nccl_version=next(iter(bare)),
                    cuda_version=next(iter(bare_cuda)) if len(bare_cuda) == 1 else None,
                )

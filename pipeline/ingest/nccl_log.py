"""Line-oriented parser for NCCL_DEBUG logs, nccl-tests text output and PyTorch ProcessGroupNCCL
messages, in one pass over a file that may mix all three (stdout captures usually do).

Grammar and sources: ../shared/reference/nccl.md section 1 (NCCL lines: prefix regex 1.2, init
lines 1.4, channel lines 1.5, COLL lines 1.7, WARN 1.8), section 1.10 (PyTorch watchdog), section 2.1
(nccl-tests tables). Every non-blank line lands in exactly one table with its line number:
nccl_coll_calls, nccl_channels, nccl_rings, nccl_tests_results (2 rows: out-of-place, in-place),
nccl_watchdog, or nccl_events (everything else, recognized or not, with the raw text).
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass, field

from .. import catalog
from .nccl_common import (INT32, IBV_WC_STATUS, NCCL_ALGOS, NCCL_DTYPES, NCCL_PROTOS, NCCL_REDOPS, NCCL_RESULTS,
                          TIMES_NRANKS_OPS, LogParsed, Rows, dumps, finish, norm_hash,
                          pci_from_busid, to_float, to_int)

LOG_TABLES = ("nccl_processes", "nccl_net_devices", "nccl_channels", "nccl_rings", "nccl_coll_calls",
              "nccl_events", "nccl_watchdog", "nccl_tests_results")

# --- NCCL line prefix (nccl.md 1.2; wrappers 1.3) -----------------------------------------------------
# Searched (not anchored): whatever precedes the match is the launcher wrapper.
PREFIX = re.compile(
    r"(?:\[(?P<ts>[^\]]*\d{2}:\d{2}:\d{2}[^\]]*)\] )?"
    r"(?P<host>[^\s:\[\]]*):(?P<pid>\d+):(?P<tid>\d+) "
    r"(?:\[(?P<dev>\d+)\] )?(?:(?P<ms>\d+\.\d+) )?"
    r"(?:(?P<src>[\w./-]+):(?P<sline>\d+)(?: \((?P<func>\w+)\))? )?"
    r"NCCL (?P<lvl>INFO|WARN|TRACE|CALL|ABORT) (?P<msg>.*)$")
WRAPPER = re.compile(r"(?:\[\d+,(?P<mpi>\d+)\]<std(?:out|err)>:|\[rank(?P<tr>\d+)\]:|\(\w+ pid=\d+(?:, ip=[^)]*)?\) "
                     r"|(?P<srun>\d+): |\[\d+\] |[\w.-]+: )+")
TS_FULL = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?$")
BARE_VERSION = re.compile(r"NCCL version (?P<v>\d+\.\d+\.\d+[^\s+]*)(?:\+cuda(?P<cuda>\S+))?"
                          r"(?: compiled with CUDA (?P<cuda2>\S+))?\s*$")

# --- NCCL messages ----------------------------------------------------------------------------------
COLL = re.compile(r"(?P<op>\w+): opCount (?P<opc>[0-9a-fA-F]+) sendbuff (?P<sb>\S+) recvbuff (?P<rb>\S+) "
                  r"count (?P<count>\d+) datatype (?P<dt>\d+) op (?P<redop>\d+) root (?P<root>-?\d+) "
                  r"comm (?P<comm>\S+)(?: \[nranks=(?P<nranks>\d+)\])?(?: stream (?P<stream>\S+))?")
TUNING = re.compile(r"(?:(?P<op>\w+): )?(?P<bytes>\d+) Bytes -> Algo (?P<algo>\w+) proto (?P<proto>\w+)"
                    r"(?: channel\{Lo\.\.Hi\}=\{(?P<lo>\d+)\.\.(?P<hi>\d+)\})?(?: time (?P<time>-?[\d.]+))?")
CONN = re.compile(r"(?:Channel|Ring) (?P<ch>\d+)(?:/(?P<conn>\d+))? : (?P<src>\d+)(?:\[(?P<sb>[0-9a-fA-F]+)\])? -> "
                  r"(?P<dst>\d+)(?:\[(?P<db>[0-9a-fA-F]+)\])?(?: \[(?P<dir>send|receive)\])? via (?P<via>.+?)\s*$")
COLLNET = re.compile(r"CollNet (?P<ch>\d+)(?:/(?P<conn>\d+))? : (?P<rank>\d+) \[(?P<dir>send|receive)\] via (?P<via>.+?)\s*$")
RING_ORDER = re.compile(r"Channel (?P<ch>\d+)(?:/(?P<n>\d+))? :(?P<ranks>(?:\s+\d+)+)(?P<more>\s*\.\.\.)?\s*$")
TREES = re.compile(r"Trees((?: \[\d+\] -?\d+/-?\d+/-?\d+->-?\d+->-?\d+)+)\s*$")
TREE_ITEM = re.compile(r"\[(\d+)\] (-?\d+)/(-?\d+)/(-?\d+)->(-?\d+)->(-?\d+)")
RING_GRAPH = re.compile(r"Ring (?P<ch>\d+) : (?P<prev>-?\d+) -> (?P<rank>-?\d+) -> (?P<next>-?\d+)\s*$")
TREE_GRAPH = re.compile(r"Tree (?P<ch>\d+) : (?P<up>-?\d+) -> (?P<rank>-?\d+) -> (?P<down>-?\d+(?:/-?\d+)*)\s*$")
NVLS_HEAD = re.compile(r"NVLS Head\s+(?P<h>\d+):(?P<ranks>(?:\s+-?\d+)+)\s*$")
LIFECYCLE = re.compile(r"(?:\[Rank (?P<rk>\d+)\] )?(?:(?P<func>\w+) )?comm (?P<comm>\S+) (?P<kv>rank .*?)\s*"
                       r"- (?P<what>(?:Init|Destroy|Abort|Revoke) (?:START|COMPLETE))(?:, result (?P<res>-?\d+))?\s*$")
TOPOLOGY = re.compile(r"comm (?P<comm>\S+) (?P<kv>rank \d+ nRanks \d+.*?)\s*$")
KV = re.compile(r"(\w+) (\S+)")
CHANNEL_COUNTS = re.compile(r"(\d+) (coll|collnet|nvls|p2p) channels( per peer)?")
INIT_TIMINGS = re.compile(r"Init timings(?: - (?P<func>\w+))?: rank (?P<rank>\d+) nranks (?P<nranks>\d+) "
                          r"total (?P<total>[\d.]+)(?: \((?P<parts>[^)]*)\))?")
BOOT_TIMINGS = re.compile(r"Bootstrap timings total (?P<total>[\d.]+)(?: \((?P<parts>[^)]*)\))?")
NAMED_SECONDS = re.compile(r"(\w+) ([\d.]+)")
VERSION_INFO = re.compile(r"NCCL version (?P<v>\d+\.\d+\.\d+[^\s+]*)(?:\+cuda(?P<cuda>\S+))?")
DRIVER = re.compile(r"cudaDriverVersion (\d+)")
NET_IB = re.compile(r"NET/IB ?: Using (?P<devs>.*?)(?P<ro> \[RO\])?; OOB (?P<oobif>[^:\s]+):(?P<oobip>\S+?)<\d+>")
IB_DEV = re.compile(r"\[(?P<i>\d+)\](?P<name>[^:\s]+):(?P<port>\d+)/(?P<ll>[A-Za-z]+)(?P<flags>(?:/[\w.]+)*)")
NET_SOCKET = re.compile(r"NET/Socket ?: Using (?P<devs>.*)$")
SOCK_DEV = re.compile(r"\[(?P<i>\d+)\](?P<name>[^:\s]+):(?P<ip>\S+?)<\d+>")
BOOTSTRAP = re.compile(r"Bootstrap ?: Using (?P<name>[^:\s]+):(?P<ip>\S+?)<\d+>")
OFI_PROVIDER = re.compile(r"NET/OFI Selected Provider is (?P<prov>\S+) \(found (?P<n>\d+) nics\)")
OFI_VERSION = re.compile(r"NET/OFI (?:Using|Initializing) aws-ofi-nccl (?P<v>\S+)")
USING_NETWORK = re.compile(r"Using network (?P<net>.+?)\s*$")
AFFINITY = re.compile(r"Setting affinity for GPU (?P<gpu>\d+) to (?P<mask>\S+)")
NVLS_SUPPORT = re.compile(r"NVLS multicast support is (?P<not>not )?available on dev (?P<dev>\d+)")
CONNECTED = re.compile(r"Connected all rings(?:, use ring PXN (?P<pxn>\d) GDR (?P<gdr>\d))?")
ENV_SET = re.compile(r"(?P<var>[A-Z][A-Z0-9_]+) set by environment to (?P<val>.*?)\.?\s*$")
ENV_SET2 = re.compile(r"(?P<var>NCCL_[A-Z0-9_]+) set to (?P<val>.*?)\s*$")
CHAIN = re.compile(r"(?P<src>[\w./-]+):(?P<line>\d+)(?: \((?P<func>\w+)\))? -> (?P<code>\d+)"
                   r"(?: \((?P<errno>[^)]*)\))?(?: \[(?P<thread>[^\]]+)\])?\s*$")
IB_COMPLETION = re.compile(r"NET/IB ?: Got completion (?:from peer (?P<peer>\S+) )?with (?:status=|error )(?P<status>\d+),? "
                           r"opcode[= ](?P<opcode>\d+),? len[= ](?P<len>\d+),? vendor err (?P<verr>\d+)"
                           r"(?: \((?P<dir>\w+)\))?(?: localGid ?(?P<lgid>\S+))?(?: remoteGids ?(?P<rgid>\S+))?(?: hca (?P<hca>\S+))?")
CALL = re.compile(r"(?P<api>\w+)\((?P<args>.*)\)\s*$")
THRESHOLDS = re.compile(r"threadThresholds (?P<t>.+?)\s*$")

# --- PyTorch (nccl.md 1.10) ---------------------------------------------------------------------------
GLOG = re.compile(r"\[(?P<lvl>[IWEF])(?P<date>\d{3,4})? ?(?P<time>\d{1,2}:\d{2}:\d{2}\.\d+)?\s*(?:(?P<tid>\d+) )?"
                  r"(?P<src>[\w.-]+\.(?:cpp|cc|hpp|h|cu|py)):(?P<sline>\d+)\] (?P<msg>.*)$")
PG_TAG = re.compile(r"\[(?:PG ID (?P<pgid>\d+) PG GUID (?P<guid>[^\s(\]]+)(?:\((?P<desc>[^)]*)\))? "
                    r"|PG (?P<pgid2>\d+) (?:\((?P<desc2>[^)]*)\) )?)?Rank (?P<rank>\d+)\] ?")
WORK = re.compile(r"WorkNCCL\((?P<body>(?:[^()]|\([^()]*\))*)\)")
WORK_KV = re.compile(r"(\w+(?:\(ms\))?)=([^,]*)")
RAN_FOR = re.compile(r"ran for (\d+) milliseconds")
AT_WORK = re.compile(r"(?:at work|work sequence id): (\d+)")
LAST = re.compile(r"last (enqueued|started|completed) (?:NCCL )?work: (\d+)")
NCCL_ERROR = re.compile(r"NCCL error in: (?P<where>\S+?), (?P<err>.*?), NCCL version (?P<v>\d+\.\d+\.\d+\S*)")
HEARTBEAT = re.compile(r"Heartbeat monitor timed out")
APP_VERSION = re.compile(r"(?:using nccl==|NCCL version: ?)(\d+\.\d+\.\d+)")

# --- nccl-tests (nccl.md 2.1) ---------------------------------------------------------------------------
T_VERSION = re.compile(r"#\s*nccl-tests version (?P<v>\S+)(?: nccl-headers=(?P<h>\d+))?(?: nccl-library=(?P<l>\d+))?")
T_START = re.compile(r"#\s*Collective test starting: (?P<t>\S+)")
T_CONFIG = re.compile(r"#\s*nThread (?P<n_threads>\d+) nGpus (?P<n_gpus>\d+) minBytes (?P<min_bytes>\d+) maxBytes (?P<max_bytes>\d+) "
                      r"step: (?P<step>\d+)\((?P<step_kind>\w+)\) warmup iters: (?P<warmup_iters>\d+) iters: (?P<iters>\d+)"
                      r"(?: agg iters: (?P<agg_iters>\d+))? validation: (?P<validation>\d+)(?: graph: (?P<graph>\d+))?")
T_DEVICE = re.compile(r"#\s+Rank\s+(?P<rank>\d+)(?:\s+Group\s+(?P<group>\d+))?\s+Pid\s+(?P<pid>\d+)\s+on\s+(?P<host>\S+)"
                      r"\s+device\s+(?P<dev>\d+)\s+\[(?P<bus>[^\]]*)\]\s*(?P<name>.*?)\s*$")
T_UNITS = re.compile(r"#\s+\(B\)\s+\(elements\)")
T_OOB = re.compile(r"#\s*Out of bounds values\s*:\s*(?P<n>\d+)\s*(?P<ok>\w*)")
T_AVG = re.compile(r"#\s*Avg bus bandwidth\s*:\s*(?P<bw>[-\d.eE+]+|nan)")
T_CONCLUDED = re.compile(r"#\s*Collective test concluded: (?P<t>\S+)")
MODERN_HEADER = "size count type redop root time algbw busbw #wrong time algbw busbw #wrong".split()
REDUCTIONS = {"sum", "prod", "max", "min", "avg", "premulsum", "mulsum"}

#: COLL ops whose root field is a root rank / whose op field is a reduction (nccl.md 1.7: NCCL
#: prints root 0 and op 0 for the others).
ROOTED_OPS = {"Broadcast", "Reduce", "Gather", "Scatter"}
REDUCING_OPS = {"AllReduce", "Reduce", "ReduceScatter"}


@dataclass
class Thread:
    open: int | None = None   # processes row of the communicator being initialized on this thread
    last: int | None = None   # last communicator row identified on this thread
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


@dataclass
class Table:
    index: int
    run: TestRun
    lead: list
    groups: list  # [(placement, [col names])]
    extra: int    # trailing timestamp tokens
    cpu: bool
    rows: list = field(default_factory=list)


def _split_wrapper(line: str) -> tuple[str, str, int | None]:
    """(wrapper, rest, rank named by the wrapper) for known launcher prefixes."""
    m = WRAPPER.match(line)
    if not m:
        return "", line, None
    r = m.group("mpi") or m.group("tr") or m.group("srun")
    return m.group(0), line[m.end():], int(r) if r is not None else None


def _wrapper_rank(wrapper: str) -> int | None:
    m = WRAPPER.fullmatch(wrapper) if wrapper else None
    if not m:
        return None
    r = m.group("mpi") or m.group("tr") or m.group("srun")
    return int(r) if r is not None else None


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


def _kv(text: str) -> dict:
    return {k: v for k, v in KV.findall(text)}


def _seconds(parts: str | None) -> dict:
    """'kernels 0.51, bootstrap 0.22' -> {'kernels_ns': 510000000, ...} (seconds in the log)."""
    out = {}
    for k, v in NAMED_SECONDS.findall(parts or ""):
        f = to_float(v)
        if f is not None:
            out[f"{k}_ns"] = round(f * 1e9)
    return out


class LogParser:
    """One pass over the lines of a text log; see the module docstring. Use parse_text()."""

    def __init__(self, name: str):
        self.name = name
        self.t = {n: Rows(n) for n in LOG_TABLES}
        self.notes: list[str] = []
        self.versions: dict = {}
        self.comm_rows: dict[tuple, int] = {}
        self.threads: dict[tuple, Thread] = {}
        self.proc_attrs: dict[tuple, dict] = {}
        self.seen_devs: dict[tuple, int] = {}   # (host, pid, cuda_dev) -> first line
        self.loose: dict[tuple, dict] = {}      # (host, pid, cuda_dev) -> attrs never tied to a comm
        self.bare_versions: list[tuple[str, str | None]] = []
        self.runs: list[TestRun] = []
        self.run: TestRun | None = None
        self.table: Table | None = None
        self.tables: list[Table] = []
        self.spliced = 0
        self.failed_lines = 0
        self.recognized = 0

    # --- helpers ------------------------------------------------------------------------------------
    def event(self, li: dict, kind: str, **kw) -> None:
        self.t["nccl_events"].add(
            line_no=li["line_no"], kind=kind, text=li["text"], host=li.get("host"), pid=li.get("pid"),
            tid=li.get("tid"), cuda_dev=li.get("cuda_dev"), level=li.get("level"), src_file=li.get("src_file"),
            src_line=li.get("src_line"), func=li.get("func"), wrapper=li.get("wrapper") or None,
            wrapper_rank=li.get("wrapper_rank"), log_time=li.get("log_time"), local_time_ns=li.get("local_time_ns"),
            message=li.get("message"), **kw)

    def thread(self, li: dict) -> Thread:
        key = (li["host"], li["pid"], li["tid"])
        t = self.threads.get(key)
        if t is None:
            t = self.threads[key] = Thread()
        return t

    def attr(self, li: dict, **kw) -> None:
        """A communicator attribute printed without the communicator (channel counts, affinity, ...):
        onto the comm being initialized on this thread, else kept pending for the next one."""
        th = self.thread(li)
        if th.open is not None:
            self.t["nccl_processes"].fill(th.open, **kw)
        else:
            th.pending.update({k: v for k, v in kw.items() if v is not None})
            th.pending_dev = li.get("cuda_dev")

    def proc(self, li: dict, **kw) -> None:
        """A process-level attribute (version, driver, network)."""
        d = self.proc_attrs.setdefault((li["host"], li["pid"]), {})
        for k, v in kw.items():
            if v is not None and k not in d:
                d[k] = v

    def comm_of(self, li: dict, table: str, row: int) -> None:
        """Tie a channel/ring row to the communicator initializing on its thread (or later)."""
        th = self.thread(li)
        if th.open is not None:
            p = self.t["nccl_processes"]
            self.t[table].set(row, comm_ptr=p.get(th.open, "comm_ptr"), comm_id=p.get(th.open, "comm_id"))
        else:
            th.pending_rows.append((table, row))

    def comm_row(self, li: dict, comm: str, fields: dict, what: str) -> int:
        p = self.t["nccl_processes"]
        key = (li["host"], li["pid"], comm)
        r = self.comm_rows.get(key)
        if r is None or (what == "Init START" and p.get(r, "status") in ("destroyed", "aborted")):
            r = p.add(host=li["host"], pid=li["pid"], tid=li["tid"], cuda_dev=li.get("cuda_dev"), comm_ptr=comm,
                      first_line_no=li["line_no"])
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

    # --- dispatch -----------------------------------------------------------------------------------
    def feed(self, line_no: int, text: str) -> None:
        li = {"line_no": line_no, "text": text}
        if "NCCL " in text:
            m = PREFIX.search(text)
            if m:
                self.nccl_line(li, text, m)
                return
        if ("ProcessGroupNCCL" in text or "WorkNCCL(" in text or "watchdog" in text.lower()
                or "NCCL error in:" in text or "Heartbeat monitor" in text):
            if self.torch_line(li, text):
                return
        if "NCCL version" in text:
            m = BARE_VERSION.search(text)
            if m and (m.start() == 0 or WRAPPER.fullmatch(text[:m.start()])):
                wrapper = text[:m.start()]
                li.update(level="VERSION", wrapper=wrapper, wrapper_rank=_wrapper_rank(wrapper))
                cuda = m.group("cuda") or m.group("cuda2")
                if cuda and not re.fullmatch(r"[\d.]+", cuda):
                    cuda = None  # NCCL 2.4.7 '+cudaCUDA_MAJOR.CUDA_MINOR' build bug
                self.bare_versions.append((m.group("v"), cuda))
                self.event(li, "version", detail=dumps({"nccl_version": m.group("v"), "cuda_version": cuda}))
                self.recognized += 1
                return
        wrapper, rest, wrank = _split_wrapper(text)
        s = rest.strip()
        if s.startswith("#") or (self.table is not None and s[:1].isdigit()):
            li.update(wrapper=wrapper, wrapper_rank=wrank)
            if self.tests_line(li, s):
                return
        m = GLOG.search(text)
        if m:
            li.update(level=m.group("lvl"), src_file=m.group("src"), src_line=to_int(m.group("sline"), INT32),
                      log_time=_glog_time(m), wrapper=text[:m.start()] or None, wrapper_rank=_wrapper_rank(text[:m.start()]))
            self.event(li, "torch")
            return
        m = APP_VERSION.search(text)
        if m:
            self.versions.setdefault("nccl_version_app", m.group(1))
            self.event(li, "app_version", detail=dumps({"nccl_version": m.group(1)}))
            return
        self.event(li, "other")

    # --- NCCL lines ---------------------------------------------------------------------------------
    def nccl_line(self, li: dict, text: str, m: re.Match) -> None:
        msg = m.group("msg")
        inner = PREFIX.search(msg) if "NCCL " in msg else None
        if inner:
            # two writers spliced: the first line was cut where the second one's prefix begins
            self.spliced += 1
            first = dict(li)
            self._prefix(first, text, m)
            first["message"] = msg[:inner.start()]
            self.event(first, "fragment")
            rest = msg[inner.start():]
            self.nccl_line({"line_no": li["line_no"], "text": text}, rest, PREFIX.search(rest))
            return
        self._prefix(li, text, m)
        self.recognized += 1
        key = (li["host"], li["pid"], li["cuda_dev"])
        if key not in self.seen_devs:
            self.seen_devs[key] = li["line_no"]
        lvl = li["level"]
        th = self.thread(li)
        if lvl == "WARN":
            th.chain = li["line_no"]
            self.event(li, "warn", error_chain=li["line_no"], detail=self._warn_detail(msg))
            return
        mc = CHAIN.match(msg)
        if mc:
            if th.chain is None:
                th.chain = li["line_no"]
            code = int(mc.group("code"))
            li.update(src_file=mc.group("src"), src_line=to_int(mc.group("line"), INT32), func=mc.group("func") or li.get("func"))
            det = {"result": NCCL_RESULTS.get(code)}
            if mc.group("thread"):
                det["thread"] = mc.group("thread")
            if mc.group("errno"):
                det["errno"] = mc.group("errno")
            self.event(li, "error_chain", result_code=to_int(code, INT32), error_chain=th.chain, detail=dumps(det))
            return
        th.chain = None
        if lvl == "CALL":
            mm = CALL.match(msg)
            det = {"api": mm.group("api"), "args": [a.strip() for a in mm.group("args").split(",")] if mm.group("args") else []} if mm else None
            self.event(li, "call", detail=dumps(det) if det else None)
            return
        if lvl == "TRACE":
            self.event(li, "trace")
            return
        self.info(li, msg)

    def _prefix(self, li: dict, text: str, m: re.Match) -> None:
        ts, host, pid, tid, dev, _ms, src, sline, func, lvl, msg = m.groups()
        start = m.start()
        wrapper = text[:start] if start else ""
        li.update(host=host, pid=int(pid), tid=int(tid), cuda_dev=int(dev) if dev is not None and len(dev) < 10 else None,
                  level=lvl, src_file=src, src_line=int(sline) if sline is not None and len(sline) < 10 else None,
                  func=func, wrapper=wrapper, wrapper_rank=_wrapper_rank(wrapper) if wrapper else None, log_time=ts,
                  local_time_ns=_local_ns(ts) if ts else None, message=msg)

    def _warn_detail(self, msg: str) -> str | None:
        m = IB_COMPLETION.search(msg)
        if not m:
            return None
        st = int(m.group("status"))
        d = {"peer": m.group("peer"), "ib_status": st, "ib_status_name": "IBV_WC_" + IBV_WC_STATUS.get(st, "UNKNOWN"),
             "opcode": int(m.group("opcode")), "len": int(m.group("len")), "vendor_err": int(m.group("verr")),
             "direction": m.group("dir"), "local_gid": m.group("lgid"), "remote_gid": m.group("rgid"), "hca": m.group("hca")}
        return dumps({k: v for k, v in d.items() if v is not None})

    def info(self, li: dict, msg: str) -> None:
        if ": opCount " in msg:
            m = COLL.match(msg)
            if m and self.coll(li, m):
                return
        if " Bytes -> Algo " in msg:
            m = TUNING.match(msg)
            if m:
                algo, proto = m.group("algo"), m.group("proto")
                d = {"op": m.group("op"), "bytes": int(m.group("bytes")),
                     "algo": NCCL_ALGOS.get(int(algo), algo) if algo.isdigit() else algo,
                     "proto": NCCL_PROTOS.get(int(proto), proto) if proto.isdigit() else proto}
                if m.group("lo") is not None:
                    d.update(channel_lo=int(m.group("lo")), channel_hi=int(m.group("hi")))
                if m.group("time") is not None:
                    d["time_us"] = float(m.group("time"))
                self.event(li, "tuning", detail=dumps(d))
                return
        first = msg.split(" ", 1)[0]
        if first in ("Channel", "Ring", "CollNet", "Trees", "Tree", "NVLS"):
            if self.topo_line(li, msg):
                return
        if " comm " in f" {msg}" and (" - Init" in msg or " - Destroy" in msg or " - Abort" in msg or " - Revoke" in msg):
            m = LIFECYCLE.search(msg)
            if m:
                self.lifecycle(li, m)
                return
        if msg.startswith("comm ") and " nRanks " in msg:
            m = TOPOLOGY.match(msg)
            if m:
                kv = _kv(m.group("kv"))
                self.comm_row(li, m.group("comm"), {
                    "rank": to_int(kv.get("rank"), INT32), "nranks": to_int(kv.get("nRanks"), INT32),
                    "n_nodes": to_int(kv.get("nNodes"), INT32), "local_ranks": to_int(kv.get("localRanks"), INT32),
                    "local_rank": to_int(kv.get("localRank"), INT32),
                    "mnnvl": None if kv.get("MNNVL") is None else kv.get("MNNVL") != "0"}, "topology")
                self.event(li, "topology", detail=dumps(kv))
                return
        if " channels" in msg:
            counts = CHANNEL_COUNTS.findall(msg)
            if counts:
                d = {}
                for n, what, per_peer in counts:
                    d[f"n_{what}_channels" + ("_per_peer" if per_peer else "")] = to_int(n, INT32)
                self.attr(li, **d)
                self.event(li, "channel_counts", detail=dumps(d))
                return
        if msg.startswith("threadThresholds"):
            m = THRESHOLDS.match(msg)
            self.attr(li, thread_thresholds=m.group("t") if m else None)
            self.event(li, "thresholds")
            return
        if msg.startswith("Init timings"):
            m = INIT_TIMINGS.match(msg)
            if m:
                self.init_timings(li, m)
                return
        if msg.startswith("Bootstrap timings"):
            m = BOOT_TIMINGS.match(msg)
            if m:
                d = {"total_ns": round(float(m.group("total")) * 1e9), **_seconds(m.group("parts"))}
                self.event(li, "bootstrap_timings", detail=dumps(d))
                return
        if msg.startswith("NCCL version"):
            m = VERSION_INFO.match(msg)
            if m:
                self.proc(li, nccl_version=m.group("v"), cuda_version=m.group("cuda"))
                self.event(li, "version", detail=dumps({"nccl_version": m.group("v"), "cuda_version": m.group("cuda")}))
                return
        if msg.startswith("cudaDriverVersion"):
            m = DRIVER.match(msg)
            if m:
                self.proc(li, cuda_driver_version=to_int(m.group(1), INT32))
                self.event(li, "init")
                return
        if msg.startswith(("NET/", "Bootstrap", "Using network", "Using non-device net plugin", "Initialized NET plugin",
                           "Assigned NET plugin", "Assigned GIN", "Assigned RMA", "Failed to initialize")):
            self.net_line(li, msg)
            return
        if msg.startswith("Setting affinity"):
            m = AFFINITY.match(msg)
            self.attr(li, cpu_affinity=m.group("mask") if m else None)
            self.event(li, "init")
            return
        if msg.startswith("NVLS"):
            m = NVLS_SUPPORT.match(msg)
            if m:
                self.attr(li, nvls_multicast=m.group("not") is None)
            self.event(li, "nvls")
            return
        if msg.startswith("Connected") and not msg.startswith("Connected to proxy"):
            m = CONNECTED.match(msg)
            if m and m.group("pxn") is not None:
                self.attr(li, ring_pxn=m.group("pxn") == "1", ring_gdr=m.group("gdr") == "1")
            self.event(li, "connected")
            return
        if " set by environment to " in msg or (msg.startswith("NCCL_") and " set to " in msg):
            m = ENV_SET.match(msg) or ENV_SET2.match(msg)
            if m:
                self.event(li, "env", detail=dumps({"var": m.group("var"), "value": m.group("val")}))
                return
        if msg.startswith("RAS "):
            self.event(li, "ras")
            return
        if "proxy" in msg.lower() or msg.startswith(("New proxy", "Connected to proxy", "resp.opId", "Received and initiated")):
            self.event(li, "proxy")
            return
        if (msg.startswith(("MMAP ", "Mem ", "MemManager", "Allocated ", "register comm", "Cuda Host Alloc", "Cuda CallocAsync"))
                or " Cuda CallocAsync " in msg or " Cuda Host Alloc " in msg or "memory stack" in msg):
            self.event(li, "alloc")
            return
        if msg.startswith(("Launch mode", "Using ", "P2P Chunksize", "Pattern ", "Enabled NCCL", "CUDA Dev", "DMA-BUF",
                           "ncclTopo", "comm ", "ENV/Plugin", "Trees disabled")):
            self.event(li, "init")
            return
        self.event(li, "info")

    def coll(self, li: dict, m: re.Match) -> bool:
        """A COLL line -> nccl_coll_calls; False (kept as an event) when a number does not fit its column."""
        op, opc, sb, rb, count, dt, redop, root, comm, nranks, stream = m.groups()
        count, dt = to_int(count), to_int(dt, INT32)
        if count is None or dt is None or len(opc) > 15:
            return False
        name, size = NCCL_DTYPES.get(dt, (None, None))
        nranks = int(nranks) if nranks is not None and len(nranks) < 10 else None
        nbytes = count * size if size is not None else None
        msg_bytes = nbytes
        if nbytes is not None and op in TIMES_NRANKS_OPS:
            msg_bytes = nbytes * nranks if nranks is not None else None
        redop = to_int(redop, INT32)
        root = to_int(root, INT32)
        r = self.comm_rows.get((li["host"], li["pid"], comm))
        if r is not None:
            prow = self.t["nccl_processes"].rows[r]
            comm_id, rank = prow.get("comm_id"), prow.get("rank")
        else:
            comm_id = rank = None
        self.t["nccl_coll_calls"].add(
            line_no=li["line_no"], host=li["host"], pid=li["pid"], tid=li["tid"], cuda_dev=li["cuda_dev"], op=op,
            op_count=int(opc, 16) if len(opc) <= 15 else None, sendbuff=None if sb == "(nil)" else sb,
            recvbuff=None if rb == "(nil)" else rb, count=count, datatype_id=dt, datatype=name, dtype_bytes=size,
            bytes=nbytes, msg_bytes=msg_bytes, redop_id=redop,
            redop=NCCL_REDOPS.get(redop, "user") if redop is not None and op in REDUCING_OPS else None,
            root=root if op in ROOTED_OPS else None, peer=root if op in ("Send", "Recv") else None, comm_ptr=comm,
            comm_id=comm_id, rank=rank, nranks=nranks, stream=stream)
        return True

    def topo_line(self, li: dict, msg: str) -> bool:
        rings = self.t["nccl_rings"]
        base = dict(line_no=li["line_no"], host=li["host"], pid=li["pid"], tid=li["tid"], cuda_dev=li.get("cuda_dev"))
        m = CONN.match(msg)
        if m and len(m.group("ch")) < 10:
            self.connection(li, m)
            return True
        m = COLLNET.match(msg)
        if m and len(m.group("ch")) < 10:
            r = self.t["nccl_channels"].add(line_no=li["line_no"], host=li["host"], pid=li["pid"], tid=li["tid"],
                                            cuda_dev=li.get("cuda_dev"), kind="collnet", channel=int(m.group("ch")),
                                            conn_index=to_int(m.group("conn"), INT32), rank=to_int(m.group("rank"), INT32),
                                            direction=m.group("dir"), via=m.group("via"),
                                            transport=m.group("via").split("/", 1)[0].upper())
            self.comm_of(li, "nccl_channels", r)
            return True
        m = RING_ORDER.match(msg)
        if m and len(m.group("ch")) < 10 and all(len(x) < 10 for x in m.group("ranks").split()):
            ranks = [int(x) for x in m.group("ranks").split()]
            n = to_int(m.group("n"), INT32)
            r = rings.add(**base, kind="ring", channel=int(m.group("ch")), n_channels=n, ranks=ranks,
                          truncated=True if m.group("more") else None)
            if n is not None:
                self.attr(li, n_ring_channels=n)
            self.comm_of(li, "nccl_rings", r)
            return True
        m = TREES.match(msg)
        if m and max(len(x) for x in re.findall(r"\d+", m.group(1))) < 10:
            for ch, d0, d1, d2, rank, up in TREE_ITEM.findall(m.group(1)):
                r = rings.add(**base, kind="tree", channel=int(ch), rank=int(rank),
                              up=[int(up)] if up != "-1" else [], down=[int(x) for x in (d0, d1, d2) if x != "-1"])
                self.comm_of(li, "nccl_rings", r)
            return True
        m = RING_GRAPH.match(msg)
        if m and max(len(x) for x in m.groups()) < 10:
            r = rings.add(**base, kind="ring_graph", channel=int(m.group("ch")), rank=int(m.group("rank")),
                          prev_rank=int(m.group("prev")), next_rank=int(m.group("next")))
            self.comm_of(li, "nccl_rings", r)
            return True
        m = TREE_GRAPH.match(msg)
        if m and max(len(x) for x in re.findall(r"\d+", msg)) < 10:
            up = int(m.group("up"))
            r = rings.add(**base, kind="tree_graph", channel=int(m.group("ch")), rank=int(m.group("rank")),
                          up=[up] if up != -1 else [], down=[int(x) for x in m.group("down").split("/") if x != "-1"])
            self.comm_of(li, "nccl_rings", r)
            return True
        m = NVLS_HEAD.match(msg)
        if m and max(len(x) for x in re.findall(r"\d+", msg)) < 10:
            r = rings.add(**base, kind="nvls_head", channel=int(m.group("h")), ranks=[int(x) for x in m.group("ranks").split()])
            self.comm_of(li, "nccl_rings", r)
            return True
        return False

    def connection(self, li: dict, m: re.Match) -> None:
        via = m.group("via")
        parts = via.split("/")
        transport = parts[0].upper() if parts[0] else via
        d = {}
        if via.startswith("direct shared memory"):
            transport = "SHM"
        elif transport == "P2P":
            d["p2p_mode"] = parts[1] if len(parts) > 1 else None
            d["p2p_read"] = "read" in parts[2:]
        elif transport == "NET":
            mm = re.match(r"NET/(?P<name>[^/]+)/(?P<dev>\d+)(?:\((?P<pxn>\d+)\))?(?P<rest>.*)$", via)
            if mm:
                rest = mm.group("rest")
                d.update(net_name=mm.group("name"), net_dev=to_int(mm.group("dev"), INT32),
                         pxn_proxy_rank=to_int(mm.group("pxn"), INT32), gdr="GDRDMA" in rest, shared="Shared" in rest)
        src, dst, direction = to_int(m.group("src"), INT32), to_int(m.group("dst"), INT32), m.group("dir")

        def bracket(b):
            if b is None:
                return None, None
            return (to_int(b, INT32), None) if len(b) <= 3 and b.isdigit() else (None, b)

        sn, sb = bracket(m.group("sb"))
        dn, db = bracket(m.group("db"))
        r = self.t["nccl_channels"].add(
            line_no=li["line_no"], host=li["host"], pid=li["pid"], tid=li["tid"], cuda_dev=li.get("cuda_dev"),
            rank=dst if direction == "receive" else src, kind="channel", channel=int(m.group("ch")),
            conn_index=to_int(m.group("conn"), INT32), src_rank=src, dst_rank=dst, src_nvml_dev=sn, dst_nvml_dev=dn,
            src_bus_id=sb, dst_bus_id=db, direction=direction, transport=transport, via=via, **d)
        self.comm_of(li, "nccl_channels", r)

    def lifecycle(self, li: dict, m: re.Match) -> None:
        kv = _kv(m.group("kv"))
        what = m.group("what")
        bus = kv.get("busId")
        fields = {"rank": to_int(kv.get("rank"), INT32), "nranks": to_int(kv.get("nranks") or kv.get("nRanks"), INT32),
                  "cuda_dev": to_int(kv.get("cudaDev"), INT32), "nvml_dev": to_int(kv.get("nvmlDev"), INT32),
                  "bus_id": bus, "pci_bus_id": pci_from_busid(bus), "comm_id": norm_hash(kv.get("commId")),
                  "init_func": m.group("func") if m.group("func") and m.group("func") != "comm" else None,
                  "parent_comm_ptr": kv.get("parent"), "split_color": to_int(kv.get("color"), INT32),
                  "split_key": to_int((kv.get("key") or "").rstrip("-"), INT32)}
        r = self.comm_row(li, m.group("comm"), fields, what)
        p = self.t["nccl_processes"]
        status = {"Init START": "init_start", "Init COMPLETE": "init_complete", "Destroy COMPLETE": "destroyed",
                  "Abort COMPLETE": "aborted", "Abort START": "aborting", "Revoke COMPLETE": "revoked",
                  "Revoke START": "revoking", "Destroy START": "destroying"}.get(what, what)
        p.set(r, status=status)
        if what == "Init START":
            p.set(r, init_start_line_no=li["line_no"])
        elif what == "Init COMPLETE":
            p.set(r, init_complete_line_no=li["line_no"])
        elif what.endswith("COMPLETE"):
            p.set(r, end_line_no=li["line_no"])
        d = {"what": what, **kv}
        if m.group("res") is not None:
            d["result"] = int(m.group("res"))
        self.event(li, "lifecycle", detail=dumps(d))

    def init_timings(self, li: dict, m: re.Match) -> None:
        total = round(float(m.group("total")) * 1e9)
        rank, nranks = to_int(m.group("rank"), INT32), to_int(m.group("nranks"), INT32)
        th = self.thread(li)
        p = self.t["nccl_processes"]
        r = th.open if th.open is not None else th.last
        if r is None or p.get(r, "rank") != rank or p.get(r, "init_total_ns") is not None:
            r = p.add(host=li["host"], pid=li["pid"], tid=li["tid"], cuda_dev=li.get("cuda_dev"), rank=rank,
                      nranks=nranks, first_line_no=li["line_no"])
            th.last = r
        p.fill(r, init_total_ns=total, nranks=nranks, init_func=m.group("func"))
        d = {"rank": rank, "nranks": nranks, "total_ns": total, **_seconds(m.group("parts"))}
        self.event(li, "init_timings", detail=dumps(d))

    def net_line(self, li: dict, msg: str) -> None:
        nd = self.t["nccl_net_devices"]
        base = dict(line_no=li["line_no"], host=li["host"], pid=li["pid"], tid=li["tid"], cuda_dev=li.get("cuda_dev"))
        m = NET_IB.match(msg)
        if m:
            for d in IB_DEV.finditer(m.group("devs")):
                nd.add(**base, kind="ib", net_name="IB", dev_index=to_int(d.group("i"), INT32), dev_name=d.group("name"),
                       port=to_int(d.group("port"), INT32), link_layer=d.group("ll"),
                       flags=d.group("flags").lstrip("/") or None, relaxed_ordering=m.group("ro") is not None,
                       oob_if=m.group("oobif"), oob_ip=m.group("oobip"))
            self.event(li, "net")
            return
        m = NET_SOCKET.match(msg)
        if m:
            for d in SOCK_DEV.finditer(m.group("devs")):
                nd.add(**base, kind="socket", net_name="Socket", dev_index=to_int(d.group("i"), INT32),
                       dev_name=d.group("name"), ip=d.group("ip"))
            self.event(li, "net")
            return
        m = BOOTSTRAP.match(msg)
        if m:
            nd.add(**base, kind="bootstrap", net_name="Bootstrap", dev_name=m.group("name"), ip=m.group("ip"))
            self.event(li, "net")
            return
        m = OFI_PROVIDER.match(msg)
        if m:
            nd.add(**base, kind="ofi", net_name="OFI", provider=m.group("prov"), n_nics=to_int(m.group("n"), INT32))
            self.event(li, "net")
            return
        m = OFI_VERSION.match(msg)
        if m:
            self.versions.setdefault("aws_ofi_nccl", m.group("v"))
        m = USING_NETWORK.match(msg)
        if m:
            self.proc(li, net_name=m.group("net"))
            self.event(li, "net", detail=dumps({"net": m.group("net")}))
            return
        self.event(li, "net_plugin" if "lugin" in msg or msg.startswith(("Assigned", "Initialized")) else "net")

    # --- PyTorch ProcessGroupNCCL lines -------------------------------------------------------------------
    def torch_line(self, li: dict, text: str) -> bool:
        g = GLOG.search(text)
        wrap = text[:g.start()] if g else ""
        msg = g.group("msg") if g else text
        pg = PG_TAG.search(msg)
        body = msg[pg.end():] if pg and pg.start() <= 2 else msg
        work = WORK.search(body)
        nerr = NCCL_ERROR.search(body)
        kind = None
        if "Watchdog caught collective operation timeout" in body or (work and "timing out" in body):
            kind = "timeout"
        elif "failure detected by watchdog" in body or "detected by watchdog at work sequence id" in body:
            kind = "failure_detected"
        elif "detected by watchdog at work" in body:
            kind = "exception_detected"
        elif HEARTBEAT.search(body):
            kind = "heartbeat_timeout"
        elif nerr:
            kind = "nccl_error"
        elif "ProcessGroupNCCL initialization options:" in body:
            kind = "init_options"
        elif "ProcessGroupNCCL environments:" in body:
            kind = "environments"
        elif g and "ProcessGroupNCCL" in g.group("src"):
            kind = "info"
        if kind is None:
            return False
        wrank = _wrapper_rank(wrap) if wrap else None
        if wrank is None and wrap:
            _, _, wrank = _split_wrapper(wrap)
        row = dict(line_no=li["line_no"], kind=kind, text=text, message=body.strip(),
                   rank=to_int(pg.group("rank"), INT32) if pg else wrank)
        if pg:
            row.update(pg_id=to_int(pg.group("pgid") or pg.group("pgid2")), pg_name=pg.group("guid"),
                       pg_desc=pg.group("desc") or pg.group("desc2"))
        if g:
            row.update(level=g.group("lvl"), log_time=_glog_time(g), src_file=g.group("src"),
                       src_line=to_int(g.group("sline"), INT32))
        if work:
            kv = {k: v.strip() for k, v in WORK_KV.findall(work.group("body"))}
            to_ms = to_int(kv.get("Timeout(ms)"))
            row.update(seq=to_int(kv.get("SeqNum")), op_type=kv.get("OpType"), numel_in=to_int(kv.get("NumelIn")),
                       numel_out=to_int(kv.get("NumelOut")), timeout_ns=to_ms * 1_000_000 if to_ms is not None else None)
        m = RAN_FOR.search(body)
        if m:
            row["ran_for_ns"] = int(m.group(1)) * 1_000_000
        m = AT_WORK.search(body)
        if m and row.get("seq") is None:
            row["seq"] = to_int(m.group(1))
        for what, n in LAST.findall(body):
            row[f"last_{what}"] = to_int(n)
        if nerr:
            row["nccl_version"] = nerr.group("v")
            row["detail"] = dumps({"where": nerr.group("where"), "error": nerr.group("err")})
        if kind in ("init_options", "environments"):
            kv = {}
            for part in body.split(":", 1)[1].split(", "):
                k, _, v = part.partition(": ")
                if k.strip():
                    kv[k.strip()] = v.strip()
            row["detail"] = dumps(kv)
            if kind == "init_options":
                to_ms = to_int(kv.get("TIMEOUT(ms)"))
                row.update(group_size=to_int(kv.get("size"), INT32),
                           timeout_ns=to_ms * 1_000_000 if to_ms is not None else None)
                if row.get("rank") is None:
                    row["rank"] = to_int(kv.get("global rank"), INT32)
            else:
                row["nccl_version"] = kv.get("NCCL version")
        if row.get("nccl_version"):
            self.versions.setdefault("nccl_version_torch", row["nccl_version"])
        self.t["nccl_watchdog"].add(**row)
        self.recognized += 1
        return True

    # --- nccl-tests -------------------------------------------------------------------------------------
    def _run(self, new: bool = False) -> TestRun:
        if self.run is None or (new and self.run.used):
            self.run = TestRun()
            self.runs.append(self.run)
        return self.run

    def tests_line(self, li: dict, s: str) -> bool:
        if not s.startswith("#"):
            return self.tests_row(li, s)
        m = T_DEVICE.match(s)
        if m:
            run = self._run()
            if self.table is not None or any(d["rank"] == int(m.group("rank")) for d in run.devices):
                run = self._run(new=True)
            run.used = True
            run.devices.append({k: m.group(k) for k in ("rank", "group", "pid", "host", "dev", "bus", "name")}
                               | {"rank": int(m.group("rank")), "line_no": li["line_no"]})
            self.event(li, "nccl_tests_device")
            self.recognized += 1
            return True
        m = T_VERSION.match(s)
        if m:
            run = self._run(new=True)
            run.version = m.group("v")
            self.versions.setdefault("nccl_tests_version", m.group("v"))
            self.event(li, "nccl_tests_version", detail=dumps({"version": m.group("v"), "nccl_headers": m.group("h"),
                                                               "nccl_library": m.group("l")}))
            self.table = None
            return True
        m = T_START.match(s)
        if m:
            run = self._run(new=True)
            run.test = m.group("t")
            self.table = None
            self.event(li, "nccl_tests_start", detail=dumps({"test": m.group("t")}))
            return True
        m = T_CONFIG.match(s)
        if m:
            run = self._run(new=True)
            run.used = True
            self.table = None
            self.event(li, "nccl_tests_config", detail=dumps({k: (int(v) if v and v.isdigit() else v)
                                                              for k, v in m.groupdict().items()}))
            self.recognized += 1
            return True
        toks = s.lstrip("#").split()
        if "size" in toks and "count" in toks and ("time" in toks or "cputime" in toks):
            self.open_table(toks)
            self.event(li, "nccl_tests_header")
            self.recognized += 1
            return True
        if T_UNITS.match(s):
            if self.table is None or self.table.rows:
                self.open_table(MODERN_HEADER)
                self.notes.append(f"line {li['line_no']}: nccl-tests units line without its header; assumed the "
                                  "nccl-tests >= 2.13 columns")
            self.event(li, "nccl_tests_header")
            return True
        m = T_OOB.match(s)
        if m:
            self.event(li, "nccl_tests_summary", detail=dumps({"out_of_bounds": int(m.group("n")), "status": m.group("ok")}))
            return True
        m = T_AVG.match(s)
        if m:
            self.event(li, "nccl_tests_summary", detail=dumps({"avg_busbw_gbps": to_float(m.group("bw")),
                                                               "table_index": self.table.index if self.table else None}))
            self.table = None
            return True
        m = T_CONCLUDED.match(s)
        if m:
            self.table = None
            self.event(li, "nccl_tests_concluded", detail=dumps({"test": m.group("t")}))
            return True
        if "out-of-place" in s or "in-place" in s:
            self.event(li, "nccl_tests_header")
            return True
        self.event(li, "nccl_tests_comment")
        return True

    def open_table(self, toks: list[str]) -> None:
        toks = [t for t in toks if t]
        idx = [i for i, t in enumerate(toks) if t in ("time", "cputime")]
        lead = toks[:idx[0]]
        extra = 0
        if toks and toks[-1] == "timestamp":
            toks = toks[:-1]
            extra = 2  # date and time tokens
        bounds = idx + [len(toks)]
        places = ["out_of_place", "in_place"] if len(idx) >= 2 else ["out_of_place"]
        groups = [(places[k] if k < len(places) else f"group{k}", toks[bounds[k]:bounds[k + 1]]) for k in range(len(idx))]
        run = self._run()
        run.used = True
        self.table = Table(len(self.tables), run, lead, groups, extra, toks[idx[0]] == "cputime")
        self.tables.append(self.table)

    def tests_row(self, li: dict, s: str) -> bool:
        tb = self.table
        toks = s.split()
        if not toks or not toks[0].isdigit():
            return False
        n_lead = len(tb.lead)
        sizes = [len(g) for _, g in tb.groups]
        full = n_lead + sum(sizes)
        if len(toks) == full + tb.extra or len(toks) == full:
            groups = tb.groups
            body = toks[n_lead:full]
        elif len(tb.groups) == 2 and len(toks) in (n_lead + sizes[1], n_lead + sizes[1] + tb.extra):
            groups = tb.groups[1:]  # trace replay: only the in-place block
            body = toks[n_lead:n_lead + sizes[1]]
        else:
            return False
        lead = dict(zip(tb.lead, toks[:n_lead]))
        size, count = to_int(lead.get("size")), to_int(lead.get("count"))
        if size is None or count is None:
            return False
        parsed = []
        pos = 0
        for placement, cols in groups:
            vals = dict(zip(cols, body[pos:pos + len(cols)]))
            pos += len(cols)
            t = to_float(vals.get("time", vals.get("cputime")))
            if t is None or not abs(t) < 9e15:  # NaN, inf or beyond int64 ns: not a result row
                return False
            wrong = vals.get("#wrong")
            err = vals.get("error")
            parsed.append(dict(placement=placement, time_ns=round(t * 1000), algbw_gbps=to_float(vals.get("algbw")),
                               busbw_gbps=to_float(vals.get("busbw")),
                               wrong=None if wrong in (None, "N/A") else (round(to_float(wrong)) if to_float(wrong) is not None else None),
                               max_error=None if err in (None, "N/A") else to_float(err)))
        typ = lead.get("type")
        for p in parsed:
            tb.rows.append(self.t["nccl_tests_results"].add(
                line_no=li["line_no"], table_index=tb.index, size_bytes=size, count=count, type=typ,
                dtype_bytes=catalog.dtype_bytes(typ), redop=lead.get("redop"),
                root=to_int(lead.get("root"), INT32), cpu_time=tb.cpu, nccl_tests_version=tb.run.version, **p))
        self.recognized += 1
        return True

    # --- end of file ----------------------------------------------------------------------------------
    def close(self) -> None:
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
        for (host, pid, dev), attrs in self.loose.items():
            for i in range(p.n):
                if p.get(i, "host") == host and p.get(i, "pid") == pid and p.get(i, "cuda_dev") == dev and p.get(i, "comm_ptr") is None:
                    p.fill(i, **attrs)
        # process-level attributes, then the file's bare version line for processes without their own
        bare = {v for v, _ in self.bare_versions}
        bare_cuda = {c for _, c in self.bare_versions if c}
        for i in range(p.n):
            attrs = self.proc_attrs.get((p.get(i, "host"), p.get(i, "pid")), {})
            p.fill(i, **attrs)
            if len(bare) == 1:
                p.fill(i, nccl_version=next(iter(bare)), cuda_version=next(iter(bare_cuda)) if len(bare_cuda) == 1 else None)
        # nccl-tests device lists
        for run in self.runs:
            for d in run.devices:
                pid, dev = to_int(d["pid"]), to_int(d["dev"], INT32)
                bus = d["bus"]
                pci = None
                mb = re.fullmatch(r"([0-9a-fA-F]{4}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})", bus or "")
                if mb:
                    pci = f"{mb.group(1).lower()}:{mb.group(2).lower()}:{mb.group(3).lower()}.0"
                hits = [i for i in range(p.n) if p.get(i, "host") == d["host"] and p.get(i, "pid") == pid
                        and p.get(i, "cuda_dev") == dev]
                if not hits:
                    hits = [p.add(host=d["host"], pid=pid, cuda_dev=dev, rank=d["rank"], first_line_no=d["line_no"])]
                for i in hits:
                    p.fill(i, gpu_name=d["name"] or None, bus_id=f"[{bus}]" if p.get(i, "bus_id") is None else None,
                           pci_bus_id=pci, rank=d["rank"])
        # ring lines shorter than their communicator
        rings = self.t["nccl_rings"]
        nranks_of = {(p.get(i, "host"), p.get(i, "pid"), p.get(i, "comm_ptr")): p.get(i, "nranks") for i in range(p.n)}
        for i in range(rings.n):
            if rings.get(i, "kind") == "ring" and rings.get(i, "truncated") is None:
                n = nranks_of.get((rings.get(i, "host"), rings.get(i, "pid"), rings.get(i, "comm_ptr")))
                if n is not None:
                    rings.set(i, truncated=len(rings.get(i, "ranks")) < n)
        # nccl-tests: ranks, nodes, test name
        res = self.t["nccl_tests_results"]
        for tb in self.tables:
            devs = tb.run.devices
            n_ranks = len({d["rank"] for d in devs}) or None
            n_nodes = len({d["host"] for d in devs}) or None
            test, src = tb.run.test, "stated" if tb.run.test else None
            if test is None:
                test = infer_test([(res.get(i, "size_bytes"), res.get(i, "count"), res.get(i, "dtype_bytes"),
                                    res.get(i, "redop"), res.get(i, "root")) for i in tb.rows], n_ranks,
                                  "redop" in tb.lead, "root" in tb.lead)
                src = "inferred" if test else None
            for i in tb.rows:
                res.set(i, n_ranks=n_ranks, n_nodes=n_nodes, test=test, test_source=src)
        if self.spliced:
            self.notes.append(f"{self.spliced} spliced lines (two writers on one line) split in two")


def _glog_time(m: re.Match) -> str | None:
    date, time = m.group("date"), m.group("time")
    if not time:
        return None
    if date:
        return f"{int(date[:-2]):02d}-{date[-2:]} {time}"
    return time


def infer_test(rows: list[tuple], n: int | None, has_redop: bool, has_root: bool) -> str | None:
    """nccl-tests binary from a table without a 'Collective test starting' line, by the size
    definitions of doc/PERFORMANCE.md (nccl.md 2.2): S = count x typesize for all_reduce, broadcast,
    reduce and sendrecv; S = count x typesize x n for reduce_scatter (and for all_gather/alltoall/
    gather/scatter, which this cannot tell apart: None). rows: (size, count, dtype_bytes, redop, root)."""
    ratios = {size / (count * tb) for size, count, tb, _, _ in rows if count and tb}
    if len(ratios) != 1:
        return None
    ratio = ratios.pop()
    redops = {r for _, _, _, r, _ in rows}
    roots = {r for _, _, _, _, r in rows}
    reduces = bool(redops) and all(r in REDUCTIONS for r in redops)
    if ratio == 1:
        if reduces and has_redop:
            return "reduce_perf" if has_root and all(r is not None and r >= 0 for r in roots) else "all_reduce_perf"
        if has_root and roots and all(r is not None and r >= 0 for r in roots):
            return "broadcast_perf"
        if has_root and roots == {-1} and not has_redop:
            return None
        if redops <= {"none", None} and roots <= {-1, None} and has_redop:
            return "sendrecv_perf"
        return None
    if n and n > 1 and ratio == n and reduces and has_redop:
        return "reduce_scatter_perf"
    return None


def parse_text(text: str, name: str, fmt: str) -> tuple[LogParsed, int]:
    """Parse a text log (NCCL_DEBUG output, nccl-tests output, PyTorch messages, mixed) into the
    LOG_TABLES frames. Lines split on \\n; a trailing \\r is dropped. Never raises on a line: a line
    whose handling fails is kept as an nccl_events row (kind other) and counted in the notes.
    Returns (parsed, number of lines recognized as NCCL, nccl-tests or PyTorch lines)."""
    ps = LogParser(name)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for i, line in enumerate(lines, 1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        try:
            ps.feed(i, line)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError) as e:  # never stop a file
            ps.failed_lines += 1
            ps.t["nccl_events"].add(line_no=i, kind="other", text=line, detail=dumps({"parse_error": f"{type(e).__name__}: {e}"}))
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
    hosts = set(p.column("host")) | set(ps.t["nccl_events"].column("host"))
    sizes = [v for v in p.column("nranks") + ps.t["nccl_coll_calls"].column("nranks")
             + ps.t["nccl_tests_results"].column("n_ranks") + ps.t["nccl_watchdog"].column("group_size") if v]
    return finish(fmt, ps.t, ps.notes, versions, len(lines), hosts, max(sizes) if sizes else None), ps.recognized

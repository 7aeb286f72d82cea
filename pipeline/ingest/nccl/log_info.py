"""NCCL WARN/TRACE/CALL lines and the INFO dispatcher (nccl.md 1.2, 1.4, 1.8): WARN lines (with the
NET/IB completion status) and error chains ('file.cc:123 -> 2'), CALL and TRACE lines; info()
tries the communicator lines (CommLines, log_comm.py), then the channel counts, thresholds,
init/bootstrap timings, versions and driver lines, the network lines (NetLines, log_topo.py),
affinity, NVLS, Connected, environment, RAS, proxy and allocation lines. All land in nccl_events;
attributes also on nccl_processes.
"""

from __future__ import annotations

import re

from .common import IBV_WC_STATUS, INT32, NCCL_RESULTS, dumps, findall_linear, to_float, to_int
from .log_state import LogState

CHANNEL_COUNTS = re.compile(r"(?<!\d)(\d+) (coll|collnet|nvls|p2p) channels( per peer)?")
INIT_TIMINGS = re.compile(
    r"Init timings(?: - (?P<func>\w+))?: rank (?P<rank>\d+) nranks (?P<nranks>\d+) "
    r"total (?P<total>[\d.]+)(?: \((?P<parts>[^)]*)\))?"
)
BOOT_TIMINGS = re.compile(r"Bootstrap timings total (?P<total>[\d.]+)(?: \((?P<parts>[^)]*)\))?")
NAMED_SECONDS = re.compile(r"(\w+) ([\d.]+)")
NAMED_SECONDS_AT_RUN = re.compile(r"(?<!\w)(\w+) ([\d.]+)")  # common.findall_linear
VERSION_INFO = re.compile(r"NCCL version (?P<v>\d+\.\d+\.\d+[^\s+]*)(?:\+cuda(?P<cuda>\S+))?")
DRIVER = re.compile(r"cudaDriverVersion (\d+)")
AFFINITY = re.compile(r"Setting affinity for GPU (?P<gpu>\d+) to (?P<mask>\S+)")
NVLS_SUPPORT = re.compile(r"NVLS multicast support is (?P<not>not )?available on dev (?P<dev>\d+)")
CONNECTED = re.compile(r"Connected all rings(?:, use ring PXN (?P<pxn>\d) GDR (?P<gdr>\d))?")
ENV_SET = re.compile(r"(?P<var>[A-Z][A-Z0-9_]+) set by environment to (?P<val>.*?)\.?\s*$")
ENV_SET2 = re.compile(r"(?P<var>NCCL_[A-Z0-9_]+) set to (?P<val>.*?)\s*$")
CHAIN = re.compile(
    r"(?P<src>[\w./-]+):(?P<line>\d+)(?: \((?P<func>\w+)\))? -> (?P<code>\d+)"
    r"(?: \((?P<errno>[^)]*)\))?(?: \[(?P<thread>[^\]]+)\])?\s*$"
)
IB_COMPLETION = re.compile(
    r"NET/IB ?: Got completion (?:from peer (?P<peer>\S+) )?with (?:status=|error )(?P<status>\d+),? "
    r"opcode[= ](?P<opcode>\d+),? len[= ](?P<len>\d+),? vendor err (?P<verr>\d+)"
    r"(?: \((?P<dir>\w+)\))?(?: localGid ?(?P<lgid>\S+))?(?: remoteGids ?(?P<rgid>\S+))?"
    r"(?: hca (?P<hca>\S+))?"
)
CALL = re.compile(r"(?P<api>\w+)\((?P<args>.*)\)\s*$")
THRESHOLDS = re.compile(r"threadThresholds (?P<t>.+?)\s*$")


def _seconds(parts: str | None) -> dict:
    """'kernels 0.51, bootstrap 0.22' -> {'kernels_ns': 510000000, ...} (seconds in the log)."""
    out = {}
    for k, v in findall_linear(NAMED_SECONDS, NAMED_SECONDS_AT_RUN, parts or ""):
        f = to_float(v)
        if f is not None:
            out[f"{k}_ns"] = round(f * 1e9)
    return out


class WarnLines(LogState):
    """NCCL WARN, error-chain ("file.cc:123 -> 2"), CALL and TRACE lines."""

    def nccl_message(self, li: dict, msg: str) -> None:
        """A recognized NCCL line by its level: WARN, error chain, CALL, TRACE; INFO goes to info()."""
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
            li.update(
                src_file=mc.group("src"),
                src_line=to_int(mc.group("line"), INT32),
                func=mc.group("func") or li.get("func"),
            )
            det = {"result": NCCL_RESULTS.get(code)}
            if mc.group("thread"):
                det["thread"] = mc.group("thread")
            if mc.group("errno"):
                det["errno"] = mc.group("errno")
            self.event(
                li, "error_chain", result_code=to_int(code, INT32), error_chain=th.chain, detail=dumps(det)
            )
            return
        th.chain = None
        if lvl == "CALL":
            mm = CALL.match(msg)
            det = (
                {
                    "api": mm.group("api"),
                    "args": [a.strip() for a in mm.group("args").split(",")] if mm.group("args") else [],
                }
                if mm
                else None
            )
            self.event(li, "call", detail=dumps(det) if det else None)
            return
        if lvl == "TRACE":
            self.event(li, "trace")
            return
        self.info(li, msg)

    def _warn_detail(self, msg: str) -> str | None:
        m = IB_COMPLETION.search(msg)
        if not m:
            return None
        st = int(m.group("status"))
        d = {
            "peer": m.group("peer"),
            "ib_status": st,
            "ib_status_name": "IBV_WC_" + IBV_WC_STATUS.get(st, "UNKNOWN"),
            "opcode": int(m.group("opcode")),
            "len": int(m.group("len")),
            "vendor_err": int(m.group("verr")),
            "direction": m.group("dir"),
            "local_gid": m.group("lgid"),
            "remote_gid": m.group("rgid"),
            "hca": m.group("hca"),
        }
        return dumps({k: v for k, v in d.items() if v is not None})


class InfoLines(LogState):
    """The NCCL INFO dispatcher and the INFO lines about init and the process (module docstring)."""

    def info(self, li: dict, msg: str) -> None:
        """An NCCL INFO line: the first grammar that claims it, else an 'info' event."""
        if (
            self.comm_info(li, msg)
            or self.rate_line(li, msg)
            or self._info_init(li, msg)
            or self._info_misc(li, msg)
        ):
            return
        self.event(li, "info")

    def _info_init(self, li: dict, msg: str) -> bool:
        """Channel counts, thresholds, init/bootstrap timings, version and driver lines."""
        if " channels" in msg:
            counts = CHANNEL_COUNTS.findall(msg)
            if counts:
                d = {}
                for n, what, per_peer in counts:
                    d[f"n_{what}_channels" + ("_per_peer" if per_peer else "")] = to_int(n, INT32)
                self.attr(li, **d)
                self.event(li, "channel_counts", detail=dumps(d))
                return True
        if msg.startswith("threadThresholds"):
            m = THRESHOLDS.match(msg)
            self.attr(li, thread_thresholds=m.group("t") if m else None)
            self.event(li, "thresholds")
            return True
        if msg.startswith("Init timings"):
            m = INIT_TIMINGS.match(msg)
            if m:
                self.init_timings(li, m)
                return True
        if msg.startswith("Bootstrap timings"):
            m = BOOT_TIMINGS.match(msg)
            if m:
                d = {"total_ns": round(float(m.group("total")) * 1e9), **_seconds(m.group("parts"))}
                self.event(li, "bootstrap_timings", detail=dumps(d))
                return True
        if msg.startswith("NCCL version"):
            m = VERSION_INFO.match(msg)
            if m:
                self.proc(li, nccl_version=m.group("v"), cuda_version=m.group("cuda"))
                self.event(
                    li,
                    "version",
                    detail=dumps({"nccl_version": m.group("v"), "cuda_version": m.group("cuda")}),
                )
                return True
        if msg.startswith("cudaDriverVersion"):
            m = DRIVER.match(msg)
            if m:
                self.proc(li, cuda_driver_version=to_int(m.group(1), INT32))
                self.event(li, "init")
                return True
        return False

    def _info_misc(self, li: dict, msg: str) -> bool:
        """Network, affinity, NVLS, Connected, environment, RAS, proxy, allocation and other init lines."""
        if msg.startswith(
            (
                "NET/",
                "Bootstrap",
                "Using network",
                "Using non-device net plugin",
                "Initialized NET plugin",
                "Assigned NET plugin",
                "Assigned GIN",
                "Assigned RMA",
                "Failed to initialize",
            )
        ):
            self.net_line(li, msg)
            return True
        if msg.startswith("Setting affinity"):
            m = AFFINITY.match(msg)
            self.attr(li, cpu_affinity=m.group("mask") if m else None)
            self.event(li, "init")
            return True
        if msg.startswith("NVLS"):
            m = NVLS_SUPPORT.match(msg)
            if m:
                self.attr(li, nvls_multicast=m.group("not") is None)
            self.event(li, "nvls")
            return True
        if msg.startswith("Connected") and not msg.startswith("Connected to proxy"):
            m = CONNECTED.match(msg)
            if m and m.group("pxn") is not None:
                self.attr(li, ring_pxn=m.group("pxn") == "1", ring_gdr=m.group("gdr") == "1")
            self.event(li, "connected")
            return True
        if " set by environment to " in msg or (msg.startswith("NCCL_") and " set to " in msg):
            m = ENV_SET.match(msg) or ENV_SET2.match(msg)
            if m:
                self.event(li, "env", detail=dumps({"var": m.group("var"), "value": m.group("val")}))
                return True
        if msg.startswith("RAS "):
            self.event(li, "ras")
            return True
        if "proxy" in msg.lower() or msg.startswith(
            ("New proxy", "Connected to proxy", "resp.opId", "Received and initiated")
        ):
            self.event(li, "proxy")
            return True
        if (
            msg.startswith(
                (
                    "MMAP ",
                    "Mem ",
                    "MemManager",
                    "Allocated ",
                    "register comm",
                    "Cuda Host Alloc",
                    "Cuda CallocAsync",
                )
            )
            or " Cuda CallocAsync " in msg
            or " Cuda Host Alloc " in msg
            or "memory stack" in msg
        ):
            self.event(li, "alloc")
            return True
        if msg.startswith(
            (
                "Launch mode",
                "Using ",
                "P2P Chunksize",
                "Pattern ",
                "Enabled NCCL",
                "CUDA Dev",
                "DMA-BUF",
                "ncclTopo",
                "comm ",
                "ENV/Plugin",
                "Trees disabled",
            )
        ):
            self.event(li, "init")
            return True
        return False

    def init_timings(self, li: dict, m: re.Match) -> None:
        total = round(float(m.group("total")) * 1e9)
        rank, nranks = to_int(m.group("rank"), INT32), to_int(m.group("nranks"), INT32)
        th = self.thread(li)
        p = self.t["nccl_processes"]
        r = th.open if th.open is not None else th.last
        if r is None or p.get(r, "rank") != rank or p.get(r, "init_total_ns") is not None:
            r = p.add(
                host=li["host"],
                pid=li["pid"],
                tid=li["tid"],
                cuda_dev=li.get("cuda_dev"),
                rank=rank,
                nranks=nranks,
                first_line_no=li["line_no"],
            )
            th.last = r
        p.fill(r, init_total_ns=total, nranks=nranks, init_func=m.group("func"))
        d = {"rank": rank, "nranks": nranks, "total_ns": total, **_seconds(m.group("parts"))}
        self.event(li, "init_timings", detail=dumps(d))

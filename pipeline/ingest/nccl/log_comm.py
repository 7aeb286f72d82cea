"""NCCL INFO lines about collectives and communicators (nccl.md 1.4, 1.7): COLL lines ->
nccl_coll_calls; tuning lines ('Bytes -> Algo'), the Init/Destroy/Abort/Revoke lifecycle lines and
the 'comm 0x.. rank N nRanks M ...' topology lines -> nccl_events, with the communicator's row in
nccl_processes. Channel/Ring/Tree lines found here go to TopoLines (log_topo.py).
"""

from __future__ import annotations

import re

from .common import (
    INT32,
    NCCL_ALGOS,
    NCCL_DTYPES,
    NCCL_PROTOS,
    NCCL_REDOPS,
    TIMES_NRANKS_OPS,
    dumps,
    norm_hash,
    pci_from_busid,
    to_int,
)
from .log_state import LogState

COLL = re.compile(
    r"(?P<op>\w+): opCount (?P<opc>[0-9a-fA-F]+) sendbuff (?P<sb>\S+) recvbuff (?P<rb>\S+) "
    r"count (?P<count>\d+) datatype (?P<dt>\d+) op (?P<redop>\d+) root (?P<root>-?\d+) "
    r"comm (?P<comm>\S+)(?: \[nranks=(?P<nranks>\d+)\])?(?: stream (?P<stream>\S+))?"
)
TUNING = re.compile(
    r"(?:(?P<op>\w+): )?(?P<bytes>\d+) Bytes -> Algo (?P<algo>\w+) proto (?P<proto>\w+)"
    r"(?: channel\{Lo\.\.Hi\}=\{(?P<lo>\d+)\.\.(?P<hi>\d+)\})?(?: time (?P<time>-?[\d.]+))?"
)
LIFECYCLE = re.compile(
    r"(?:\[Rank (?P<rk>\d+)\] )?(?:(?<!\w)(?P<func>\w+) )?comm (?P<comm>\S+) (?P<kv>rank .*?)\s*"
    r"- (?P<what>(?:Init|Destroy|Abort|Revoke) (?:START|COMPLETE))(?:, result (?P<res>-?\d+))?\s*$"
)
TOPOLOGY = re.compile(r"comm (?P<comm>\S+) (?P<kv>rank \d+ nRanks \d+.*?)\s*$")
KV = re.compile(r"(?<!\w)(\w+) (\S+)")

#: COLL ops whose root field is a root rank / whose op field is a reduction (nccl.md 1.7: NCCL
#: prints root 0 and op 0 for the others).
ROOTED_OPS = {"Broadcast", "Reduce", "Gather", "Scatter"}
REDUCING_OPS = {"AllReduce", "Reduce", "ReduceScatter"}


def _kv(text: str) -> dict:
    return {k: v for k, v in KV.findall(text)}


class CommLines(LogState):
    """COLL, tuning, lifecycle and communicator topology lines (see the module docstring)."""

    def comm_info(self, li: dict, msg: str) -> bool:
        """The communicator INFO lines, tried first by info(): True when `msg` was one."""
        if ": opCount " in msg:
            m = COLL.match(msg)
            if m and self.coll(li, m):
                return True
        if " Bytes -> Algo " in msg:
            m = TUNING.match(msg)
            if m:
                algo, proto = m.group("algo"), m.group("proto")
                d = {
                    "op": m.group("op"),
                    "bytes": int(m.group("bytes")),
                    "algo": NCCL_ALGOS.get(int(algo), algo) if algo.isdigit() else algo,
                    "proto": NCCL_PROTOS.get(int(proto), proto) if proto.isdigit() else proto,
                }
                if m.group("lo") is not None:
                    d.update(channel_lo=int(m.group("lo")), channel_hi=int(m.group("hi")))
                if m.group("time") is not None:
                    d["time_us"] = float(m.group("time"))
                self.event(li, "tuning", detail=dumps(d))
                return True
        first = msg.split(" ", 1)[0]
        if first in ("Channel", "Ring", "CollNet", "Trees", "Tree", "NVLS"):
            if self.topo_line(li, msg):
                return True
        if " comm " in f" {msg}" and (
            " - Init" in msg or " - Destroy" in msg or " - Abort" in msg or " - Revoke" in msg
        ):
            m = LIFECYCLE.search(msg)
            if m:
                self.lifecycle(li, m)
                return True
        if msg.startswith("comm ") and " nRanks " in msg:
            m = TOPOLOGY.match(msg)
            if m:
                kv = _kv(m.group("kv"))
                self.comm_row(
                    li,
                    m.group("comm"),
                    {
                        "rank": to_int(kv.get("rank"), INT32),
                        "nranks": to_int(kv.get("nRanks"), INT32),
                        "n_nodes": to_int(kv.get("nNodes"), INT32),
                        "local_ranks": to_int(kv.get("localRanks"), INT32),
                        "local_rank": to_int(kv.get("localRank"), INT32),
                        "mnnvl": None if kv.get("MNNVL") is None else kv.get("MNNVL") != "0",
                    },
                    "topology",
                )
                self.event(li, "topology", detail=dumps(kv))
                return True
        return False

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
            p = self.t["nccl_processes"]
            comm_id, rank = p.get(r, "comm_id"), p.get(r, "rank")
        else:
            comm_id = rank = None
        self.t["nccl_coll_calls"].add(
            line_no=li["line_no"],
            host=li["host"],
            pid=li["pid"],
            tid=li["tid"],
            cuda_dev=li["cuda_dev"],
            op=op,
            op_count=int(opc, 16) if len(opc) <= 15 else None,
            sendbuff=None if sb == "(nil)" else sb,
            recvbuff=None if rb == "(nil)" else rb,
            count=count,
            datatype_id=dt,
            datatype=name,
            dtype_bytes=size,
            bytes=nbytes,
            msg_bytes=msg_bytes,
            redop_id=redop,
            redop=NCCL_REDOPS.get(redop, "user") if redop is not None and op in REDUCING_OPS else None,
            root=root if op in ROOTED_OPS else None,
            peer=root if op in ("Send", "Recv") else None,
            comm_ptr=comm,
            comm_id=comm_id,
            rank=rank,
            nranks=nranks,
            stream=stream,
        )
        return True

    def lifecycle(self, li: dict, m: re.Match) -> None:
        kv = _kv(m.group("kv"))
        what = m.group("what")
        bus = kv.get("busId")
        fields = {
            "rank": to_int(kv.get("rank"), INT32),
            "nranks": to_int(kv.get("nranks") or kv.get("nRanks"), INT32),
            "cuda_dev": to_int(kv.get("cudaDev"), INT32),
            "nvml_dev": to_int(kv.get("nvmlDev"), INT32),
            "bus_id": bus,
            "pci_bus_id": pci_from_busid(bus),
            "comm_id": norm_hash(kv.get("commId")),
            "init_func": m.group("func") if m.group("func") and m.group("func") != "comm" else None,
            "parent_comm_ptr": kv.get("parent"),
            "split_color": to_int(kv.get("color"), INT32),
            "split_key": to_int((kv.get("key") or "").rstrip("-"), INT32),
        }
        r = self.comm_row(li, m.group("comm"), fields, what)
        p = self.t["nccl_processes"]
        status = {
            "Init START": "init_start",
            "Init COMPLETE": "init_complete",
            "Destroy COMPLETE": "destroyed",
            "Abort COMPLETE": "aborted",
            "Abort START": "aborting",
            "Revoke COMPLETE": "revoked",
            "Revoke START": "revoking",
            "Destroy START": "destroying",
        }.get(what, what)
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

"""NCCL INFO lines about topology and transports (nccl.md 1.5, 1.6): channel connections (P2P,
SHM, NET, CollNet) -> nccl_channels; ring orders, trees, ring/tree graphs and NVLS heads ->
nccl_rings (tied to their communicator); NET/IB, NET/Socket, Bootstrap and OFI lines ->
nccl_net_devices.
"""

from __future__ import annotations

import re

from .common import INT32, dumps, to_int
from .log_state import LogState

CONN = re.compile(
    r"(?:Channel|Ring) (?P<ch>\d+)(?:/(?P<conn>\d+))? : (?P<src>\d+)(?:\[(?P<sb>[0-9a-fA-F]+)\])? -> "
    r"(?P<dst>\d+)(?:\[(?P<db>[0-9a-fA-F]+)\])?(?: \[(?P<dir>send|receive)\])? via (?P<via>.+?)\s*$"
)
COLLNET = re.compile(
    r"CollNet (?P<ch>\d+)(?:/(?P<conn>\d+))? : (?P<rank>\d+) \[(?P<dir>send|receive)\] via (?P<via>.+?)\s*$"
)
RING_ORDER = re.compile(
    r"Channel (?P<ch>\d+)(?:/(?P<n>\d+))? :(?P<ranks>(?:\s+\d+)+)(?P<more>\s*\.\.\.)?\s*$"
)
TREES = re.compile(r"Trees((?: \[\d+\] -?\d+/-?\d+/-?\d+->-?\d+->-?\d+)+)\s*$")
TREE_ITEM = re.compile(r"\[(\d+)\] (-?\d+)/(-?\d+)/(-?\d+)->(-?\d+)->(-?\d+)")
RING_GRAPH = re.compile(r"Ring (?P<ch>\d+) : (?P<prev>-?\d+) -> (?P<rank>-?\d+) -> (?P<next>-?\d+)\s*$")
TREE_GRAPH = re.compile(
    r"Tree (?P<ch>\d+) : (?P<up>-?\d+) -> (?P<rank>-?\d+) -> (?P<down>-?\d+(?:/-?\d+)*)\s*$"
)
NVLS_HEAD = re.compile(r"NVLS Head\s+(?P<h>\d+):(?P<ranks>(?:\s+-?\d+)+)\s*$")
NET_IB = re.compile(
    r"NET/IB ?: Using (?P<devs>.*?)(?P<ro> \[RO\])?; OOB (?P<oobif>[^:\s]+):(?P<oobip>\S+?)<\d+>"
)
IB_DEV = re.compile(r"\[(?P<i>\d+)\](?P<name>[^:\s]+):(?P<port>\d+)/(?P<ll>[A-Za-z]+)(?P<flags>(?:/[\w.]+)*)")
NET_SOCKET = re.compile(r"NET/Socket ?: Using (?P<devs>.*)$")
SOCK_DEV = re.compile(r"\[(?P<i>\d+)\](?P<name>[^:\s]+):(?P<ip>\S+?)<\d+>")
BOOTSTRAP = re.compile(r"Bootstrap ?: Using (?P<name>[^:\s]+):(?P<ip>\S+?)<\d+>")
OFI_PROVIDER = re.compile(r"NET/OFI Selected Provider is (?P<prov>\S+) \(found (?P<n>\d+) nics\)")
OFI_VERSION = re.compile(r"NET/OFI (?:Using|Initializing) aws-ofi-nccl (?P<v>\S+)")
USING_NETWORK = re.compile(r"Using network (?P<net>.+?)\s*$")


class TopoLines(LogState):
    """Channel connection and ring/tree lines (see the module docstring)."""

    def topo_line(self, li: dict, msg: str) -> bool:
        rings = self.t["nccl_rings"]
        base = dict(
            line_no=li["line_no"], host=li["host"], pid=li["pid"], tid=li["tid"], cuda_dev=li.get("cuda_dev")
        )
        m = CONN.match(msg)
        if m and len(m.group("ch")) < 10:
            self.connection(li, m)
            return True
        m = COLLNET.match(msg)
        if m and len(m.group("ch")) < 10:
            r = self.t["nccl_channels"].add(
                line_no=li["line_no"],
                host=li["host"],
                pid=li["pid"],
                tid=li["tid"],
                cuda_dev=li.get("cuda_dev"),
                kind="collnet",
                channel=int(m.group("ch")),
                conn_index=to_int(m.group("conn"), INT32),
                rank=to_int(m.group("rank"), INT32),
                direction=m.group("dir"),
                via=m.group("via"),
                transport=m.group("via").split("/", 1)[0].upper(),
            )
            self.comm_of(li, "nccl_channels", r)
            return True
        m = RING_ORDER.match(msg)
        if m and len(m.group("ch")) < 10 and all(len(x) < 10 for x in m.group("ranks").split()):
            ranks = [int(x) for x in m.group("ranks").split()]
            n = to_int(m.group("n"), INT32)
            r = rings.add(
                **base,
                kind="ring",
                channel=int(m.group("ch")),
                n_channels=n,
                ranks=ranks,
                truncated=True if m.group("more") else None,
            )
            if n is not None:
                self.attr(li, n_ring_channels=n)
            self.comm_of(li, "nccl_rings", r)
            return True
        m = TREES.match(msg)
        if m and max(len(x) for x in re.findall(r"\d+", m.group(1))) < 10:
            for ch, d0, d1, d2, rank, up in TREE_ITEM.findall(m.group(1)):
                r = rings.add(
                    **base,
                    kind="tree",
                    channel=int(ch),
                    rank=int(rank),
                    up=[int(up)] if up != "-1" else [],
                    down=[int(x) for x in (d0, d1, d2) if x != "-1"],
                )
                self.comm_of(li, "nccl_rings", r)
            return True
        m = RING_GRAPH.match(msg)
        if m and max(len(x) for x in m.groups()) < 10:
            r = rings.add(
                **base,
                kind="ring_graph",
                channel=int(m.group("ch")),
                rank=int(m.group("rank")),
                prev_rank=int(m.group("prev")),
                next_rank=int(m.group("next")),
            )
            self.comm_of(li, "nccl_rings", r)
            return True
        m = TREE_GRAPH.match(msg)
        if m and max(len(x) for x in re.findall(r"\d+", msg)) < 10:
            up = int(m.group("up"))
            r = rings.add(
                **base,
                kind="tree_graph",
                channel=int(m.group("ch")),
                rank=int(m.group("rank")),
                up=[up] if up != -1 else [],
                down=[int(x) for x in m.group("down").split("/") if x != "-1"],
            )
            self.comm_of(li, "nccl_rings", r)
            return True
        m = NVLS_HEAD.match(msg)
        if m and max(len(x) for x in re.findall(r"\d+", msg)) < 10:
            r = rings.add(
                **base,
                kind="nvls_head",
                channel=int(m.group("h")),
                ranks=[int(x) for x in m.group("ranks").split()],
            )
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
                d.update(
                    net_name=mm.group("name"),
                    net_dev=to_int(mm.group("dev"), INT32),
                    pxn_proxy_rank=to_int(mm.group("pxn"), INT32),
                    gdr="GDRDMA" in rest,
                    shared="Shared" in rest,
                )
        src, dst, direction = to_int(m.group("src"), INT32), to_int(m.group("dst"), INT32), m.group("dir")

        def bracket(b):
            if b is None:
                return None, None
            return (to_int(b, INT32), None) if len(b) <= 3 and b.isdigit() else (None, b)

        sn, sb = bracket(m.group("sb"))
        dn, db = bracket(m.group("db"))
        r = self.t["nccl_channels"].add(
            line_no=li["line_no"],
            host=li["host"],
            pid=li["pid"],
            tid=li["tid"],
            cuda_dev=li.get("cuda_dev"),
            rank=dst if direction == "receive" else src,
            kind="channel",
            channel=int(m.group("ch")),
            conn_index=to_int(m.group("conn"), INT32),
            src_rank=src,
            dst_rank=dst,
            src_nvml_dev=sn,
            dst_nvml_dev=dn,
            src_bus_id=sb,
            dst_bus_id=db,
            direction=direction,
            transport=transport,
            via=via,
            **d,
        )
        self.comm_of(li, "nccl_channels", r)

    def close_rings(self) -> None:
        """At end of file: whether each ring line is shorter than its communicator."""
        p = self.t["nccl_processes"]
        # ring lines shorter than their communicator
        rings = self.t["nccl_rings"]
        nranks_of = {
            (p.get(i, "host"), p.get(i, "pid"), p.get(i, "comm_ptr")): p.get(i, "nranks") for i in range(p.n)
        }
        for i in range(rings.n):
            if rings.get(i, "kind") == "ring" and rings.get(i, "truncated") is None:
                n = nranks_of.get((rings.get(i, "host"), rings.get(i, "pid"), rings.get(i, "comm_ptr")))
                if n is not None:
                    rings.set(i, truncated=len(rings.get(i, "ranks")) < n)


class NetLines(LogState):
    """NET/, Bootstrap and 'Using network' lines (see the module docstring)."""

    def net_line(self, li: dict, msg: str) -> None:
        if self.ib_rate_line(li, msg):
            return
        nd = self.t["nccl_net_devices"]
        base = dict(
            line_no=li["line_no"], host=li["host"], pid=li["pid"], tid=li["tid"], cuda_dev=li.get("cuda_dev")
        )
        m = NET_IB.match(msg)
        if m:
            for d in IB_DEV.finditer(m.group("devs")):
                nd.add(
                    **base,
                    kind="ib",
                    net_name="IB",
                    dev_index=to_int(d.group("i"), INT32),
                    dev_name=d.group("name"),
                    port=to_int(d.group("port"), INT32),
                    link_layer=d.group("ll"),
                    flags=d.group("flags").lstrip("/") or None,
                    relaxed_ordering=m.group("ro") is not None,
                    oob_if=m.group("oobif"),
                    oob_ip=m.group("oobip"),
                )
                self.nic_using(
                    li,
                    to_int(d.group("i"), INT32),
                    d.group("name"),
                    to_int(d.group("port"), INT32),
                    d.group("ll"),
                )
            self.event(li, "net")
            return
        m = NET_SOCKET.match(msg)
        if m:
            for d in SOCK_DEV.finditer(m.group("devs")):
                nd.add(
                    **base,
                    kind="socket",
                    net_name="Socket",
                    dev_index=to_int(d.group("i"), INT32),
                    dev_name=d.group("name"),
                    ip=d.group("ip"),
                )
            self.event(li, "net")
            return
        m = BOOTSTRAP.match(msg)
        if m:
            nd.add(**base, kind="bootstrap", net_name="Bootstrap", dev_name=m.group("name"), ip=m.group("ip"))
            self.event(li, "net")
            return
        m = OFI_PROVIDER.match(msg)
        if m:
            nd.add(
                **base,
                kind="ofi",
                net_name="OFI",
                provider=m.group("prov"),
                n_nics=to_int(m.group("n"), INT32),
            )
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
        self.event(
            li, "net_plugin" if "lugin" in msg or msg.startswith(("Assigned", "Initialized")) else "net"
        )

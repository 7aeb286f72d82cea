"""Link rates as NCCL states them (../shared/reference/nccl.md section 1.11) -> nccl_link_rates,
one row per NIC, link, path, system line or search result, each with its source line. The line
itself also goes to its line table (nccl_events: kind 'graph' for GRAPH lines, 'net' for NET
lines, 'topo_xml' for a topology dump), as every line does.

Forms, by the NCCL source that prints them (NVIDIA/nccl tags):
- system (GRAPH, src/graph/topo.cc ncclTopoPrint): `=== System : maxWidth W ===` (2.6-2.7),
  `maxWidth W totalWidth T` (2.8-2.13), `maxBw B totalBw T` (2.14+); GB/s.
- graph_link / graph_net (ncclTopoPrintRec): `+ TYPE[bw] - NODE/id`, bw in GB/s; a NET node
  carries `(asic/port/bw)` up to 2.23 (`NET/1`, `NET/0-1`) and `(collSupport/asic/port/bw)` from
  2.24. The link's source is the node printed at the column where the `+` stands.
- graph_path (src/graph/paths.cc printNodePaths): `GPU/id :... NET/id (hops/bw/type) ...`: the
  path from a GPU to each NIC (other targets are left out), bw in GB/s.
- pattern (src/graph/search.cc ncclTopoPrintGraph): `Pattern P, crossNic X, nChannels N, bw
  intra/inter, type T/T, sameChannels S`; bw in GB/s per channel.
- ib_speed (NET, src/transport/net_ib: INFO from 2.27, TRACE builds 2.20-2.26) `NET/IB: [d]
  name:uverbs:port/LL provider=P speed=S ...`; ib_virtual (2.24+) `NET/IB : Made virtual device
  [d] name=N speed=S ...`; ib_speed_change `NET/IB : name:port speed change detected: a -> b Mbps`;
  speed in Mb/s.
- ib_using (`NET/IB : Using [0]mlx5_0:1/IB ...`): name, port and link layer, no speed (written by
  log_topo.NetLines through nic_using()).
- xml_net / xml_pci (an NCCL_TOPO_DUMP_FILE or NCCL_TOPO_FILE printed into the log): `<net name=
  dev= speed= port= guid= ...>` (Mb/s; src/graph/topo.cc: bw = speed / 8000 GB/s) and `<pci busid=
  link_speed="32.0 GT/s PCIe" link_width="16">` (NCCL's bw = width x kvDictPciGen[speed] / 80 GB/s).
Units: speed_gbit is 1e9 bits/s, bw_gbps 1e9 bytes/s; NCCL's GB/s and Mb/s convert as
speed_gbit = 8 x bw_gbps = Mb/s / 1000. A GRAPH NET node's id is NCCL's net device index, so
close_rates() names it from the same process's NET/IB Using line.
"""

from __future__ import annotations

import re

from .common import INT32, held_bytes, to_int
from .log_state import LogState

SYSTEM = re.compile(
    r"=== System : max(?P<w>Bw|Width) (?P<max>[\d.]+)(?: total(?:Bw|Width) (?P<total>[\d.]+))? ===\s*$"
)
NODE = r"(?P<node>[A-Z][A-Z0-9]*)/(?P<id>[0-9A-Fa-f]+(?:-[0-9A-Fa-f]+)?)"
LINK = re.compile(
    r"(?P<indent> *)\+ (?P<lt>[A-Z][A-Z0-9]*)\[(?P<bw>[\d.]+)\] - " + NODE + r"(?: \((?P<args>[^)]*)\))?"
)
HEADER = re.compile(r"(?P<indent> *)" + NODE + r"(?: \((?P<args>[^)]*)\))?(?: \[MLOPart \d+\])?\s*$")
PATHS = re.compile(r"(?:Paths from )?(?P<src>[A-Z][A-Z0-9]*/[0-9A-Fa-f]+(?:-[0-9A-Fa-f]+)?) :(?P<rest>.*)$")
PATH_ITEM = re.compile(NODE + r" \((?P<hops>\d+)/(?P<bw>[\d.]+)/(?P<type>\w+)\)")
PATTERN = re.compile(
    r"Pattern (?P<p>\d+), crossNic (?P<x>\d+), nChannels (?P<n>\d+), bw (?P<intra>[\d.]+)/(?P<inter>[\d.]+)"
    r", type (?P<ti>\w+)/(?P<te>\w+)"
)
IB_SPEED = re.compile(
    r"NET/IB ?: ?\[(?P<i>\d+)\] (?P<name>[^:\s]+):(?:[^:\s]+:)?(?P<port>\d+)/(?P<ll>\w+)(?: provider=\S+)? "
    r"speed=(?P<speed>-?\d+)"
)
IB_VIRTUAL = re.compile(
    r"NET/IB ?: Made virtual device \[(?P<i>\d+)\] name=(?P<name>\S+) speed=(?P<speed>-?\d+)"
)
IB_CHANGE = re.compile(
    r"NET/IB ?: (?P<name>[^:\s]+):(?P<port>\d+) speed change detected: "
    r"(?P<old>-?\d+) -> (?P<speed>-?\d+) Mbps"
)
XML_TAG = re.compile(r"^\s*<(?P<tag>net|pci)\s")
XML_ATTR = re.compile(r'(\w+)="([^"]*)"')
# NCCL src/graph/topo.cc kvDictPciGen: per-lane rate in 100 Mb/s; bw = width x value / 80 GB/s
PCI_GEN = {
    "2.5 GT/s": 15, "5 GT/s": 30, "8 GT/s": 60, "16 GT/s": 120, "32 GT/s": 240,
    "2.5 GT/s PCIe": 15, "5.0 GT/s PCIe": 30, "8.0 GT/s PCIe": 60, "16.0 GT/s PCIe": 120,
    "32.0 GT/s PCIe": 240, "64.0 GT/s PCIe": 480,
}  # fmt: skip


def _f(s: str | None) -> float | None:
    try:
        v = float(s) if s is not None else None
    except ValueError:
        return None
    return v if v is not None and v == v and abs(v) < 1e15 else None


def _hex(node_id: str) -> int | None:
    """NCCL's net device index from a GRAPH node id: `1` (up to 2.22, %lX) or `0-1` (2.23+, the
    local id after the system id, %lx)."""
    try:
        v = int(node_id.split("-")[-1], 16)
    except ValueError:
        return None
    return v if v <= INT32[1] else None


def _mbps(speed: str) -> tuple[float | None, float | None]:
    """(Gb/s, GB/s) of a speed in Mb/s; None for NCCL's 'unknown' (<= 0)."""
    v = _f(speed)
    if v is None or v <= 0:
        return None, None
    return v / 1000, v / 8000


class RateLines(LogState):
    """GRAPH, NET and topology-dump lines that state link rates (module doc)."""

    def _rate(self, li: dict, **kw) -> None:
        row = dict(
            line_no=li["line_no"],
            host=li.get("host"),
            pid=li.get("pid"),
            tid=li.get("tid"),
            cuda_dev=li.get("cuda_dev"),
            text=li["text"],
        )
        row.update({k: v for k, v in kw.items() if v is not None})
        self.t["nccl_link_rates"].add(**row)

    def _graph_col(self, key: tuple, node: str) -> None:
        """Remember the graph node printed at a column of a thread's GRAPH lines (charged to the
        held bytes: a new key, and the node's name each time)."""
        cols = getattr(self, "graph_cols", {})
        if key not in cols:
            self.hold("graph columns", *key)
        self.held.charge(held_bytes(node), "graph columns")
        cols[key] = node
        self.graph_cols = cols

    def rate_line(self, li: dict, msg: str) -> bool:
        """An NCCL INFO message that states a rate: its row(s) and its nccl_events row; False when
        it is none of the forms."""
        m = SYSTEM.search(msg)
        if m:
            self._rate(
                li,
                form="system",
                kind="system",
                bw_gbps=_f(m.group("max")),
                total_bw_gbps=_f(m.group("total")),
            )
            self.graph_cols = {}
            self.event(li, "graph")
            return True
        m = LINK.match(msg)
        if m:
            col = len(m.group("indent"))
            cols = getattr(self, "graph_cols", {})
            src = cols.get((li.get("host"), li.get("pid"), li.get("tid"), col))
            dst = f"{m.group('node')}/{m.group('id')}"
            self._graph_col(
                (li.get("host"), li.get("pid"), li.get("tid"), m.end("lt") + len(m.group("bw")) + 5), dst
            )
            bw = _f(m.group("bw"))
            args = (m.group("args") or "").split("/")
            if m.group("node") == "NET" and len(args) in (3, 4):
                net_bw = _f(args[-1])
                self._rate(
                    li,
                    form="graph_net",
                    kind="nic",
                    src_node=src,
                    dst_node=dst,
                    dev_index=_hex(m.group("id")),
                    guid=args[-3],
                    port=to_int(args[-2], INT32),
                    link_type=m.group("lt"),
                    bw_gbps=net_bw if net_bw is not None else bw,
                    speed_gbit=8 * (net_bw if net_bw is not None else bw)
                    if (net_bw or bw) is not None
                    else None,
                )
            else:
                self._rate(
                    li,
                    form="graph_link",
                    kind="link",
                    src_node=src,
                    dst_node=dst,
                    link_type=m.group("lt"),
                    bw_gbps=bw,
                    speed_gbit=8 * bw if bw is not None else None,
                )
            self.event(li, "graph")
            return True
        m = PATTERN.match(msg)
        if m:
            self._rate(
                li,
                form="pattern",
                kind="pattern",
                pattern=to_int(m.group("p"), INT32),
                cross_nic=to_int(m.group("x"), INT32),
                n_channels=to_int(m.group("n"), INT32),
                bw_gbps=_f(m.group("intra")),
                bw_inter_gbps=_f(m.group("inter")),
                link_type=f"{m.group('ti')}/{m.group('te')}",
            )
            self.event(li, "graph")
            return True
        m = PATHS.match(msg)
        if m and m.group("src").startswith("GPU/"):
            for it in PATH_ITEM.finditer(m.group("rest")):
                if it.group("node") != "NET":
                    continue
                bw = _f(it.group("bw"))
                self._rate(
                    li,
                    form="graph_path",
                    kind="path",
                    src_node=m.group("src"),
                    dst_node=f"NET/{it.group('id')}",
                    dev_index=_hex(it.group("id")),
                    hops=to_int(it.group("hops"), INT32),
                    bw_gbps=bw,
                    speed_gbit=8 * bw if bw is not None else None,
                    link_type=it.group("type"),
                )
            self.event(li, "graph")
            return True
        m = HEADER.match(msg)
        if m and m.group("node") in ("CPU", "GPU", "NIC", "PCI", "NVS", "NET", "DEV"):
            self._graph_col(
                (li.get("host"), li.get("pid"), li.get("tid"), len(m.group("indent"))),
                f"{m.group('node')}/{m.group('id')}",
            )
            self.event(li, "graph")
            return True
        return False

    def ib_rate_line(self, li: dict, msg: str) -> bool:
        """NET/IB lines with a speed (Mb/s): ib_speed, ib_virtual, ib_speed_change."""
        for form, rx in (("ib_speed", IB_SPEED), ("ib_virtual", IB_VIRTUAL), ("ib_speed_change", IB_CHANGE)):
            m = rx.search(msg)
            if m:
                d = m.groupdict()
                self._nic(li, form, d.get("i"), d["name"], d.get("port"), d["speed"], link_layer=d.get("ll"))
                self.event(li, "net")
                return True
        return False

    def _nic(self, li: dict, form: str, index, name, port, mbps: str, **kw) -> None:
        """A NIC row with its speed in Mb/s as NCCL prints it (index and port as text)."""
        gbit, gbps = _mbps(mbps)
        self._rate(
            li,
            form=form,
            kind="nic",
            dev_index=to_int(index, INT32),
            dev_name=name,
            port=to_int(port, INT32),
            speed_gbit=gbit,
            bw_gbps=gbps,
            **kw,
        )

    def nic_using(self, li: dict, index, name, port, link_layer) -> None:
        """A NIC of a `NET/IB : Using` line: no speed, its name, port and link layer."""
        self._rate(
            li, form="ib_using", kind="nic", dev_index=index, dev_name=name, port=port, link_layer=link_layer
        )

    def xml_line(self, li: dict, text: str) -> bool:
        """A <net> or <pci> element of a topology dump printed into the log."""
        m = XML_TAG.match(text)
        if not m:
            return False
        a = dict(XML_ATTR.findall(text))
        if m.group("tag") == "net" and "speed" in a:
            self._nic(
                li, "xml_net", a.get("dev"), a.get("name"), a.get("port"), a["speed"], guid=a.get("guid")
            )
        elif m.group("tag") == "pci" and "link_speed" in a:
            width = to_int(a.get("link_width"), INT32)
            gen = PCI_GEN.get(a["link_speed"])
            bw = (width or 16) * gen / 80 if gen else None  # NCCL: a width of 0 is read as 16
            self._rate(
                li,
                form="xml_pci",
                kind="link",
                dev_name=a.get("busid"),
                link_type="PCI",
                pci_link_speed=a["link_speed"],
                pci_link_width=width,
                bw_gbps=bw,
                speed_gbit=8 * bw if bw is not None else None,
            )
        else:
            return False
        self.event(li, "topo_xml")
        return True

    def close_rates(self) -> None:
        """Name the GRAPH NET nodes and paths (dev_index) from the same process's NET/IB devices."""
        rates = self.t["nccl_link_rates"]
        nd = self.t["nccl_net_devices"]
        names = {}
        for i in range(nd.n):
            if nd.get(i, "kind") == "ib" and nd.get(i, "dev_index") is not None:
                names[(nd.get(i, "host"), nd.get(i, "pid"), nd.get(i, "dev_index"))] = (
                    nd.get(i, "dev_name"),
                    nd.get(i, "link_layer"),
                )
        for i in range(rates.n):
            if rates.get(i, "form") in ("graph_net", "graph_path") and rates.get(i, "dev_name") is None:
                got = names.get((rates.get(i, "host"), rates.get(i, "pid"), rates.get(i, "dev_index")))
                if got:
                    rates.set(i, dev_name=got[0], link_layer=rates.get(i, "link_layer") or got[1])

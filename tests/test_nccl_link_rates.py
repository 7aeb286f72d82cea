"""nccl_link_rates (pipeline/ingest/nccl/log_rates.py): every form NCCL states a rate in
(../shared/reference/nccl.md section 1.11). Forms found in the corpus are checked on its lines,
cited by number; the others on lines written from the format string of the NCCL source that
prints them (NVIDIA/nccl, file and tag cited), so the parser follows the grammars, not two files."""

from __future__ import annotations

import polars as pl
import pytest
from conftest import corpus

from pipeline import schema as sch
from pipeline.ingest import nccl

ISSUE_350 = "nccl-tests-issue-350-a100-cx5-200g-topo-graph-net-speed-and-gather-perf-same-run.log"
ISSUE_256 = "nccl-tests-issue-256-h200-cx7-400g-topo-dump-xml-speed-and-allreduce-baremetal-vs-vm.log"
P = "node01:101855:101885 [0] NCCL INFO "


def _rates(name: str) -> pl.DataFrame:
    data = corpus("nccl", name).read_bytes()
    t = nccl.parse(data, name).tables["nccl_link_rates"]
    sch.conform("nccl_link_rates", t.with_columns(run_id=pl.lit("r"), source_id=pl.lit("s")).to_arrow())
    return t


def _of(text: str) -> list[dict]:
    p = nccl.parse(text.encode(), "x.log")
    return p.tables["nccl_link_rates"].to_dicts() if "nccl_link_rates" in p.tables else []


def _line(name: str, n: int) -> str:
    return corpus("nccl", name).read_text().split("\n")[n - 1]


def test_issue_350_graph_print_system_paths_and_patterns():
    t = _rates(ISSUE_350)
    rows = {(r["line_no"], r["form"], r["dst_node"] or r["dev_name"]): r for r in t.to_dicts()}
    # line 24: "=== System : maxBw 24.0 totalBw 24.0 ==="
    s = rows[(24, "system", None)]
    assert (s["bw_gbps"], s["total_bw_gbps"]) == (24.0, 24.0)
    # line 29: "+ NET[25.0] - NET/1 (7a852d0003f6ceb8/1/25.000000)", under line 28's NIC/D1000;
    # NET/1 is net device 1 = mlx5_2 on the IB link layer (line 14: "Using [0]mlx5_0:1/RoCE [1]mlx5_2:1/IB")
    n = rows[(29, "graph_net", "NET/1")]
    assert (n["src_node"], n["dev_index"], n["dev_name"], n["link_layer"], n["port"]) == (
        "NIC/D1000",
        1,
        "mlx5_2",
        "IB",
        1,
    )
    assert (n["bw_gbps"], n["speed_gbit"], n["guid"]) == (25.0, 200.0, "7a852d0003f6ceb8")  # 200 Gb/s HDR
    # line 33: "+ NET[3.1] - NET/0 (b8e2ce0003f6ceb8/1/3.125000)": the 25 Gb/s RoCE port, mlx5_0
    r = rows[(33, "graph_net", "NET/0")]
    assert (r["bw_gbps"], r["speed_gbit"], r["dev_name"], r["link_layer"]) == (3.125, 25.0, "mlx5_0", "RoCE")
    # lines 27-28, 32: "+ PCI[24.0] - GPU/81000 (0)", "+ PCI[24.0] - NIC/D1000", "+ PCI[6.0] - NIC/21000"
    assert (
        rows[(27, "graph_link", "GPU/81000")]["src_node"],
        rows[(27, "graph_link", "GPU/81000")]["bw_gbps"],
    ) == (
        "CPU/1",
        24.0,
    )
    assert rows[(32, "graph_link", "NIC/21000")]["bw_gbps"] == 6.0 and rows[(32, "graph_link", "NIC/21000")][
        "src_node"
    ] == ("CPU/0")
    # line 35: "GPU/81000 :... NET/1 (3/24.000000/PHB) NET/0 (4/3.125000/SYS)": the GPU's paths to the NICs
    p1, p0 = rows[(35, "graph_path", "NET/1")], rows[(35, "graph_path", "NET/0")]
    assert (p1["hops"], p1["bw_gbps"], p1["link_type"], p1["dev_name"]) == (3, 24.0, "PHB", "mlx5_2")
    assert (p0["hops"], p0["bw_gbps"], p0["link_type"], p0["dev_name"]) == (4, 3.125, "SYS", "mlx5_0")
    # line 38: "Pattern 4, crossNic 0, nChannels 1, bw 24.000000/24.000000, type LOC/PHB, sameChannels 1"
    pt = rows[(38, "pattern", None)]
    assert (pt["pattern"], pt["cross_nic"], pt["n_channels"], pt["bw_gbps"], pt["bw_inter_gbps"]) == (
        4,
        0,
        1,
        24.0,
        24.0,
    )
    assert pt["link_type"] == "LOC/PHB"
    # line 14: NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_2:1/IB [RO]: NICs without a speed
    using = t.filter(pl.col("form") == "ib_using").sort("dev_index")
    assert using.select("dev_index", "dev_name", "port", "link_layer").rows() == [
        (0, "mlx5_0", 1, "RoCE"),
        (1, "mlx5_2", 1, "IB"),
    ]
    assert using["speed_gbit"].null_count() == 2
    # every row keeps its source line
    assert all(r["text"] == _line(ISSUE_350, r["line_no"]) for r in t.to_dicts())


def test_issue_256_topology_dump_xml():
    t = _rates(ISSUE_256)
    nets = t.filter(pl.col("form") == "xml_net").sort("line_no")
    # lines 80, 87, 102: <net name="mlx5_0" dev="0" speed="400000" port="1" ... guid="0xa87cb10003e1a258" ...>
    assert nets.select("line_no", "dev_name", "dev_index", "port").rows() == [
        (80, "mlx5_0", 0, 1),
        (87, "mlx5_1", 1, 1),
        (102, "mlx5_2", 2, 1),
    ]
    assert set(nets["speed_gbit"]) == {400.0} and set(nets["bw_gbps"]) == {50.0}  # 400000 Mb/s / 8000
    assert nets["guid"][0] == "0xa87cb10003e1a258"
    # line 69: <pci busid="0000:16:00.0" ... link_speed="32.0 GT/s PCIe" link_width="16">: NCCL's bw
    # = 16 lanes x 240 (kvDictPciGen, 100 Mb/s units) / 80 = 48 GB/s
    pci = t.filter((pl.col("form") == "xml_pci") & (pl.col("line_no") == 69)).to_dicts()[0]
    assert (pci["dev_name"], pci["pci_link_speed"], pci["pci_link_width"], pci["bw_gbps"]) == (
        "0000:16:00.0",
        "32.0 GT/s PCIe",
        16,
        48.0,
    )
    ev = nccl.parse(corpus("nccl", ISSUE_256).read_bytes(), ISSUE_256).tables["nccl_events"]
    assert ev.filter(pl.col("line_no") == 80)["kind"].to_list() == ["topo_xml"]


@pytest.mark.parametrize(
    "line, want",
    [
        # NCCL 2.7 src/graph/topo.cc ncclTopoPrint: "=== System : maxWidth %2.1f ==="
        (P + "=== System : maxWidth 24.0 ===", {"form": "system", "bw_gbps": 24.0, "total_bw_gbps": None}),
        # NCCL 2.8-2.13: "=== System : maxWidth %2.1f totalWidth %2.1f ==="
        (
            P + "=== System : maxWidth 12.0 totalWidth 24.0 ===",
            {"form": "system", "bw_gbps": 12.0, "total_bw_gbps": 24.0},
        ),
        # NCCL 2.23 ncclTopoPrintRec: "%s/%lx-%lx (%lx/%d/%f)" for a NET node
        (
            P + "               + NET[50.0] - NET/0-1 (a87cb10003e1a258/1/50.000000)",
            {"form": "graph_net", "dev_index": 1, "port": 1, "bw_gbps": 50.0, "speed_gbit": 400.0},
        ),
        # NCCL 2.24+: "%s/%lx-%lx (%d/%lx/%d/%f)" (collSupport first)
        (
            P + "               + NET[50.0] - NET/0-c (1/a87cb10003e1a258/1/50.000000)",
            {"form": "graph_net", "dev_index": 12, "guid": "a87cb10003e1a258", "port": 1, "bw_gbps": 50.0},
        ),
        # NCCL 2.27+ src/transport/net_ib: "NET/IB: [%d] %s:%s:%d/%s provider=%s speed=%d context=%p ..."
        (
            P + "NET/IB: [2] mlx5_2:uverbs2:1/RoCE provider=Mlx5 speed=400000 context=0x7f00 pciPath=/x ar=0",
            {
                "form": "ib_speed",
                "dev_index": 2,
                "dev_name": "mlx5_2",
                "port": 1,
                "link_layer": "RoCE",
                "speed_gbit": 400.0,
                "bw_gbps": 50.0,
            },
        ),
        # NCCL 2.24+: "NET/IB : Made virtual device [%d] name=%s speed=%d ndevs=%d"
        (
            P + "NET/IB : Made virtual device [0] name=mlx5_0 speed=200000 ndevs=1",
            {
                "form": "ib_virtual",
                "dev_index": 0,
                "dev_name": "mlx5_0",
                "speed_gbit": 200.0,
                "bw_gbps": 25.0,
            },
        ),
        # src/transport/net_ib/common.cc: "NET/IB : %s:%d speed change detected: %d -> %s Mbps"
        (
            P + "NET/IB : mlx5_1:1 speed change detected: 400000 -> 200000 Mbps",
            {"form": "ib_speed_change", "dev_name": "mlx5_1", "port": 1, "speed_gbit": 200.0},
        ),
        # NCCL HEAD src/graph/paths.cc: "%s/%lx-%lx (%d/%.1f/%s) " after "GPU/... :"
        (
            P + "GPU/0-1b000 :GPU/0-1b000 (0/5000.0/LOC) NET/0-0 (3/50.0/PXB) NET/0-1 (5/24.0/SYS) ",
            {"form": "graph_path", "dst_node": "NET/0-0", "hops": 3, "bw_gbps": 50.0, "link_type": "PXB"},
        ),
    ],
)
def test_forms_from_the_nccl_sources(line, want):
    rows = _of(line)
    assert rows, line
    got = rows[0]
    assert {k: got[k] for k in want} == want


def test_unknown_speed_and_plain_info_logs_state_no_rate():
    """A NIC whose speed NCCL reads as unknown (speed <= 0: topo.cc then assumes 10000 Mb/s) gets no
    rate rather than a guess, and a plain NCCL_DEBUG=INFO log (no GRAPH or NET subsystem: the
    aws-eks corpus log) has no rate row."""
    got = _of(P + "NET/IB : Made virtual device [0] name=mlx5_0 speed=-1 ndevs=1")
    assert got[0]["speed_gbit"] is None and got[0]["bw_gbps"] is None
    name = "aws-eks-efa-t4-2rank-nccl2.12.7-init-and-ncclTests.log"
    assert "nccl_link_rates" not in nccl.parse(corpus("nccl", name).read_bytes(), name).tables

"""Every NCCL corpus file (../shared/corpus/nccl, PROVENANCE.md) is sniffed as the right format,
parses, fills the tables it should, accounts for every line, and writes into a lake that conforms
to schema v3."""

from __future__ import annotations

import hashlib
import time

import polars as pl
import pytest
from conftest import CORPUS, corpus

from pipeline import __version__
from pipeline import schema as sch
from pipeline.ingest import nccl
from pipeline.lake import Lake

# file -> (format sniff must return, tables that must have rows). Read from each file's content:
# e.g. the aws-eks log has NCCL init lines (processes, net devices, channels, rings), a results
# table and a bare version line; 1405 has only WARN and error-chain lines (events).
EXPECTED = {
    "aws-eks-efa-t4-2rank-nccl2.12.7-init-and-ncclTests.log": (
        "nccl_tests",
        {
            "nccl_processes",
            "nccl_net_devices",
            "nccl_channels",
            "nccl_rings",
            "nccl_events",
            "nccl_tests_results",
        },
    ),
    "basicsr-issue-737-torch-watchdog-timeout-allreduce.log": ("torch_watchdog", {"nccl_watchdog"}),
    "llamafactory-issue-6269-torch-watchdog-timeout-reduce-scatter-base.log": (
        "torch_watchdog",
        {"nccl_watchdog"},
    ),
    "nccl-issue-1189-channels-net-ib-gdrdma-and-p2p-cumem-2node.log": (
        "nccl_log",
        {"nccl_processes", "nccl_channels"},
    ),
    "nccl-issue-1193-coll-allreduce-ray-prefix-128rank.log": (
        "nccl_log",
        {"nccl_processes", "nccl_coll_calls"},
    ),
    "nccl-issue-1405-warn-net-ib-completion-status12-error-chain.log": (
        "nccl_log",
        {"nccl_processes", "nccl_events"},
    ),
    "nccl-issue-1412-init-complete-and-init-timings-16rank.log": (
        "nccl_log",
        {"nccl_processes", "nccl_events"},
    ),
    "nccl-issue-1453-init-h100-3node-nvls-heads-rings-truncated.log": (
        "nccl_log",
        {"nccl_processes", "nccl_rings", "nccl_events"},
    ),
    "nccl-issue-1657-torch-processgroupnccl-init-env-and-nccl-bootstrap.log": (
        "nccl_log",
        {"nccl_processes", "nccl_net_devices", "nccl_events", "nccl_watchdog"},
    ),
    "nccl-issue-1765-profiler-example-plugin-trace-truncated.json.txt": (
        "nccl_profiler",
        {"nccl_profiler_events"},
    ),
    "nccl-issue-1814-init-complete-nvls-64rank-then-ib-status12.log": (
        "nccl_log",
        {"nccl_processes", "nccl_events"},
    ),
    "nccl-issue-1911-ncclras-text-mismatch-32gpu.txt": ("nccl_ras", {"nccl_ras"}),
    "nccl-issue-584-coll-send-recv-nil-buffers.log": (
        "nccl_log",
        {"nccl_processes", "nccl_coll_calls", "nccl_events"},
    ),
    "nccl-issue-892-single-node-h800-p2p-direct-pointer-channels.log": (
        "nccl_log",
        {"nccl_processes", "nccl_channels", "nccl_events"},
    ),
    "nccl-tests-issue-228-net-ib-using-hca-env-echo.log": (
        "nccl_log",
        {"nccl_processes", "nccl_net_devices", "nccl_link_rates", "nccl_events"},
    ),
    "nccl-tests-issue-256-h200-cx7-400g-topo-dump-xml-speed-and-allreduce-baremetal-vs-vm.log": (
        "nccl_tests",
        {"nccl_processes", "nccl_link_rates", "nccl_events", "nccl_tests_results"},
    ),
    "nccl-tests-issue-284-socket-transport-info-interleaved-in-table.log": (
        "nccl_tests",
        {"nccl_processes", "nccl_channels", "nccl_events"},
    ),
    "nccl-tests-issue-350-a100-cx5-200g-topo-graph-net-speed-and-gather-perf-same-run.log": (
        "nccl_tests",
        {
            "nccl_processes",
            "nccl_net_devices",
            "nccl_link_rates",
            "nccl_channels",
            "nccl_rings",
            "nccl_events",
            "nccl_tests_results",
        },
    ),
    "nccl-tests-issue-82-legacy-broadcast-header-error-column-socket.txt": (
        "nccl_tests",
        {"nccl_processes", "nccl_events", "nccl_tests_results"},
    ),
    "ncclTests-aws-p5-h100-16rank-efa-srun-prefix.txt": ("nccl_tests", {"nccl_events", "nccl_tests_results"}),
    "ncclTests-gcp-a3mega-h100-16rank-allreduce.txt": (
        "nccl_tests",
        {"nccl_processes", "nccl_events", "nccl_tests_results"},
    ),
    "ncclTests-oci-a100-16rank-roce-allreduce.txt": (
        "nccl_tests",
        {"nccl_processes", "nccl_events", "nccl_tests_results"},
    ),
    "nvidia-nccl-docs-2.30-logging-examples-by-subsystem.log": (
        "nccl_log",
        {"nccl_processes", "nccl_channels", "nccl_rings", "nccl_coll_calls", "nccl_events"},
    ),
    "ofa-issue-271-torch-watchdog-timeout-legacy-format.log": ("torch_watchdog", {"nccl_watchdog"}),
    "pytorch-tutorial-flight-recorder-unpickled-dump-repr.txt": (
        "flight_recorder",
        {"flight_recorder", "flight_recorder_groups"},
    ),
    "pytorch-tutorial-torchfrtrace-output-missing-rank.txt": ("torchfrtrace", {"flight_recorder_mismatches"}),
    "tensorflow-issue-34375-nccl-2.4.7-legacy-ring-format-empty-hostname.log": (
        "nccl_log",
        {"nccl_processes", "nccl_channels", "nccl_rings", "nccl_events"},
    ),
    "torchtitan-issue-1369-coll-allgather-reducescatter-tp2.log": (
        "nccl_log",
        {"nccl_processes", "nccl_coll_calls"},
    ),
    "vllm-issue-8447-init-start-2node-ib-ray-prefix-nccl2.20.5.log": (
        "nccl_log",
        {"nccl_processes", "nccl_rings", "nccl_events"},
    ),
}
LINE_TABLES = (
    "nccl_events",
    "nccl_coll_calls",
    "nccl_channels",
    "nccl_rings",
    "nccl_tests_results",
    "nccl_watchdog",
)
TEXT_FORMATS = {"nccl_log", "nccl_tests", "torch_watchdog"}


def test_corpus_is_the_expected_set():
    """Fails (not skips) when a corpus file is missing or an unlisted one appears."""
    found = {p.name for p in corpus("nccl").iterdir() if p.name != "PROVENANCE.md"}
    assert found == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_corpus_file_parses(name):
    data = corpus("nccl", name).read_bytes()
    fmt, tables = EXPECTED[name]
    assert nccl.sniff(data[:65536], name) == fmt
    p = nccl.parse(data, name)
    assert p.format == fmt
    assert set(p.tables) == tables, name
    assert all(df.height > 0 for df in p.tables.values())
    for t, df in p.tables.items():  # each table conforms to its schema section
        sch.conform(t, df.with_columns(run_id=pl.lit("r"), source_id=pl.lit("s")).to_arrow())
    if fmt in TEXT_FORMATS:
        # every non-blank line is in exactly one line table
        lines = data.decode("utf-8").split("\n")
        nonblank = {i for i, line in enumerate(lines, 1) if line.strip()}
        seen: dict[int, str] = {}
        for t in LINE_TABLES:
            if t in p.tables:
                for ln in set(p.tables[t]["line_no"].to_list()):
                    assert ln not in seen, (name, ln, seen.get(ln), t)
                    seen[ln] = t
        assert set(seen) == nonblank, name


def _results(fragment: str) -> pl.DataFrame:
    path = next(p for p in corpus("nccl").iterdir() if fragment in p.name)
    return nccl.parse(path.read_bytes(), path.name).tables["nccl_tests_results"]


def test_link_rate_logs_yield_their_nccl_tests_tables():
    """The two logs that state NIC speeds (PROVENANCE.md) give their tables row for row; the values
    are read by hand from the files, line numbers cited."""
    t = _results("nccl-tests-issue-256-")
    # two tables: bare metal (lines 26-28, 3 sizes) and the VMs (lines 57-62, 6 sizes), each row
    # out-of-place and in-place
    assert t.height == 2 * (3 + 6)
    assert t.group_by("table_index").len().sort("table_index")["len"].to_list() == [6, 12]
    assert set(t["n_ranks"]) == {16} and set(t["n_nodes"]) == {2}  # 16 ranks on node01/node02 (-vm)
    row = {(r["line_no"], r["placement"]): r for r in t.to_dicts()}
    # line 26: "1073741824 268435456 float sum -1 4389.5 244.62 458.65 0 4331.1 247.92 464.84 0"
    oop = row[(26, "out_of_place")]
    assert oop["busbw_gbps"] == 458.65 and oop["time_ns"] == 4_389_500
    assert row[(26, "in_place")]["busbw_gbps"] == 464.84 and row[(26, "in_place")]["algbw_gbps"] == 247.92
    # line 57 (VM): "100663296 25165824 float sum -1 84462 1.19 2.23 0 52765 1.91 3.58 0"
    oop = row[(57, "out_of_place")]
    assert oop["size_bytes"] == 100663296 and oop["busbw_gbps"] == 2.23
    assert row[(57, "in_place")]["table_index"] == 1

    g = _results("nccl-tests-issue-350-")
    # gather_perf, 128 MiB to 10.6 GiB in 128 MiB steps: 85 sizes (lines 88-172), 2 ranks on 2 nodes
    assert g.height == 2 * 85 and set(g["test"]) == {"gather_perf"}
    assert g["line_no"].min() == 88 and g["line_no"].max() == 172
    assert set(g["n_ranks"]) == {2} and set(g["n_nodes"]) == {2}
    row = {(r["line_no"], r["placement"]): r for r in g.to_dicts()}
    # line 88: "134217728 16777216 float none 0 3324.7 40.37 20.19 0 3003.4 44.69 22.34 0"
    assert row[(88, "out_of_place")]["busbw_gbps"] == 20.19 and row[(88, "in_place")]["busbw_gbps"] == 22.34
    # line 127 (5 GiB, before the cliff) 17.98 GB/s; line 137 (6.25 GiB, after it) 10.83 GB/s
    assert row[(127, "out_of_place")]["busbw_gbps"] == 17.98
    oop = row[(137, "out_of_place")]
    assert oop["size_bytes"] == 6710886400 and oop["busbw_gbps"] == 10.83


def test_corpus_writes_a_conforming_lake(tmp_path):
    """All corpus files into one lake through Lake.write_source; read back with polars."""
    lake = Lake(tmp_path / "lake")
    lake.ensure()
    for name in sorted(EXPECTED):
        path = CORPUS / "nccl" / name
        data = path.read_bytes()
        p = nccl.parse(data, name)
        sha = hashlib.sha256(data).hexdigest()
        sid = sha[:16]
        tables = {
            t: df.with_columns(run_id=pl.lit("nccl"), source_id=pl.lit(sid)).to_arrow()
            for t, df in p.tables.items()
        }
        row = {
            "source_id": sid,
            "run_id": "nccl",
            "path": str(path),
            "format": p.format,
            "content_sha256": sha,
            "size_bytes": len(data),
            "status": "ok",
            "schema_version": sch.SCHEMA_VERSION,
            "tracelake_version": __version__,
            "ingested_at_ns": time.time_ns(),
            "host": p.host,
            "world_size": p.world_size,
            "notes": p.notes or None,
            "event_count": p.event_count,
        }
        lake.write_source("nccl", sid, tables, row)
    src = lake.sources()
    assert src.height == len(EXPECTED) and set(src["status"]) == {"ok"}
    res = pl.scan_parquet(
        str(lake.root / "nccl_tests_results" / "**" / "*.parquet"), hive_partitioning=True
    ).collect()
    # OCI 31 sizes, GCP 31 sizes, AWS p5 32 sizes, aws-eks 31 rows, legacy broadcast 1 row,
    # nccl-tests-issue-256 3 + 6 sizes, nccl-tests-issue-350 85 sizes: x2 placements
    assert res.height == 2 * (31 + 31 + 32 + 31 + 1 + 9 + 85)
    # nccl-tests-issue-256 line 28 (bare metal, 9 GiB):
    # "9663676416 2415919104 float sum -1 37069 260.70 488.81 0 37218 259.65 486.84 0"
    assert res["busbw_gbps"].max() == 488.81
    # ncclTests-aws-p5 line 34:
    # "0:  17179869184 4294967296 float sum -1 66132 259.78 487.09 0 66109 259.87 487.26 0"
    assert res.filter(pl.col("busbw_gbps") < 488)["busbw_gbps"].max() == 487.26
    wd = pl.read_parquet(lake.table_files("nccl_watchdog"))
    # basicsr 5 lines, llamafactory 5, ofa 5, nccl-1657 lines 1-3
    assert wd.height == 18
    assert set(wd["run_id"]) == {"nccl"}

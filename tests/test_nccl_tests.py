"""nccl-tests output -> nccl_tests_results: the corpus tables (values read by hand, line cited), then
the other table variants of nccl.md section 2 (cputime, -S timestamps, trace replay, -I columns,
legacy headers, several tests in one capture) and the -J JSON."""

from __future__ import annotations

import json
from functools import lru_cache

from conftest import corpus

from pipeline.ingest import nccl


@lru_cache(maxsize=None)
def parsed(name: str):
    return nccl.parse(corpus("nccl", name).read_bytes(), name)


def results(p) -> list[dict]:
    return p.tables["nccl_tests_results"].to_dicts()


def row(p, line_no: int, placement: str) -> dict:
    (r,) = [r for r in results(p) if r["line_no"] == line_no and r["placement"] == placement]
    return r


def event(p, line_no: int) -> dict:
    (e,) = [e for e in p.tables["nccl_events"].to_dicts() if e["line_no"] == line_no]
    return e


def test_oci_a100_full_table():
    p = parsed("ncclTests-oci-a100-16rank-roce-allreduce.txt")
    rs = results(p)
    assert len(rs) == 62  # lines 27-57: 31 sizes x 2 placements
    # line 27: "           8             2     float     sum      -1    36.47    0.00    0.00      0
    #           34.74    0.00    0.00      0"
    r = row(p, 27, "out_of_place")
    assert (r["size_bytes"], r["count"], r["type"], r["dtype_bytes"], r["redop"], r["root"]) == (
        8,
        2,
        "float",
        4,
        "sum",
        -1,
    )
    assert (r["time_ns"], r["algbw_gbps"], r["busbw_gbps"], r["wrong"], r["cpu_time"]) == (
        36470,
        0.0,
        0.0,
        0,
        False,
    )
    assert row(p, 27, "in_place")["time_ns"] == 34740
    # line 57: "  8589934592    2147483648     float     sum      -1    67689  126.90  237.94      0
    #           67811  126.68  237.52      0"
    r = row(p, 57, "out_of_place")
    assert (r["size_bytes"], r["count"], r["time_ns"], r["algbw_gbps"], r["busbw_gbps"]) == (
        8589934592,
        2147483648,
        67689000,
        126.90,
        237.94,
    )
    r = row(p, 57, "in_place")
    assert (r["time_ns"], r["algbw_gbps"], r["busbw_gbps"]) == (67811000, 126.68, 237.52)
    # lines 7-22: 16 device lines on node01 and node02; no "Collective test starting" line
    assert {(r["n_ranks"], r["n_nodes"], r["test"], r["test_source"]) for r in rs} == {
        (16, 2, "all_reduce_perf", "inferred")
    }
    # line 59: "# Avg bus bandwidth    : 66.4834"
    assert json.loads(event(p, 59)["detail"])["avg_busbw_gbps"] == 66.4834
    # line 7: "#  Rank  0 Group  0 Pid     43 on node01 device  0 [0x0f] NVIDIA A100-SXM4-40GB"
    procs = {r["rank"]: r for r in p.tables["nccl_processes"].to_dicts()}
    assert (
        procs[0]["host"],
        procs[0]["pid"],
        procs[0]["cuda_dev"],
        procs[0]["bus_id"],
        procs[0]["gpu_name"],
    ) == ("node01", 43, 0, "[0x0f]", "NVIDIA A100-SXM4-40GB")
    # line 15: "#  Rank  8 Group  0 Pid     43 on node02 device  0 [0x0f] ..." (same pid, other host)
    assert (procs[8]["host"], procs[8]["pid"]) == ("node02", 43)
    assert event(p, 1)["kind"] == "other"  # 'Defaulted container "mpimaster" ...'


def test_gcp_a3mega_new_device_format():
    p = parsed("ncclTests-gcp-a3mega-h100-16rank-allreduce.txt")
    # line 54: "  8589934592    2147483648     float     sum      -1    47535  180.71  338.82      0
    #           47743  179.92  337.35      0"
    r = row(p, 54, "out_of_place")
    assert (r["time_ns"], r["algbw_gbps"], r["busbw_gbps"]) == (47535000, 180.71, 338.82)
    assert row(p, 54, "in_place")["busbw_gbps"] == 337.35
    # line 31: "        1024           256     float     sum      -1    147.1    0.01    0.01      0
    #           123.1    0.01    0.02      0"
    assert (row(p, 31, "out_of_place")["time_ns"], row(p, 31, "in_place")["busbw_gbps"]) == (147100, 0.02)
    # line 19: "#  Rank 15 Group  0 Pid   6740 on node02 device  7 [0000:8c:00] NVIDIA H100 80GB HBM3"
    (r15,) = [r for r in p.tables["nccl_processes"].to_dicts() if r["rank"] == 15]
    assert (r15["host"], r15["pid"], r15["cuda_dev"], r15["bus_id"], r15["pci_bus_id"]) == (
        "node02",
        6740,
        7,
        "[0000:8c:00]",
        "0000:8c:00.0",
    )
    # line 56: "# Avg bus bandwidth    : 70.742 " (trailing space)
    assert json.loads(event(p, 56)["detail"])["avg_busbw_gbps"] == 70.742
    # line 1: "# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20
    #          agg iters: 1 ..."
    d = json.loads(event(p, 1)["detail"])
    assert (d["n_threads"], d["n_gpus"], d["max_bytes"], d["warmup_iters"], d["iters"]) == (
        1,
        1,
        8589934592,
        5,
        20,
    )
    assert {(r["n_ranks"], r["n_nodes"]) for r in results(p)} == {(16, 2)}


def test_aws_p5_srun_prefix_without_banner():
    p = parsed("ncclTests-aws-p5-h100-16rank-efa-srun-prefix.txt")
    assert len(results(p)) == 64  # lines 3-34
    # line 3: "0:            8             2     float     sum      -1    69.12    0.00    0.00      0
    #          72.43    0.00    0.00      0"
    assert (row(p, 3, "out_of_place")["time_ns"], row(p, 3, "in_place")["time_ns"]) == (69120, 72430)
    # line 34: "0:  17179869184    4294967296     float     sum      -1    66132  259.78  487.09      0
    #           66109  259.87  487.26      0"
    r = row(p, 34, "out_of_place")
    assert (r["size_bytes"], r["count"], r["time_ns"], r["algbw_gbps"], r["busbw_gbps"]) == (
        17179869184,
        4294967296,
        66132000,
        259.78,
        487.09,
    )
    assert row(p, 34, "in_place")["busbw_gbps"] == 487.26
    # no device lines in the excerpt: GPUs and nodes unknown
    assert {(r["n_ranks"], r["n_nodes"], r["test"]) for r in results(p)} == {(None, None, "all_reduce_perf")}
    assert event(p, 1)["wrapper"] == "0: " and event(p, 1)["wrapper_rank"] == 0


def test_aws_eks_table_with_info_line_inside():
    p = parsed("aws-eks-efa-t4-2rank-nccl2.12.7-init-and-ncclTests.log")
    assert len(results(p)) == 62  # lines 58-88; line 57 is an NCCL INFO line inside the table
    # line 58: "[1,0]<stdout>:           0             0     float     sum      -1     6.36    0.00    0.00
    #                0     6.40 ..."
    r = row(p, 58, "out_of_place")
    assert (r["size_bytes"], r["count"], r["time_ns"]) == (0, 0, 6360)
    # line 88: "  1073741824     268435456     float     sum      -1   344981    3.11    3.11      0
    #          344454    3.12    3.12      0"
    r = row(p, 88, "in_place")
    assert (r["time_ns"], r["algbw_gbps"], r["busbw_gbps"]) == (344454000, 3.12, 3.12)
    # lines 6-7: 2 ranks on node01 and node02
    assert {(r["n_ranks"], r["n_nodes"], r["test"]) for r in results(p)} == {(2, 2, "all_reduce_perf")}
    # line 92: "# Avg bus bandwidth    : 1.15327"
    assert json.loads(event(p, 92)["detail"])["avg_busbw_gbps"] == 1.15327


def test_legacy_broadcast_header_with_error_column():
    p = parsed("nccl-tests-issue-82-legacy-broadcast-header-error-column-socket.txt")
    # line 13: "#       size         count    type    root     time   algbw   busbw  error
    #               time   algbw   busbw  error"
    # line 15: "           8             2   float       0    45.82    0.00    0.00    N/A
    #              38.17    0.00    0.00    N/A"
    r = row(p, 15, "out_of_place")
    assert (r["size_bytes"], r["count"], r["type"], r["redop"], r["root"], r["time_ns"]) == (
        8,
        2,
        "float",
        None,
        0,
        45820,
    )
    assert (r["wrong"], r["max_error"]) == (None, None)
    assert row(p, 15, "in_place")["time_ns"] == 38170
    # size = count x 4 with a root column and no redop column: broadcast (doc/PERFORMANCE.md sizes)
    assert (r["test"], r["test_source"], r["n_ranks"], r["n_nodes"]) == ("broadcast_perf", "inferred", 2, 2)
    # line 4: "#   Rank  0 Pid  14926 on node01 device  0 [0x00] Tesla V100-PCIE-16GB" (no Group column)
    procs = {r["rank"]: r for r in p.tables["nccl_processes"].to_dicts()}
    assert (procs[0]["pid"], procs[0]["gpu_name"], procs[1]["host"]) == (
        14926,
        "Tesla V100-PCIE-16GB",
        "node02",
    )
    # line 8: "NCCL version 2.9.6+cuda11.2"
    assert p.tool_versions["nccl_version"] == "2.9.6" and procs[0]["nccl_version"] == "2.9.6"


# A backslash at the end of a line joins it to the next: each joined pair is one line of the output.
MODERN = """# nccl-tests version 2.17.9 nccl-headers=22903 nccl-library=22903
# Collective test starting: reduce_scatter_perf
# nThread 1 nGpus 2 minBytes 16 maxBytes 32 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1\
 validation: 1 graph: 0 unalign: 0
#
# Using devices
#  Rank  0 Group  0 Pid   6899 on     node01 device  0 [0000:04:00] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid   6899 on     node01 device  1 [0000:05:00] NVIDIA H100 80GB HBM3
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root  cputime   algbw   busbw #wrong\
  cputime   algbw   busbw #wrong            timestamp
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)\
            (us)  (GB/s)  (GB/s)         %Y-%m-%d %H:%M:%S
          16             2     float     sum      -1    10.50    0.00    0.00      0\
    11.25    0.00    0.00    N/A  2025-01-02 03:04:05
          32             4     float     sum      -1\
                                     12.00    0.00    0.00      0  2025-01-02 03:04:06
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 0.001
#
# Collective test concluded: reduce_scatter_perf
# nccl-tests version 2.17.9 nccl-headers=22903 nccl-library=22903
# Collective test starting: all_gather_perf
# nThread 1 nGpus 2 minBytes 16 maxBytes 16 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1\
 validation: 1 graph: 0 unalign: 0
#  Rank  0 Group  0 Pid   7000 on     node01 device  0 [0000:04:00] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid   7000 on     node02 device  0 [0000:04:00] NVIDIA H100 80GB HBM3
#       size         count      type   redop    root     time   algbw   busbw #wrong\
   i_min   i_max   i_p99   i_cv%     time   algbw   busbw #wrong   i_min   i_max   i_p99   i_cv%
          16             2     float    none      -1     5.00    0.00    0.00      0\
    4.00    6.00    6.00    1.00     5.50    0.00    0.00      1    4.50    6.50    6.50    2.00
"""


def test_stated_test_cputime_timestamps_trace_replay_and_per_iteration():
    p = nccl.parse(MODERN.encode(), "run.out")
    assert p.format == "nccl_tests" and p.tool_versions["nccl_tests_version"] == "2.17.9"
    # line 12: -C 1 (cputime) and -S 1 (timestamp) columns; N/A #wrong in the in-place block
    r = row(p, 12, "out_of_place")
    assert (r["test"], r["test_source"], r["cpu_time"], r["time_ns"], r["wrong"], r["table_index"]) == (
        "reduce_scatter_perf",
        "stated",
        True,
        10500,
        0,
        0,
    )
    assert (row(p, 12, "in_place")["time_ns"], row(p, 12, "in_place")["wrong"]) == (11250, None)
    # line 13: trace replay prints blanks instead of the out-of-place block
    assert [r["placement"] for r in results(p) if r["line_no"] == 13] == ["in_place"]
    assert row(p, 13, "in_place")["time_ns"] == 12000
    assert {
        (r["n_ranks"], r["n_nodes"], r["nccl_tests_version"]) for r in results(p) if r["table_index"] == 0
    } == {(2, 1, "2.17.9")}
    # line 24: -I 1 per-iteration columns; second run of the capture with its own devices and name
    r = row(p, 24, "in_place")
    assert (r["test"], r["table_index"], r["time_ns"], r["wrong"], r["n_ranks"], r["n_nodes"]) == (
        "all_gather_perf",
        1,
        5500,
        1,
        2,
        2,
    )
    assert row(p, 24, "out_of_place")["redop"] == "none"


def test_legacy_reduce_and_inferred_reduce_scatter():
    legacy = (
        "#   Rank  0 Pid 1 on a device  0 [0x00] Tesla V100\n"
        "#   Rank  1 Pid 2 on a device  1 [0x01] Tesla V100\n"
        "#       size         count    type   redop    root     time   algbw   busbw  error"
        "     time   algbw   busbw  error\n"
        "        1024           256   float     sum       1    10.00    0.10    0.10  0e+00"
        "    11.00    0.09    0.09  2e-07\n"
    )
    p = nccl.parse(legacy.encode(), "reduce.txt")
    r = row(p, 4, "in_place")
    assert (r["test"], r["root"], r["max_error"], r["wrong"]) == ("reduce_perf", 1, 2e-07, None)
    rs = (
        "#  Rank  0 Group  0 Pid 1 on a device  0 [0x00] X\n"
        "#  Rank  1 Group  0 Pid 2 on a device  1 [0x01] X\n"
        "#       size         count      type   redop    root     time   algbw   busbw #wrong"
        "     time   algbw   busbw #wrong\n"
        "        2048           256     float     sum      -1    10.00    0.20    0.10      0"
        "    10.00    0.20    0.10      0\n"
    )
    p = nccl.parse(rs.encode(), "rs.txt")
    # size = count x 4 bytes x 2 ranks with a reduction: reduce_scatter
    assert row(p, 4, "out_of_place")["test"] == "reduce_scatter_perf"


def test_json_output():
    doc = {
        "version": 2,
        "start_time": "2025-01-02 03:04:05",
        "args": ["./build/all_gather_perf", "-b", "8"],
        "env": [],
        "nccl_version": 22903,
        "config": {"nthreads": 1, "ngpus": 1, "minimum_bytes": 8, "maximum_bytes": 16},
        "devices": [
            {
                "rank": 0,
                "group": 0,
                "pid": 10,
                "hostname": "node01",
                "device": 0,
                "device_hex": "0000:04:00",
                "device_info": "NVIDIA H100",
            },
            {
                "rank": 1,
                "group": 0,
                "pid": 11,
                "hostname": "node02",
                "device": 0,
                "device_hex": "0000:04:00",
                "device_info": "NVIDIA H100",
            },
        ],
        "results": [
            {
                "size": 16,
                "count": 2,
                "type": "float",
                "redop": "none",
                "root": "    -1",
                "out_of_place": {"time": 12.5, "alg_bw": 0.0013, "bus_bw": 0.00065, "nwrong": 0.0},
                "in_place": {"time": 11.0, "alg_bw": 0.0015, "bus_bw": 0.0007, "nwrong": None},
                "actual_iterations": 20,
                "experiment_name": "all_gather_perf",
            }
        ],
        "out_of_bounds": {"count": 0, "okay": "true"},
        "average_bus_bandwidth": {"bandwidth": 0.0007, "okay": "unchecked"},
    }
    data = json.dumps(doc).encode()
    assert nccl.sniff(data, "r.json") == "nccl_tests"
    p = nccl.parse(data, "r.json")
    assert p.tool_versions["nccl_version"] == "2.29.3" and p.world_size == 2
    out, inp = sorted(results(p), key=lambda r: r["placement"] != "out_of_place")
    assert (
        out["test"],
        out["test_source"],
        out["root"],
        out["time_ns"],
        out["busbw_gbps"],
        out["wrong"],
    ) == ("all_gather_perf", "stated", -1, 12500, 0.00065, 0)
    assert (inp["time_ns"], inp["wrong"], inp["n_ranks"], inp["n_nodes"], inp["line_no"]) == (
        11000,
        None,
        2,
        2,
        None,
    )
    # nccl-tests writes the whole environment before the results: recognized from its first keys
    big = json.dumps({**doc, "env": ["K=" + "v" * 100] * 1000}).encode()
    assert b'"results"' not in big[:65536] and nccl.sniff(big[:65536], "r.json") == "nccl_tests"


def test_the_three_clusters_best_busbw_half_peak_size_and_report_lines(tmp_path):
    """queries/nccl_tests_bandwidth.sql on the three ncclTests-* files, values read by hand from
    their tables (best busbw of each placement, its size, and the smallest size whose busbw is
    at least half of it), and the sentences the report's nccl-tests section prints from them."""
    from pipeline.ingest import ingest_paths
    from pipeline.lake import Lake
    from pipeline.query import connect
    from pipeline.report.nccl_tests_chart import peak_lines

    files = {
        # lines 3-34: out-of-place 487.09 / in-place 487.26 GB/s at 17179869184 B (line 34); half
        # (243.5 / 243.6) is first reached at 134217728 B (line 27: 289.16 / 287.01; line 26 209.19)
        "ncclTests-aws-p5-h100-16rank-efa-srun-prefix.txt": {
            "out_of_place": (487.09, 17179869184, 134217728),
            "in_place": (487.26, 17179869184, 134217728),
        },
        # lines 24-54: 338.82 / 337.35 at 8589934592 (line 54); half at 268435456 (line 49: 213.19 /
        # 213.28; line 48: 152.32 / 153.76)
        "ncclTests-gcp-a3mega-h100-16rank-allreduce.txt": {
            "out_of_place": (338.82, 8589934592, 268435456),
            "in_place": (337.35, 8589934592, 268435456),
        },
        # lines 27-57: 237.94 / 237.52 at 8589934592 (line 57); half (118.97 / 118.76) at 33554432
        # (line 49: 139.08 / 139.19; line 48: 111.29 / 118.32, just under)
        "ncclTests-oci-a100-16rank-roce-allreduce.txt": {
            "out_of_place": (237.94, 8589934592, 33554432),
            "in_place": (237.52, 8589934592, 33554432),
        },
    }
    lake = Lake(tmp_path / "lake")
    res = ingest_paths([corpus("nccl", f) for f in files], lake)
    assert [r.status for r in res] == ["ok"] * 3
    cols = "file, placement, peak_busbw_gbps, size_at_peak_bytes, half_peak_size_bytes, n_nodes"
    rows = (
        connect(lake).execute(f"SELECT {cols} FROM nccl_tests_bandwidth ORDER BY file, placement").fetchall()
    )
    got = {(f, p): (bw, s, h) for f, p, bw, s, h, _ in rows}
    assert got == {(f, p): v for f, d in files.items() for p, v in d.items()}
    # 16 ranks on 2 nodes, as the GCP and OCI device lists say; the AWS capture (line 1: the table
    # header) lists no devices
    assert {f: n for f, *_, n in rows} == dict(zip(sorted(files), (None, 2, 2)))
    peaks = [
        dict(
            zip(
                (
                    "file",
                    "placement",
                    "peak_busbw_gbps",
                    "size_at_peak_bytes",
                    "half_peak_size_bytes",
                    "n_nodes",
                ),
                r,
            )
        )
        | {"test": "all_reduce_perf", "busbw_pct_of_link": None, "link_peak_gbps": None}
        for r in rows
    ]
    lines = peak_lines(peaks)
    assert lines[0] == (
        "all_reduce_perf out-of-place (ncclTests-aws-p5-h100-16rank-efa-srun-prefix.txt): best "
        "busbw 487.1\u00a0GB/s at 16\u00a0GiB, half of it from 128\u00a0MiB on"
    )
    assert len(lines) == 6

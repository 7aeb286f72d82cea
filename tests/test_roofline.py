"""Kernels against the roofline (views/80_kernel_roofline.sql, queries/roofline.sql), the traffic
model (pipeline/opbytes.py), the kernel -> op link (derive.py work_op) and the roofline finding
(pipeline/diagnosis/roofline.py).

1. A hand-made one-rank trace on an H100 SXM (devices.toml: bf16 989.4, fp32 67 TFLOP/s,
   3350 GB/s; ridge bf16 989.4e3 / 3350 = 295.34 FLOP/byte, fp32 67e3 / 3350 = 20.0) with
   numSms 132, every number worked out by hand below (µs in the trace, ns in the lake).
     A  aten::mm bf16 [4096,4096] x [4096,4096], one kernel of 200 µs, 1024 blocks:
        flops 2*4096^3 = 137,438,953,472; bytes 3 * 4096^2 * 2 = 100,663,296;
        intensity 1365.33 >= 295.34 -> compute; achieved 137.44e9 / 200e3 ns / 1e3 = 687.19
        TFLOP/s; roof 989.4; roof_pct 69.456; lost 200 * (1 - 0.69456) = 61.09 µs.
     B  aten::add bf16 [1024,1024,8] + [1024,1024,8], 30 µs, 8192 blocks: bytes 3 * 8,388,608 * 2
        = 50,331,648; vector flops 8,388,608; intensity 1/6 -> memory; achieved 1677.72 GB/s;
        roof min(67, 3350 / 6 / 1e3 = 0.5583) TFLOP/s; roof_pct = 1677.72 / 3350 = 50.08.
     C  aten::relu float [1024], 3 µs (< 10 µs) -> latency; bytes 2 * 1024 * 4 = 8192.
     D  aten::mm float [1024,1024] x [1024,1024] launching two kernels, 60 µs (256 blocks) and
        40 µs (64 blocks < 132 SMs -> latency): flops 2 * 1024^3 = 2,147,483,648 shared 0.6 /
        0.4; bytes 3 * 1024^2 * 4 = 12,582,912; intensity 170.67 >= 20 -> the 60 µs kernel is
        compute-bound; achieved 2,147,483,648 / 100e3 / 1e3 = 21.47 TFLOP/s of 67: 32.05 %.
     E  aten::addmm bf16 (bias [512], [512,256] x [256,512]) whose kernel carries the External id
        of an unmodelled inner op (aten::cublas_gemm_stub): work_op falls back to the addmm
        around the launch on the same thread. 20 µs, 1024 blocks: flops 2*512*256*512 =
        134,217,728; bytes (512 + 2*131,072 + 262,144) * 2 = 1,049,600; intensity 127.9 < 295.34
        -> memory; achieved 6.711 TFLOP/s; roof 127.9 * 3350 / 1e3 = 428.4; roof_pct 1.567.
     F  a kernel launched by an op without a model (aten::cumsum): not in the roofline, counted
        in the run's compute time. 47 µs.
   Compute time 200 + 30 + 3 + 100 + 20 + 47 = 400 µs; modelled 353 µs (88.25 %); by bound:
   compute 200 + 60 = 260, memory 30 + 20 = 50, latency 3 + 40 = 43.
2. TraceLens's B200 vLLM trace: every kernel whose External id is an aten::addmm / aten::mm op,
   with FLOPs, bytes and the roof worked out from the raw JSON (2mnk; (mk + kn + mn) * 2 + bias,
   bf16) against kernel_roofline.
3. PARAM's DLRM job (V100, 80 SMs): the finding says latency-bound, as a brute-force count of its
   modelled kernels from the raw JSON shows (kernels under 10 µs or with fewer blocks than SMs
   hold most of the modelled time).
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict

import polars as pl
import pytest
from conftest import X, corpus, write_trace

from pipeline import opbytes, query
from pipeline.analyze import analyze
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake

H100 = [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85_000_000_000, "numSms": 132}]
US = 1000


def _op(name, ts, dur, ext, dims, types):
    return X(
        "cpu_op",
        name,
        ts,
        dur,
        pid=10,
        tid=10,
        **{"External id": ext, "Input Dims": dims, "Input type": types},
    )


def _launch(ts, corr, ext):
    return X(
        "cuda_runtime", "cudaLaunchKernel", ts, 2, pid=10, tid=10, correlation=corr, **{"External id": ext}
    )


def _kernel(name, ts, dur, corr, ext, blocks):
    return X(
        "kernel", name, ts, dur, pid=0, tid=7, device=0, stream=7, correlation=corr,
        grid=[blocks, 1, 1], block=[256, 1, 1], **{"External id": ext},
    )  # fmt: skip


def events():
    bf, f = "c10::BFloat16", "float"
    return [
        X("user_annotation", "ProfilerStep#1", 0, 2000, pid=10, tid=10),
        _op("aten::mm", 10, 20, 1, [[4096, 4096], [4096, 4096]], [bf, bf]),
        _launch(15, 1, 1),
        _kernel("gemm_bf16", 100, 200, 1, 1, 1024),
        _op("aten::add", 40, 10, 2, [[1024, 1024, 8], [1024, 1024, 8], []], [bf, bf, "Scalar"]),
        _launch(45, 2, 2),
        _kernel("add_kernel", 300, 30, 2, 2, 8192),
        _op("aten::relu", 60, 10, 3, [[1024]], [f]),
        _launch(65, 3, 3),
        _kernel("relu_kernel", 330, 3, 3, 3, 4),
        _op("aten::mm", 80, 20, 4, [[1024, 1024], [1024, 1024]], [f, f]),
        _launch(82, 4, 4),
        _launch(90, 5, 4),
        _kernel("splitk_main", 340, 60, 4, 4, 256),
        _kernel("splitk_reduce", 400, 40, 5, 4, 64),
        _op("aten::addmm", 110, 30, 6, [[512], [512, 256], [256, 512]], [bf, bf, bf]),
        _op("aten::cublas_gemm_stub", 112, 20, 7, [], []),
        _launch(115, 6, 7),
        _kernel("gemm_small", 440, 20, 6, 7, 1024),
        _op("aten::cumsum", 150, 10, 8, [[4096], []], [f, "Scalar"]),
        _launch(152, 7, 8),
        _kernel("cumsum_kernel", 460, 47, 7, 8, 512),
    ]


@pytest.fixture(scope="module")
def hand(tmp_path_factory):
    root = tmp_path_factory.mktemp("roof")
    write_trace(root / "job" / "r0.json", events(), deviceProperties=H100)
    lake = Lake(root / "lake")
    assert {r.status for r in ingest_paths([root / "job"], lake, jobs=1)} == {"ok"}
    return lake


def test_hand_made_kernels_against_their_roofs(hand):
    con = query.connect(hand)
    rows = {
        r["kernel_name"]: r
        for r in pl.from_arrow(con.sql("SELECT * FROM kernel_roofline").to_arrow_table()).to_dicts()
    }
    assert set(rows) == {
        "gemm_bf16",
        "add_kernel",
        "relu_kernel",
        "splitk_main",
        "splitk_reduce",
        "gemm_small",
    }
    a = rows["gemm_bf16"]
    assert a["op_name"] == "aten::mm" and a["precision"] == "bf16" and a["work_class"] == "matrix"
    assert a["flops"] == 2 * 4096**3 and a["bytes"] == 3 * 4096**2 * 2
    assert a["achieved_tflops"] == pytest.approx(687.19, abs=0.01)
    assert a["roof_tflops"] == pytest.approx(989.4) and a["roof_pct"] == pytest.approx(69.456, abs=1e-3)
    assert a["bound"] == "compute" and a["lost_ns"] == pytest.approx(61.09 * US, abs=5)
    assert a["ridge_flop_per_byte"] == pytest.approx(989.4e3 / 3350)
    b = rows["add_kernel"]
    assert b["work_class"] == "vector" and b["bytes"] == 50_331_648 and b["flops"] == 8_388_608
    assert b["achieved_gbps"] == pytest.approx(1677.72, abs=0.01) and b["bound"] == "memory"
    assert b["roof_tflops"] == pytest.approx(3350 / 6 / 1e3) and b["roof_pct"] == pytest.approx(
        50.08, abs=0.01
    )
    c = rows["relu_kernel"]
    assert c["bytes"] == 8192 and c["bound"] == "latency"
    d1, d2 = rows["splitk_main"], rows["splitk_reduce"]
    assert d1["op_kernels"] == d2["op_kernels"] == 2
    assert d1["flops"] == pytest.approx(0.6 * 2 * 1024**3) and d2["flops"] == pytest.approx(0.4 * 2 * 1024**3)
    assert d1["bound"] == "compute" and d2["bound"] == "latency"  # 64 blocks on 132 SMs
    assert d1["roof_pct"] == pytest.approx(32.05, abs=0.01) == d2["roof_pct"]
    e = rows["gemm_small"]
    assert e["op_name"] == "aten::addmm" and e["bytes"] == 1_049_600 and e["bound"] == "memory"
    assert e["roof_pct"] == pytest.approx(6.711 / 428.4 * 100, rel=2e-3)


def test_hand_made_summary_and_finding(hand):
    doc = analyze(hand)
    (s,) = doc["roofline_summary"]
    assert s["run_compute_ns"] == 400 * US and s["modelled_ns"] == 353 * US
    assert s["coverage_pct"] == pytest.approx(88.25)
    assert s["compute_bound_pct"] == pytest.approx(100 * 260 / 353)
    assert s["memory_bound_pct"] == pytest.approx(100 * 50 / 353)
    assert s["latency_bound_pct"] == pytest.approx(100 * 43 / 353)
    # mostly compute-bound kernels near their roofs: no roofline finding
    assert "roofline_bound" not in {f["kind"] for f in doc["findings"]}
    assert s["top"][0]["kernel_name"] == "gemm_bf16"  # 61 µs lost, the most


def test_traffic_model_abstains_without_tensors():
    assert opbytes.op_bytes("aten::add", "[[4], [5]]", '["float", "float"]') == (None, None)  # no broadcast
    assert opbytes.op_bytes("aten::add", "[[], []]", '["Scalar", "Scalar"]') == (None, None)
    assert opbytes.op_bytes("aten::mm", "[[2, 3], [4, 5]]", '["float", "float"]') == (None, None)
    assert opbytes.op_bytes("aten::unknown_op", "[[2]]", '["float"]') == (None, None)
    assert opbytes.op_bytes("aten::add", "not json", "[]") == (None, None)
    # broadcast: [8, 1] + [1, 4] -> [8, 4]: 8*4 + 4*4 read, 32*4 written
    assert opbytes.op_bytes("aten::add", "[[8, 1], [1, 4], []]", '["float", "float", "Scalar"]') == (
        (8 + 4 + 32) * 4.0,
        32.0,
    )


def _b200():
    return corpus("tracelens", "tests", "traces", "b200", "eager_trace.json.gz")


def test_b200_gemms_against_the_raw_json(tmp_path):
    """Every kernel of an aten::mm / aten::addmm op (by External id) on TraceLens's B200 trace:
    FLOPs, bytes, achieved rate and roof from the JSON by hand (bf16: 2 bytes; B200 bf16 2250
    TFLOP/s, 8000 GB/s, 148 SMs in deviceProperties)."""
    d = json.loads(gzip.decompress(_b200().read_bytes()))
    ops = {
        e["args"]["External id"]: e
        for e in d["traceEvents"]
        if e.get("cat") == "cpu_op" and e["name"] in ("aten::mm", "aten::addmm")
    }
    kernels = [
        e for e in d["traceEvents"] if e.get("cat") == "kernel" and e["args"].get("External id") in ops
    ]
    per_op = defaultdict(list)
    for k in kernels:
        per_op[k["args"]["External id"]].append(k)
    want = {}
    for ext, ks in per_op.items():
        o = ops[ext]
        dims = o["args"]["Input Dims"]
        a, b = (dims[0], dims[1]) if o["name"] == "aten::mm" else (dims[1], dims[2])
        bias = dims[0] if o["name"] == "aten::addmm" else []
        m, kk, n = a[0], a[1], b[1]
        flops, nbytes = 2 * m * kk * n, (m * kk + kk * n + m * n + (bias[0] if bias else 0)) * 2
        if len(bias) == 2:
            nbytes += (bias[0] * bias[1] - bias[0]) * 2
        total = sum(k["dur"] for k in ks)
        for k in ks:
            share = k["dur"] / total
            ns = round(k["dur"] * 1000)
            ach = share * flops / ns / 1e3
            roof = min(2250.0, flops / nbytes * 8000 / 1e3)
            want[(k["args"]["correlation"])] = (share * flops, share * nbytes, 100 * ach / roof)
    assert len(want) >= 100  # 108 addmm + the mm kernels
    lake = Lake(tmp_path / "lake")
    ingest_paths([_b200()], lake, jobs=1)
    con = query.connect(lake)
    got = {
        corr: (f, b, p)
        for corr, f, b, p in con.execute(
            "SELECT g.correlation, r.flops, r.bytes, r.roof_pct FROM kernel_roofline r "
            "JOIN gpu_activities g ON g.source_id = r.source_id AND g.start_ns = r.start_ns "
            "AND g.name = r.kernel_name WHERE r.op_name IN ('aten::mm', 'aten::addmm')"
        ).fetchall()
    }
    assert set(got) == set(want)
    for corr, (f, b, p) in want.items():
        assert got[corr][0] == pytest.approx(f, rel=1e-6) and got[corr][1] == pytest.approx(b, rel=1e-6)
        assert got[corr][2] == pytest.approx(p, rel=1e-3)


def test_dlrm_roofline_finding_is_latency_bound(tmp_path):
    """DLRM on V100 (80 SMs; its kernels' External id is their correlation, not an op's, so each
    kernel belongs to the latest modelled op on its launching thread whose range holds the
    launch): from the raw JSON, the kernels of modelled ops that are shorter than 10 µs or have
    fewer than 80 blocks hold most of those kernels' time, so the finding names latency-bound
    kernels. Which ops are modelled is pipeline/opbytes.py's and flops.py's business (tested
    above); the attribution and the bound are worked out here."""
    from bisect import bisect_right

    from pipeline.flops import op_flops

    d = corpus("param", "et_replay", "tests", "inputs", "dlrm_kineto")
    short = total = 0
    for f in sorted(d.glob("*.json")):
        ev = json.loads(f.read_bytes())["traceEvents"]
        by_thread = defaultdict(list)
        for e in ev:
            a = e.get("args", {})
            if e.get("cat") == "cpu_op" and a.get("Input Dims"):
                dims, types = a["Input Dims"], a.get("Input type", [])
                if (
                    opbytes.op_bytes(e["name"], dims, types)[0] is not None
                    or op_flops(e["name"], dims, types)[0]
                ):
                    by_thread[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
        for v in by_thread.values():
            v.sort()
        launch = {
            e["args"]["correlation"]: (e["tid"], e["ts"])
            for e in ev
            if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
        }
        for e in ev:
            if e.get("cat") != "kernel" or e["name"].lower().startswith("nccl"):
                continue
            tid, ts = launch.get(e["args"]["correlation"], (None, None))
            ops = by_thread.get(tid, [])
            i = bisect_right(ops, (ts, float("inf"))) - 1 if ts is not None else -1
            if i < 0 or not ts < ops[i][1]:
                continue
            g = e["args"].get("grid", [0, 1, 1])
            total += e["dur"]
            short += e["dur"] if e["dur"] < 10 or g[0] * g[1] * g[2] < 80 else 0
    assert total > 0 and short / total > 0.5
    lake = Lake(tmp_path / "lake")
    ingest_paths([d], lake)
    doc = analyze(lake)
    (s,) = doc["roofline_summary"]
    assert s["modelled_ns"] == total * 1000
    assert s["latency_bound_pct"] == pytest.approx(100 * short / total)
    (f,) = [f for f in doc["findings"] if f["kind"] == "roofline_bound"]
    assert "latency-bound" in f["title"] and s["coverage_pct"] >= 50


def _one_op_lake(tmp_path, device_props, with_shapes=True):
    bf = "c10::BFloat16"
    dims = [[4096, 4096], [4096, 4096]] if with_shapes else []
    op = _op("aten::mm", 10, 20, 1, dims, [bf, bf])
    if not with_shapes:  # as the profiler writes it without record_shapes: no Input Dims / type args
        op["args"] = {"External id": 1}
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 1000, pid=10, tid=10),
        op,
        _launch(15, 1, 1),
        _kernel("gemm_bf16", 100, 200, 1, 1, 1024),
    ]
    write_trace(tmp_path / "job" / "r0.json", ev, deviceProperties=device_props)
    lake = Lake(tmp_path / "lake")
    assert {r.status for r in ingest_paths([tmp_path / "job"], lake, jobs=1)} == {"ok"}
    return lake


def test_abstains_without_shapes(tmp_path):
    doc = analyze(_one_op_lake(tmp_path, H100, with_shapes=False))
    assert doc["roofline"] == [] and doc["roofline_summary"] == []
    assert any("roofline not available: no op in the trace has input shapes" in n for n in doc["notes"])


def test_abstains_on_an_unknown_device(tmp_path):
    """A device the catalog does not know: the kernel's work and achieved rate are there, its
    roof, roof_pct, bound and lost time are not (never a guessed peak), and a note says so."""
    lake = _one_op_lake(tmp_path, [{"id": 0, "name": "Mystery Accelerator X1", "numSms": 100}])
    con = query.connect(lake)
    (r,) = pl.from_arrow(con.sql("SELECT * FROM kernel_roofline").to_arrow_table()).to_dicts()
    assert r["flops"] == 2 * 4096**3 and r["achieved_tflops"] == pytest.approx(687.19, abs=0.01)
    assert r["peak_tflops"] is None and r["roof_tflops"] is None and r["roof_pct"] is None
    assert r["bound"] == "unknown" and r["lost_ns"] is None
    doc = analyze(lake)
    assert any("roofline without roofs" in n and "Mystery Accelerator X1" in n for n in doc["notes"])
    assert "roofline_bound" not in {f["kind"] for f in doc["findings"]}


# ---------------------------------------------------------------- hostile shapes (attack run)


@pytest.mark.parametrize(
    "name, dims, types, concrete",
    [
        ("aten::mm", [[[4096], 4096], [4096, 4096]], ["float", "float"], None),  # nested list
        ("aten::mm", {"a": [1]}, ["float"], None),  # not a list
        ("aten::mm", [["12", 2], [2, 3]], ["float", "float"], None),  # a string size
        ("aten::mm", [[-4096, 4096], [4096, 4096]], ["float", "float"], None),  # negative
        ("aten::mm", [[0, 4096], [4096, 4096]], ["float", "float"], None),  # empty: no work
        ("aten::bmm", [[2, -3, 4], [2, 4, 5]], ["float", "float"], None),
        # stride 0, and a 7x7 kernel over an unpadded 2x2 input (no output)
        ("aten::convolution", [[1, 3, 8, 8], [4, 3, 3, 3], []], ["float"] * 3,
         ["", "", "", "[0, 0]", "[0, 0]", "[1, 1]", "False", "[0, 0]", "1"]),
        ("aten::convolution", [[1, 3, 2, 2], [4, 3, 7, 7], []], ["float"] * 3,
         ["", "", "", "[1, 1]", "[0, 0]", "[1, 1]", "False", "[0, 0]", "1"]),
    ],
)  # fmt: skip
def test_hostile_shapes_are_not_modelled(name, dims, types, concrete):
    from pipeline.flops import op_flops

    assert op_flops(name, dims, types, concrete) == (None, None)
    assert opbytes.op_bytes(name, dims, types, concrete) == (None, None)


def test_out_tensor_is_written_not_read():
    """The tb_plugin ResNet-50 trace (kineto/tb_plugin/samples/resnet50_num_workers_0) records
    aten::clamp_min(self, min, out) as Input Dims [[32, 512, 7, 7], [], [32, 512, 7, 7]], Input type
    ["float", "Int", "float"]: x (802,816 floats) read and the out= tensor written, 6,422,528 B;
    the Int is a Python number, not a tensor."""
    got = opbytes.op_bytes(
        "aten::clamp_min", [[32, 512, 7, 7], [], [32, 512, 7, 7]], ["float", "Int", "float"]
    )
    assert got == (2 * 802_816 * 4.0, 802_816.0)


def test_b200_symmetric_memory_all_reduce_is_communication(tmp_path):
    """The B200 vLLM trace's symm_mem::multimem_all_reduce_ ops launch multimem_all_reduce_kernel,
    a name no NCCL rule knows: by the launching op (External id, classification.toml
    comm_host_ops) they are communication, not compute that the roofline would then model."""
    d = json.loads(gzip.decompress(_b200().read_bytes()))
    ext = {
        e["args"]["External id"] for e in d["traceEvents"] if str(e.get("name", "")).startswith("symm_mem::")
    }
    want = sum(
        1 for e in d["traceEvents"] if e.get("cat") == "kernel" and e["args"].get("External id") in ext
    )
    assert want == 73
    lake = Lake(tmp_path / "lake")
    ingest_paths([_b200()], lake, jobs=1)
    got = (
        query.connect(lake)
        .execute(
            "SELECT count(*) FILTER (WHERE category = 'communication'), count(*) FROM gpu_activities "
            "WHERE name LIKE '%multimem_all_reduce%'"
        )
        .fetchall()[0]
    )
    assert got == (want, want)

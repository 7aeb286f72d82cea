"""pipeline/kernelname.py on kernel names read from corpus traces (each test names its file, and
checks that the names are really in it)."""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import corpus

from pipeline.kernelname import MAX_LEN, hover_name, short_name, short_names

DLRM0 = (
    "param",
    "et_replay",
    "tests",
    "inputs",
    "dlrm_kineto",
    "worker0_step_12.1694128201545.pt.trace.json",
)
CONTROL = ("hta", "tests", "data", "trace_diff", "control", "control.json.gz")
B200 = ("tracelens", "tests", "traces", "b200", "eager_trace.json.gz")
SGLANG = ("tracelens", "tests", "traces", "inference", "sglang_decode", "sglang_Qwen3-8B_decode.json.gz")
BACKWARD = ("hta", "tests", "data", "call_stack", "backward_thread.json")
SPIN = ("hta", "tests", "data", "critical_path", "cuda_event_sync", "event_sync_trace.json.gz")

_NAMES: dict[tuple, set[str]] = {}


def gpu_names(*parts: str) -> set[str]:
    """The kernel, memcpy and memset names of a corpus trace."""
    if parts not in _NAMES:
        p = corpus(*parts)
        with gzip.open(p, "rt") if p.suffix == ".gz" else open(p) as f:
            ev = json.load(f)["traceEvents"]
        _NAMES[parts] = {
            e["name"] for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "name" in e
        }
    return _NAMES[parts]


@pytest.mark.parametrize(
    "src, name, short",
    [
        (
            CONTROL,
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
            "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, "
            "at::detail::Array<char*, 3>)",
            "vectorized_elementwise_kernel",
        ),
        (CONTROL, "ampere_sgemm_128x64_nn", "ampere_sgemm_128x64_nn"),
        (
            DLRM0,
            "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
            "ncclKernel_AllReduce_RING_LL_Sum_float",
        ),
        (
            B200,
            "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            "ncclDevKernel_AllGather_RING_LL",
        ),
        # a wrapper names its template argument
        (
            BACKWARD,
            "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>",
            "cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4",
        ),
        (SPIN, "at::cuda::(anonymous namespace)::spin_kernel(long)", "spin_kernel"),
        # Itanium-mangled (ROCm aiter): the last nested name
        (
            SGLANG,
            "_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi64ELi8ELb0ELb0ELb1ELi1EEEvPT0_PT_PfS4_S4_S4_diiiiiiib",
            "add_rmsnorm_quant_kernel",
        ),
        # not a C++ signature: kept
        (DLRM0, "Memcpy HtoD (Pageable -> Device)", "Memcpy HtoD (Pageable -> Device)"),
    ],
)
def test_short_name_of_corpus_kernels(src, name, short):
    assert name in gpu_names(*src)
    assert short_name(name) == short
    assert short_names([name]) == {name: short}


def test_colliding_names_stay_distinct():
    """DLRM rank 0 has 19 vectorized_elementwise_kernel instances (and several elementwise_kernel,
    reduce_kernel, CatArrayBatchedCopy ones): each gets its own label, told apart by the template
    argument where they differ."""
    names = gpu_names(*DLRM0)
    labels = short_names(names)
    assert len(set(labels.values())) == len(names)
    vec = {n: lab for n, lab in labels.items() if short_name(n) == "vectorized_elementwise_kernel"}
    assert len(vec) == 19
    add = (
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<{t}>, at::detail::"
        "Array<char*, 3> >(int, at::native::CUDAFunctor_add<{t}>, at::detail::Array<char*, 3>)"
    )
    assert vec[add.format(t="float")] == "vectorized_elementwise_kernel [CUDAFunctor_add<float>]"
    assert vec[add.format(t="long")] == "vectorized_elementwise_kernel [CUDAFunctor_add<long>]"
    mul = next(
        n for n in vec if "BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor" in n
    )
    assert vec[mul] == "vectorized_elementwise_kernel [BinaryFunctor<float, float, float, MulFunctor<float>>]"
    # a lambda's kernel is named by the function it is in
    exp = next(n for n in vec if "exp_kernel_cuda" in n)
    assert vec[exp] == "vectorized_elementwise_kernel [exp_kernel_cuda]"
    # the wrapper elementwise_kernel<128, 2, gpu_kernel_impl<F>> is told apart by F
    ew = next(
        n
        for n in names
        if n.startswith(
            "void at::native::elementwise_kernel<128, 2, "
            "at::native::gpu_kernel_impl<at::native::CUDAFunctor_add<float>"
        )
    )
    assert labels[ew] == "elementwise_kernel [CUDAFunctor_add<float>]"
    # two direct_copy instances whose names differ only inside their lambdas: numbered
    copies = sorted(
        lab for n, lab in labels.items() if lab.startswith("unrolled_elementwise_kernel [direct_copy")
    )
    assert copies == [
        "unrolled_elementwise_kernel [direct_copy_kernel_cuda] #1",
        "unrolled_elementwise_kernel [direct_copy_kernel_cuda] #2",
    ]
    assert all(len(short_name(n)) <= MAX_LEN for n in names)


def test_long_plain_names_are_cut_and_told_apart():
    """Two split_embedding backward kernels of DLRM rank 0 share their first MAX_LEN characters."""
    names = [
        n
        for n in gpu_names(*DLRM0)
        if n.startswith("void split_embedding_backward_codegen_adagrad_unweighted_kernel_")
    ]
    assert len(names) == 2
    labels = short_names(names)
    head = "split_embedding_backward_codegen_adagrad_unweighted_kernel_…"
    assert sorted(labels.values()) == [
        f"{head} [cta_per_row_1_float_float_float_1ul_8]",
        f"{head} [warp_per_row_1_float_float_float_1ul_8]",
    ]
    long = max(gpu_names(*DLRM0), key=len)
    assert len(hover_name(long)) <= 600 and hover_name("ampere_sgemm_128x64_nn") == "ampere_sgemm_128x64_nn"

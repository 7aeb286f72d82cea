"""The shape of the `tracelake.analyze/5` document (docs/analyze-json.md): its schema name, its
scalar keys (header: the options it was computed with) and its lists (LIST_KEYS, each row holding
its run_id; "notes" follows them). Light on purpose (no polars, pyarrow or DuckDB): analyze()
assembles kept results with it alone (pipeline/analyze.py)."""

from __future__ import annotations

SCHEMA = "tracelake.analyze/5"

# the document's lists, in its order: each row holds its run_id (pipeline/analyze.py cuts the
# document into runs by it); "notes" follows them
LIST_KEYS = (
    "runs",
    "idle_streams",
    "steps",
    "ranks",
    "collectives",
    "collectives_per_rank",
    "collective_exposure",
    "stragglers",
    "memcpy",
    "top_kernels",
    "step_time",
    "idle_gaps",
    "step_kernels",
    "phases",
    "roofline",
    "roofline_summary",
    "throughput",
    "energy",
    "gpu_metrics",
    "nccl_tests",
    "nccl_tests_bandwidth",
    "verdicts",
    "findings",
    "whatif",
    "critical_path",
)


def header(
    window: str = "all",
    kernel_wait_threshold_ns: int = 30_000,
    peak_tflops: float | None = None,
    model_flops_per_step: float | None = None,
    tokens_per_step: float | None = None,
    palm_flops_per_token: float | None = None,
    global_tokens_per_step: float | None = None,
    gpu_hour_cost: float | None = None,
    **_ignored,
) -> dict:
    """The document's scalar keys (before its lists): the schema name and the options it was
    computed with (docs/analyze-json.md)."""
    return {
        "schema": SCHEMA,
        "window": window,
        "peak_tflops_override": peak_tflops,
        "model_flops_per_step_override": model_flops_per_step,
        "model_inputs": {
            "tokens_per_step": tokens_per_step,
            "global_tokens_per_step": global_tokens_per_step,
            "palm_flops_per_token": palm_flops_per_token,
            "gpu_hour_cost": gpu_hour_cost,
        },
        "kernel_wait_threshold_ns": kernel_wait_threshold_ns,
    }

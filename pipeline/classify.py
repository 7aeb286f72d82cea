"""Classify GPU work as compute / communication / memory / sync / unknown.

Rules and their order live in pipeline/catalog/classification.toml (the only place they are
defined); this module applies them to a polars frame of GPU activities.
"""

from __future__ import annotations

import re
import warnings

import polars as pl

from . import catalog


def check_regex(pattern: str) -> None:
    """Raise re.error early for a user's pattern (--comm-pattern, --step-range), without printing
    Python's FutureWarnings about syntax it may read differently one day (a nested set such as
    [[:alpha:]]): the user gets one error line or none."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        re.compile(pattern)


def _any_regex(patterns: list[str]) -> str | None:
    pats = [p for p in patterns if p]
    if not pats:
        return None
    for p in pats:
        check_regex(p)  # raise re.error early with the user's pattern
    return "|".join(f"(?:{p})" for p in pats)


def comm_host_op_regex() -> str:
    return _any_regex(catalog.classification()["comm_host_ops"])


def classify(
    gpu: pl.DataFrame | pl.LazyFrame, comm_ext_ids: pl.Series | None, user_patterns: list[str] | None = None
) -> pl.DataFrame | pl.LazyFrame:
    """Add `category` and `classified_by` to a frame with columns kind, name, external_id and
    has_comm_args (bool: the event's args carry collective metadata); a lazy frame gives a lazy
    frame (the caller collects it with the rest of its plan).

    comm_ext_ids: External ids of host ops matching comm_host_ops (the "correlation" rule).
    An optional bool column `comm_launch` marks work whose launch the input ties to a
    communication call in another way (nsys: launched inside an NCCL NVTX range); it counts for
    the same rule.
    user_patterns: extra communication regexes (--comm-pattern); re.error if one is invalid.
    """
    rules = catalog.classification()
    name_re = _any_regex(rules["comm_name_patterns"])
    mem_re = _any_regex(rules["memory_name_patterns"])
    user_re = _any_regex(user_patterns or [])
    ids = comm_ext_ids if comm_ext_ids is not None else pl.Series([], dtype=pl.Int64)
    is_kernel = pl.col("kind") == "kernel"
    by_corr = pl.col("external_id").is_in(ids.implode()) if len(ids) else pl.lit(False)
    if "comm_launch" in gpu.collect_schema().names():
        by_corr = by_corr.fill_null(False) | pl.col("comm_launch").fill_null(False)
    by_user = pl.col("name").str.contains(user_re) if user_re else pl.lit(False)
    expr_by = (
        pl.when(pl.col("kind").is_in(["memcpy", "memset", "sync"]))
        .then(pl.lit("kind"))
        .when(pl.col("kind") == "unknown")
        .then(pl.lit("kind"))
        .when(is_kernel & pl.col("has_comm_args"))
        .then(pl.lit("args"))
        .when(is_kernel & by_corr.fill_null(False))
        .then(pl.lit("correlation"))
        .when(is_kernel & by_user)
        .then(pl.lit("user_pattern"))
        .when(is_kernel & pl.col("name").str.contains(name_re))
        .then(pl.lit("name"))
        .when(is_kernel & pl.col("name").str.contains(mem_re))
        .then(pl.lit("memory_name"))
        .otherwise(pl.lit("default"))
    )
    expr_cat = (
        pl.when(pl.col("kind").is_in(["memcpy", "memset"]) | (pl.col("classified_by") == "memory_name"))
        .then(pl.lit("memory"))
        .when(pl.col("kind") == "sync")
        .then(pl.lit("sync"))
        .when(pl.col("kind") == "unknown")
        .then(pl.lit("unknown"))
        .when(pl.col("classified_by").is_in(["args", "correlation", "user_pattern", "name"]))
        .then(pl.lit("communication"))
        .otherwise(pl.lit("compute"))
    )
    return gpu.with_columns(classified_by=expr_by).with_columns(category=expr_cat)

"""The basis a run's timed findings are measured on (pipeline/diagnosis/findings.py).

On the verdict's "steps" basis (pipeline/diagnosis/verdict.py) the rows are the run's step_time
rows of the analysed steps (queries/step_time.sql, one per rank and step); on the "trace" basis
(no usable steps) its breakdown rows at level 'rank' (queries/breakdown.sql, one per rank, the
whole trace). Basis.get maps a cause to the column holding its time in those rows, so a finding
reads "exposed transfer" the same way on either basis. A cause's share is its time summed over
the rows, over the rows' total time (step_ns or span_ns summed), in percent; its recoverable time
is that sum averaged over ranks (docs of findings.py).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from .steady import kept_rows

# the priority breakdown's columns per cause (queries/step_time.sql, queries/breakdown.sql)
_STEP_COLUMNS = {
    "total": "step_ns",
    "exposed_comm": "exposed_comm_ns",
    "exposed_memory": "exposed_memory_ns",
    "idle": "idle_ns",
    "exposed_wait": "exposed_comm_wait_ns",
    "exposed_transfer": "exposed_comm_transfer_ns",
    "input": "idle_input_ns",
    "host_wait": "idle_host_wait_ns",
    "kernel_wait": "idle_kernel_wait_ns",
    "other": "idle_other_ns",
    "unreliable": "idle_unreliable_ns",
    "comm": "comm_ns",
    "overlap": "overlap_ns",
}
# the whole trace has no DataLoader split (breakdown.sql): idle while loading data falls in the
# other idle causes there
_TRACE_COLUMNS = {
    **_STEP_COLUMNS,
    "total": "span_ns",
    "exposed_memory": "exposed_memcpy_ns",
    "idle": "gpu_idle_ns",
    "input": None,
}


def quote(run_id: str) -> str:
    """run_id as the inside of an SQL string literal."""
    return run_id.replace("'", "''")


def ms(ns) -> str:
    """ns (int or float nanoseconds, or None) as 'N.NNN ms', or 'n/a'."""
    return "n/a" if ns is None else f"{ns / 1e6:,.3f} ms"


def median(xs):
    """Median of the values of xs that are not None, or None when there are none."""
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


@dataclass
class Basis:
    """One run's rows on its verdict's basis. rows: dicts of step_time or breakdown rows;
    analysed: the analysed steps (None on the whole-trace basis); sql: a query that selects the
    same rows' columns from the metric views."""

    run_id: str
    kind: str  # "steps" or "trace" (the verdict's basis)
    rows: list[dict]
    get: dict[str, str | None]
    analysed: set | None
    sql: str

    def __post_init__(self) -> None:
        self.n_ranks = len({r["rank"] for r in self.rows})
        self.n_steps = len({r["step"] for r in self.rows}) if self.kind == "steps" else None
        self.basis_total = self.total("total")
        self.of = "of step time" if self.kind == "steps" else "of GPU time (whole trace)"
        self.over = f"over {self.n_steps} step(s)" if self.n_steps else "over the trace"

    def total(self, key: str) -> int:
        """The cause's time (ns) summed over the rows; 0 where the basis has no column for it."""
        col = self.get[key]
        return 0 if col is None else sum(r[col] or 0 for r in self.rows)

    def share(self, ns: float) -> float:
        """ns as a percentage of the basis' total time."""
        return 100 * ns / self.basis_total

    def timing(self, key_total: float) -> dict:
        """recoverable_ns (key_total averaged over ranks) and per_step_ns (that per step, None on
        the whole-trace basis), as ints."""
        rec = key_total / self.n_ranks
        return {"recoverable_ns": int(rec), "per_step_ns": int(rec / self.n_steps) if self.n_steps else None}

    def by_rank(self, key: str) -> dict[int, int]:
        """The cause's time (ns) per rank."""
        out: dict[int, int] = {}
        for r in self.rows:
            out[r["rank"]] = out.get(r["rank"], 0) + (r[self.get[key]] or 0)
        return out


def basis_for_run(run_id: str, result: dict, v: dict) -> Basis | None:
    """The basis of run_id's verdict v in an analysis result (pipeline.analyze.analyze: its
    step_time rows for the steps basis, its ranks rows otherwise); None when the verdict has no
    basis, the basis holds no rows, or its total time is not positive."""
    q = quote(run_id)
    if v["basis"] is None:
        return None
    if v["basis"] == "steps":
        rows = kept_rows([s for s in result["step_time"] if s["run_id"] == run_id], v)
        b = Basis(
            run_id,
            "steps",
            rows,
            _STEP_COLUMNS,
            {s["step"] for s in rows},
            "SELECT rank, step, step_ns, compute_ns, exposed_comm_ns, exposed_comm_wait_ns, "
            "exposed_comm_transfer_ns, exposed_memory_ns, idle_ns, idle_input_ns, idle_host_wait_ns, "
            f"idle_kernel_wait_ns, idle_other_ns FROM step_time WHERE run_id = '{q}'",
        )
    else:
        b = Basis(
            run_id,
            "trace",
            [r for r in result["ranks"] if r["run_id"] == run_id],
            _TRACE_COLUMNS,
            None,
            "SELECT rank, span_ns, compute_ns, exposed_comm_ns, exposed_comm_wait_ns, "
            "exposed_comm_transfer_ns, exposed_memory_ns, gpu_idle_ns, idle_host_wait_ns, "
            f"idle_kernel_wait_ns, idle_other_ns FROM breakdown WHERE level = 'rank' AND run_id = '{q}'",
        )
    return b if b.rows and b.basis_total > 0 else None

"""The thread pools of tracelake's own processes: numpy's OpenBLAS and polars on one thread in
the CLI (every command) and OpenBLAS on one in the ingest pool's workers (their polars pool is
sized by pipeline/pool_scope.py worker_env). A value the user set is always kept.

OpenBLAS: numpy's wheels bundle it, and it starts one thread per core when numpy is imported
(pyarrow imports numpy) and lets them spin: on the 2-core project machine `import numpy` costs
0.099 CPU-s for 0.052 s of wall, 0.050 CPU-s with OPENBLAS_NUM_THREADS=1, and PARAM's 8-rank
DLRM job's `tracelake run` 1.38 against 1.51 CPU-s (medians of eight alternated runs;
docs/performance.md, Small job, "Third round"). tracelake makes no BLAS call (no matrix products;
numpy serves as arrays), so the threads only cost. OpenBLAS reads OPENBLAS_NUM_THREADS, then
GOTO_NUM_THREADS, then OMP_NUM_THREADS, once, when it loads (OpenBLAS's README, "Setting the
number of threads using environment variables").

Polars: its pool's threads wake, spin (sched_yield) and sleep again around each of the many small
frames the commands build, without sharing out any work (ingest's parallelism is files side by
side; the analysis' is DuckDB's): `tracelake analyze` of the DLRM lake 0.95 -> 0.86 user CPU-s
and no sched_yield calls left (strace -c: 4,310 before); the 64 ranks x 100k kernels lake's
`analyze` 7.9-8.2 s either way and its what-if (benchmarks/whatif_bench.py) 8.76 against 9.00 s,
so nothing large gets slower. Polars reads POLARS_MAX_THREADS once, when it is imported.

- one_blas_thread_env() -> dict: {"OPENBLAS_NUM_THREADS": "1"} to add to a process's environment
  before it imports numpy, or {} when the user chose (any of the three set and not empty).
- user_set(name) -> bool: the rule above, also pool_scope.forkserver_started's.
- set_cli_threads(): both variables set in os.environ for this process (and the processes it
  starts), each unless the user set it or its library is imported already (later it would change
  nothing): called by the CLI's package before any command imports numpy or polars.
"""

from __future__ import annotations

import os
import sys

BLAS_VARIABLES = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")


def user_set(name: str) -> bool:
    """Whether the environment variable is set to something (an empty or blank value, as polars
    and OpenBLAS read it, is unset)."""
    return bool(os.environ.get(name, "").strip())


def one_blas_thread_env() -> dict[str, str]:
    if any(user_set(k) for k in BLAS_VARIABLES):
        return {}
    return {"OPENBLAS_NUM_THREADS": "1"}


def set_cli_threads() -> None:
    if "numpy" not in sys.modules:
        os.environ.update(one_blas_thread_env())
    if "polars" not in sys.modules and not user_set("POLARS_MAX_THREADS"):
        os.environ["POLARS_MAX_THREADS"] = "1"

"""OpenBLAS on one thread in tracelake's own processes (the CLI and the ingest pool's workers).

numpy's wheels bundle OpenBLAS, which starts one thread per core when numpy is imported (pyarrow
imports numpy) and lets them spin: on the 2-core project machine `import numpy` costs 0.099 CPU-s
for 0.052 s of wall, 0.050 CPU-s with OPENBLAS_NUM_THREADS=1, and PARAM's 8-rank DLRM job's
`tracelake run` 1.38 against 1.51 CPU-s (medians of eight alternated runs; docs/performance.md,
Small job, "Third round"). tracelake makes no BLAS call (no matrix products; numpy serves as
arrays), so the threads only cost. OpenBLAS reads OPENBLAS_NUM_THREADS, then GOTO_NUM_THREADS,
then OMP_NUM_THREADS, once, when it loads (OpenBLAS's README, "Setting the number of threads
using environment variables"); a value the user set in any of them is kept.

- one_thread_env() -> dict: {"OPENBLAS_NUM_THREADS": "1"} to add to a process's environment
  before it imports numpy, or {} when the user chose (any of the three set and not empty).
- set_one_thread(): adds it to os.environ when numpy is not imported yet (later it changes
  nothing): called by the CLI's package before anything imports numpy.
"""

from __future__ import annotations

import os
import sys

VARIABLES = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")


def one_thread_env() -> dict[str, str]:
    if any(os.environ.get(k, "").strip() for k in VARIABLES):
        return {}
    return {"OPENBLAS_NUM_THREADS": "1"}


def set_one_thread() -> None:
    if "numpy" not in sys.modules:
        os.environ.update(one_thread_env())

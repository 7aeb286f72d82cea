"""Attack 6: failing tests for this round's fixes that still leave a gap.

1. Nsight Systems steps (pipeline/ingest/nsys/steps.py): a rank whose NVTX ranges repeat a step
   number is numbered by its ranges' order (0, 1, 2, ...) while the other ranks of the run keep the
   numbers in their names (10, 11, 12): the same three iterations become six steps of one rank
   each, and no per-step comparison across ranks lines up any more (at af875a3 steps 10 and 11
   still did).
2. output_failed (pipeline/cli/app.py): `tracelake --version` and `tracelake --help` on a full
   stdout still end in an OSError traceback, exit 1 (the subcommands give one line, exit 4).
"""

from __future__ import annotations

import subprocess
import sys

from nsys_handmade import MS, export

from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
from pipeline.query import connect


def test_a_rank_repeating_a_step_number_keeps_its_steps_aligned_with_the_other_ranks(tmp_path):
    names = {
        0: ("ProfilerStep#10", "ProfilerStep#11", "ProfilerStep#11"),  # one repeated number
        1: ("ProfilerStep#10", "ProfilerStep#11", "ProfilerStep#12"),
    }
    lake = Lake(tmp_path / "lake")
    for rank, ns in names.items():
        f = tmp_path / f"r{rank}.sqlite"
        export(f, 3, nvtx=[(k * 10 * MS, (k + 1) * 10 * MS, n) for k, n in enumerate(ns)])
        assert ingest_paths([f], lake, run="job", rank=rank)[0].status == "ok"
    rows = connect(lake).execute("SELECT rank, step, start_ns FROM steps ORDER BY rank, start_ns").fetchall()
    by_rank = {r: [(s, t) for rr, s, t in rows if rr == r] for r in names}
    assert len(by_rank[0]) == len(by_rank[1]) == 3, rows
    # the same windows (the same iterations on both ranks) carry the same step numbers
    assert by_rank[0] == by_rank[1], rows


def _full_stdout(*args: str) -> subprocess.CompletedProcess:
    with open("/dev/full", "w") as full:
        return subprocess.run(
            [sys.executable, "-m", "pipeline.cli", *args],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )


def test_version_and_help_on_a_full_stdout_are_one_line_and_exit_4():
    for args in (["--version"], ["--help"]):
        p = _full_stdout(*args)
        assert "Traceback" not in p.stderr, (args, p.stderr[-400:])
        assert p.returncode == 4, (args, p.returncode)
        assert len(p.stderr.strip().splitlines()) == 1, (args, p.stderr)

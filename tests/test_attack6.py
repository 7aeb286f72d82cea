"""Attack 6: failing tests for this round's fixes that still leave a gap.

1. Nsight Systems steps (pipeline/ingest/nsys/steps.py): a rank whose NVTX ranges repeat a step
   number is numbered by its ranges' order (0, 1, 2, ...) while the other ranks of the run keep the
   numbers in their names (10, 11, 12): the same three iterations become six steps of one rank
   each, and no per-step comparison across ranks lines up any more (at af875a3 steps 10 and 11
   still did).
0. local_comm_cover (queries/local/comm_cover.sql): the unions' pieces are numbered in two window
   passes (`marked`: prev_end; `numbered`: the running count of new pieces) ordered by
   (start_ns, end_ns) alone; two activities of the same interval (here two 0-ns kernels at 1267)
   may come in one order in the first pass and the other in the second, and the one whose
   prev_end already holds its twin's end then counts into the piece before: compute [1238, 1238]
   became [1238, 1267], and collective_exposure read through the per-source results says 2 ns
   exposed where the full file and a walk of every ns say 31 (at af875a3 too).
2. output_failed (pipeline/cli/app.py): `tracelake --version` and `tracelake --help` on a full
   stdout still end in an OSError traceback, exit 1 (the subcommands give one line, exit 4).
"""

from __future__ import annotations

import subprocess
import sys

from nsys_handmade import MS, export
from test_interval_property import collective_lake

from pipeline import local_fill, query
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake


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
    rows = (
        query.connect(lake)
        .execute("SELECT rank, step, start_ns FROM steps ORDER BY rank, start_ns")
        .fetchall()
    )
    by_rank = {r: [(s, t) for rr, s, t in rows if rr == r] for r in names}
    assert len(by_rank[0]) == len(by_rank[1]) == 3, rows
    # the same windows (the same iterations on both ranks) carry the same step numbers
    assert by_rank[0] == by_rank[1], rows


# one rank: one all-reduce kernel (1207, +60) among compute kernels (start, duration)
_COMPUTE = [
    (1, 20), (22, 5), (32, 5), (37, 0), (38, 1), (1207, 0), (1267, 0), (1267, 0), (1268, 7),
    (1275, 40), (1238, 0), (2355, 5), (2361, 8), (2427, 5), (2437, 36), (2473, 5), (2478, 18),
    (2278, 5), (2283, 47), (2331, 47), (2379, 5), (1699, 15), (1714, 1), (622, 47), (1144, 1),
    (1145, 47), (1192, 5), (1197, 34), (1232, 5),
]  # fmt: skip


def test_per_source_compute_pieces_survive_two_kernels_of_one_interval(tmp_path):
    acts = [(s, d, False, 0) for s, d in _COMPUTE]
    acts.insert(6, (1207, 60, True, 0))
    lake = collective_lake(tmp_path, {1: acts})
    assert local_fill.backfill(lake, min_rows=0) == 1
    comp = [(s, s + d) for s, d in _COMPUTE]
    exposed = sum(1 for t in range(1207, 1267) if not any(a <= t < b for a, b in comp))
    assert exposed == 31
    con, ref = query.connect(lake), query.connect(lake, local_results=False)
    assert query.run(ref, "collective_exposure")["exposed_ns"].to_list() == [exposed]
    pieces = con.execute(
        "SELECT start_ns, end_ns FROM local_comm_cover WHERE level = 'rank' ORDER BY 1"
    ).fetchall()
    assert pieces == [(1207, 1231), (1232, 1237), (1238, 1238)], pieces
    assert query.run(con, "collective_exposure")["exposed_ns"].to_list() == [exposed]


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


def test_a_closed_standard_output_fails_in_one_line_only_where_the_command_prints(tmp_path):
    """`tracelake runs >&-`: Python sets sys.stdout to None and the CLI's import raised
    AttributeError (a traceback, exit 1) for every command. A command that prints its answer on
    standard output now says it cannot, exit 4; an ingest with -q, which prints there nothing,
    succeeds."""
    import os

    from conftest import REPO

    def closed(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "pipeline.cli", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            preexec_fn=lambda: os.close(1),
        )

    lake = tmp_path / "lake"
    p = closed("ingest", str(REPO / "sample_traces"), "--lake", str(lake), "-q")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    p = closed("runs", "--lake", str(lake))
    assert p.returncode == 4, p.stderr
    assert p.stderr == "error: cannot write standard output: standard output is closed\n", p.stderr

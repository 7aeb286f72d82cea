"""A small seeded sample of the fuzzing harness (tests/fuzz/run.py) for every format: hostile
mutations of real corpus files, ingested in batches beside a good trace, must give no hang, no
traceback, no input over 4 GB of RSS, no file unaccounted for and the good file ingested. The
sample holds the kinds issue 39 found (a large string shared by every entry of a pickle, keys made
to share one hash in a pickle and (pid, tid) pairs of one tuple hash in a Kineto trace, a log
whose every line opens a process). The full runs (N >= 1000 per format, new seeds) are
`python -m tests.fuzz.run --n 1000 --seed S`; their figures are in docs/performance.md."""

from __future__ import annotations

import random
import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO))  # tests.fuzz is imported as a package from the repository root

from tests.fuzz import mutators, run  # noqa: E402
from tests.fuzz.mutators import FORMATS  # noqa: E402

SEED, N = 2026, 8


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_seeded_sample_of_hostile_inputs_is_handled(fmt, capsys):
    code = run.main(
        ["--format", fmt, "--n", str(N), "--batch", str(N), "--seed", str(SEED), "--timeout", "240"]
    )
    out = capsys.readouterr()
    assert code == 0, out.out + out.err


def test_the_sample_holds_the_kinds_issue_39_found(monkeypatch):
    used = []
    for name in ("shared_string_pickle", "colliding_pickle", "colliding_threads", "new_processes"):
        real = getattr(mutators, name)
        monkeypatch.setattr(mutators, name, lambda *a, _f=real, _n=name: used.append(_n) or _f(*a))
    for fmt in ("kineto", "nccl", "pickle"):
        rng = random.Random(f"{SEED}:{fmt}")  # as run.main seeds each format
        for _ in range(N):
            mutators.mutate(fmt, rng)
    assert set(used) == {"shared_string_pickle", "colliding_pickle", "colliding_threads", "new_processes"}

"""A small seeded sample of the fuzzing harness (tests/fuzz/run.py) for every format: hostile
mutations of real corpus files, ingested in batches beside a good trace, must give no hang, no
traceback, no input over 4 GB of RSS, no file unaccounted for and the good file ingested. The
full runs (N >= 1000 per format) are `python -m tests.fuzz.run --n 1000`."""

from __future__ import annotations

import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO))  # tests.fuzz is imported as a package from the repository root

from tests.fuzz import run  # noqa: E402
from tests.fuzz.mutators import FORMATS  # noqa: E402


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_seeded_sample_of_hostile_inputs_is_handled(fmt, capsys):
    code = run.main(["--format", fmt, "--n", "8", "--batch", "8", "--seed", "2026", "--timeout", "240"])
    out = capsys.readouterr()
    assert code == 0, out.out + out.err

"""What a command imports (issue 38 item 2: environment-dependent slowdowns caught if they return).

In an environment that also holds pandas (the test extra, what a notebook environment looks like),
`pyarrow.parquet.read_table` goes through pyarrow.dataset, which imports pandas: 0.3 s in every
process that reads one `sources` part that way (measured on the 1,000-file archive lake:
benchmarks/archive_bench.py; docs/performance.md). Ingest, analysis and the report read Parquet
with ParquetFile instead; a fresh interpreter checks that neither pandas nor pyarrow.dataset is
imported by the whole of `tracelake run` on sample_traces/, nor pyarrow.compute (32-37 ms of
wrappers and docstrings built at import; the kernels are called through pipeline/arrow_calls.py),
nor rich.progress when no bar is shown (-q: cli/app.py's NoBar), nor tomllib once the TOML data
files have their kept JSON copies (14-20 ms of regex compilation at its import: toml_data.py),
and that the run's minor page faults stay within a few times those of its imports
(MAX_RUN_FAULTS_PER_IMPORT_FAULT: the mmap storm of issue 38 item 2, should it come back)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from conftest import REPO

SCRIPT = """
import resource, sys
sys.argv = ["tracelake", "run", sys.argv[1], "--lake", sys.argv[2], "-o", sys.argv[3], "-q"]
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
import pipeline.analyze_compute, pipeline.ingest, pipeline.report.html
from pipeline.cli import app
imported = faults()
try:
    app()
except SystemExit as e:
    assert not e.code, e.code
print("faults", imported, faults() - imported)
unwanted = ("pandas", "pyarrow.dataset", "pyarrow.compute", "rich.progress", "tomllib")
print(" ".join(m for m in unwanted if m in sys.modules) or "none")
"""
# `tracelake run`'s minor page faults at most this many times those of importing what it imports,
# in the same process (issue 38 item 2: in the test environment `run` once made about 700,000
# mmap/munmap pairs, 5 s of system time, which the separate commands did not; each fresh mapping
# touched is a fault). Measured here (2026-12-04) on sample_traces/: 25k faults importing, 47k
# running (1.9x); the 700,000 pairs would be 28x.
MAX_RUN_FAULTS_PER_IMPORT_FAULT = 6


def test_run_imports_neither_pandas_nor_pyarrow_dataset_nor_compute(tmp_path):
    # the check means something only where pandas is installed (the test extra holds it)
    assert importlib.util.find_spec("pandas") is not None
    from pipeline import toml_data
    from pipeline.paths import CATALOG_DIR, SCHEMAS_DIR

    for f in [*SCHEMAS_DIR.glob("*.toml"), *CATALOG_DIR.glob("*.toml")]:  # their JSON copies kept
        toml_data.load(f)
    p = subprocess.run(
        [
            sys.executable,
            "-c",
            SCRIPT,
            str(REPO / "sample_traces"),
            str(tmp_path / "l"),
            str(tmp_path / "r.html"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "r.html").stat().st_size > 0
    assert p.stdout.strip().splitlines()[-1] == "none"
    _, imported, ran = p.stdout.strip().splitlines()[-2].split()
    print(f"minor page faults: {imported} importing, {ran} running")
    assert int(ran) <= MAX_RUN_FAULTS_PER_IMPORT_FAULT * int(imported), (imported, ran)

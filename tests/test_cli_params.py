"""The command's parameters converted without Pydantic (pipeline/cli/params.py) give what typer's
own converters give: every parameter of every command, value by value, errors included.

The reference is typer's own converter of the same parameter (typer._coercion.build_runtime_param,
what typer would use without plain_params), so the expected values come from typer, not from the
code under test. And what the shortcut is for: `--help`, a usage error and a command's parameters
left at their defaults import no Pydantic (issue 38: `tracelake run --help` spent 0.3 s of 0.45 s
importing it and building 25 adapters).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
from typer._coercion import build_runtime_param

from pipeline.cli import app
from pipeline.cli.params import _Plain, plain_params

SCALARS = [
    "x",
    "",
    " 12 ",
    "12",
    "-3",
    "0",
    "1.5",
    "1e3",
    "inf",
    "nan",
    "true",
    "-",
    "a b",
    "ünïcode",
    "bad\udcffname",  # a file name that is not UTF-8 (surrogate-escaped by Python)
    "/nonexistent/dir/x",
    0,
    30.0,
    1,
    True,
    Path("rel"),
]


def _outcome(fn):
    try:
        v = fn()
    except Exception as e:  # the same error, message included
        return ("raised", type(e).__name__, str(e))
    # repr: nan equals nan; each item's type counts (Path against str)
    return ("value", type(v).__name__, repr([(type(x), x) for x in v] if isinstance(v, (list, tuple)) else v))


def _params():
    group = typer.main.get_command(app)
    out = [("tracelake", group, p) for p in plain_params(group.get_params(group.context_class(group)))]
    for name, cmd in sorted(group.commands.items()):
        ctx = cmd.context_class(cmd, info_name=name)
        out += [(name, cmd, p) for p in cmd.get_params(ctx)]
    return out


def test_plain_conversion_equals_typers_own(tmp_path):
    (tmp_path / "f.json").write_text("{}")
    existing = [str(tmp_path), str(tmp_path / "f.json"), tmp_path / "f.json"]
    checked, plain = 0, 0
    for name, cmd, p in _params():
        if not isinstance(getattr(p, "_runtime_param", None), _Plain):
            continue
        plain += 1
        ctx = cmd.context_class(cmd, info_name=name)
        ours, full = p._runtime_param, build_runtime_param(p.type_descriptor)
        many = p.multiple or p.nargs == -1
        values = [None, p.default, *SCALARS, *existing]
        if many:
            values = [
                None,
                p.default,
                [],
                ["a", "b"],
                ("x",),
                [*existing],
                ["bad\udcffname"],
                [1.5],
                ["", "-"],
            ]
        for v in values:
            got = _outcome(lambda: ours.coerce(v, param=p, ctx=ctx))
            want = _outcome(lambda: full.coerce(v, param=p, ctx=ctx))
            assert got == want, (name, p.name, v)
            checked += 1
    # every command's parameters of a simple type take the shortcut (run has 25 of them)
    assert plain >= 100 and checked > 2000, (plain, checked)


@pytest.mark.parametrize(
    "args",
    [["--help"], ["run", "--help"], ["analyze", "--help"], ["run", "--bogus"], ["ingest"], ["--version"]],
)
def test_help_and_usage_errors_import_nothing_heavy(args):
    """`tracelake --help`, a command's help, a usage error: neither Pydantic (typer's converters),
    the lake (pyarrow, polars), DuckDB, altair, jsonschema nor rich (the consoles are made on first
    use: cli/app.py LazyConsole) is imported."""
    code = (
        "import sys\n"
        f"sys.argv = ['tracelake', *{args!r}]\n"
        "from pipeline.cli import app\n"
        "try:\n    app()\nexcept SystemExit as e:\n    code = e.code\n"
        "heavy = ('pydantic', 'pipeline.lake', 'pyarrow', 'polars', 'duckdb', 'altair', 'jsonschema',\n"
        "         'rich')\n"
        "print(code, [m for m in heavy if m in sys.modules])\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    last = p.stdout.strip().splitlines()[-1]
    want_code = 2 if args in (["run", "--bogus"], ["ingest"]) else 0
    assert last == f"{want_code} []", (p.stdout[-500:], p.stderr[-500:])
    if want_code == 2:  # still the one-line usage error
        assert p.stderr.startswith("error: ") and p.stderr.count("\n") == 1, p.stderr


def test_a_mistyped_path_imports_no_lake():
    """`tracelake run /no/such/dir` is a usage error found before ingest's imports: neither the
    lake (pyarrow, polars), DuckDB nor Pydantic is imported to say so (only rich, which prints it)."""
    code = (
        "import sys\n"
        "sys.argv = ['tracelake', 'run', '/no/such/dir/tracelake-test']\n"
        "from pipeline.cli import app\n"
        "try:\n    app()\nexcept SystemExit as e:\n    code = e.code\n"
        "heavy = ('pydantic', 'pipeline.lake', 'pyarrow', 'polars', 'duckdb', 'altair', 'jsonschema')\n"
        "print(code, [m for m in heavy if m in sys.modules])\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.stdout.strip().splitlines()[-1] == "2 []", (p.stdout[-500:], p.stderr[-500:])
    assert p.stderr == "error: /no/such/dir/tracelake-test: no such file or directory\n", p.stderr


def test_a_report_of_kept_results_over_an_existing_file_imports_no_ingest_nor_polars(tmp_path):
    """`tracelake report -f json -o FILE` (and the html report) where FILE exists and every run's
    result is kept: the check that FILE is not one of the inputs (report has none) imports no
    ingest package, and the kept results need no DuckDB (the ingest package imported both: 0.3-0.5
    s), nor polars or pyarrow (the diagnosis modules the document reads import them only for the
    analysis)."""
    from conftest import REPO

    from pipeline.analyze import analyze
    from pipeline.ingest import ingest_paths
    from pipeline.lake import Lake

    lake = Lake(tmp_path / "lake")
    assert all(r.status == "ok" for r in ingest_paths([REPO / "sample_traces"], lake))
    runs = [r["run_id"] for r in analyze(lake)["runs"]]  # kept
    out = tmp_path / "report.json"
    out.write_text("old")
    code = (
        "import sys\n"
        f"sys.argv = ['tracelake', 'report', '-f', 'json', '-o', {str(out)!r},\n"
        f"            '--lake', {str(lake.root)!r}, '-q']\n"
        "from pipeline.cli import app\n"
        "try:\n    app()\nexcept SystemExit as e:\n    code = e.code\n"
        "heavy = ('pipeline.ingest', 'duckdb', 'altair', 'polars', 'pyarrow')\n"
        "print(code, [m for m in heavy if m in sys.modules])\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert p.stdout.strip().splitlines()[-1] == "0 []", (p.stdout[-500:], p.stderr[-500:])
    assert [r["run_id"] for r in __import__("json").loads(out.read_text())["runs"]] == runs
    # the html report of the same kept run: its charts may need altair (while their templates are
    # not kept: pipeline/report/spec_cache.py; tests/test_chart_templates.py), still no polars, pyarrow,
    # numpy or DuckDB (the fleet view's schema, the bus bandwidth's medians and MFU's means no
    # longer go through polars: issue 38); the run has collectives, so busbw_chart is drawn
    page = tmp_path / "report.html"
    code = (
        code.replace("'-f', 'json', ", "")
        .replace(repr(str(out)), repr(str(page)))
        .replace("heavy = (", "heavy = ('numpy', ")
        .replace("'altair', ", "")
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert p.stdout.strip().splitlines()[-1] == "0 []", (p.stdout[-500:], p.stderr[-500:])
    assert "Collective bus bandwidth against message size" in page.read_text()


@pytest.mark.parametrize(
    ("command", "user"),
    [("ingest", None), ("run", None), ("analyze", None), ("sql", None), ("ingest", "2"), ("analyze", "")],
)
def test_every_command_runs_polars_on_one_thread(tmp_path, command, user):
    """Every command runs polars on one thread (pipeline/thread_env.py: ingest's parallelism is
    files side by side, the analysis' DuckDB's; polars' idle threads only spin), whatever the
    step-range or other options import first; a POLARS_MAX_THREADS the user set is kept (an empty
    one is unset, as polars reads it). Checked after the command, in its own interpreter: polars
    reads the variable once, at its first use."""
    import os

    from conftest import REPO

    lake = tmp_path / "lake"
    env = {k: v for k, v in os.environ.items() if k != "POLARS_MAX_THREADS"}
    if command in ("analyze", "sql"):  # a lake to read, made by another process
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "pipeline.cli",
                "ingest",
                str(REPO / "sample_traces"),
                "--lake",
                str(lake),
                "-q",
            ],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
        )
        assert p.returncode == 0, p.stderr[-500:]
    args = {
        "ingest": ["ingest", str(REPO / "sample_traces"), "--lake", str(lake), "-q", "--step-range", "."],
        "run": [
            "run",
            str(REPO / "sample_traces"),
            "--lake",
            str(lake),
            "-q",
            "-o",
            str(tmp_path / "r.html"),
        ],
        "analyze": ["analyze", "--lake", str(lake), "--json", "-q"],
        "sql": ["sql", "--lake", str(lake), "SELECT count(*) FROM gpu_activities"],
    }[command]
    code = (
        "import sys\n"
        f"sys.argv = ['tracelake', *{args!r}]\n"
        "from pipeline.cli import app\n"
        "try:\n    app()\nexcept SystemExit as e:\n    code = e.code\n"
        "import polars\n"
        "print(code, polars.thread_pool_size())\n"
    )
    if user is not None:  # "": set but empty, which polars reads as unset (all cores)
        env["POLARS_MAX_THREADS"] = user
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert p.stdout.strip().splitlines()[-1] == f"0 {user or 1}", (p.stdout[-500:], p.stderr[-500:])


BLAS_PROBE = """
import os, sys
from pipeline import cli  # the CLI's package: it sets the variable before any command imports numpy
assert "numpy" not in sys.modules
threads = lambda: len(os.listdir("/proc/self/task"))
before = threads()
import numpy
print(os.environ.get("OPENBLAS_NUM_THREADS"), threads() - before)
"""


@pytest.mark.parametrize(
    "user", [None, "OPENBLAS_NUM_THREADS=2", "OMP_NUM_THREADS=2", "OPENBLAS_NUM_THREADS="]
)
def test_the_cli_runs_openblas_on_one_thread_unless_the_user_chose(tmp_path, user):
    """pipeline/thread_env.py: numpy's OpenBLAS starts a thread per core at import, which only spins
    (tracelake makes no BLAS call); the CLI asks for one, unless the user set OPENBLAS_NUM_THREADS,
    GOTO_NUM_THREADS or OMP_NUM_THREADS (an empty value counts as unset). Counted in a fresh
    interpreter: the threads `import numpy` starts after the CLI's package is imported, against a
    plain interpreter's, which start one per core beyond the first."""
    import os

    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
    }
    env = dict(base)
    if user is not None:
        k, v = user.split("=")
        env[k] = v
    p = subprocess.run(
        [sys.executable, "-c", BLAS_PROBE], capture_output=True, text=True, cwd=tmp_path, env=env
    )
    value, started = p.stdout.split()
    cores = os.cpu_count() or 1
    if user in (None, "OPENBLAS_NUM_THREADS="):
        assert (value, int(started)) == ("1", 0), p.stderr[-500:]
    else:  # the user's choice: OpenBLAS's own threads, one per thread asked beyond the first
        assert value == user.split("=")[1] if user.startswith("OPENBLAS") else value == "None"
        assert int(started) == min(2, cores) - 1
    # the control: without the CLI, numpy's import starts cores - 1 threads (so the count above
    # can fail)
    plain = (
        "import os; n = len(os.listdir('/proc/self/task')); import numpy; "
        "print(len(os.listdir('/proc/self/task')) - n)"
    )
    q = subprocess.run([sys.executable, "-c", plain], capture_output=True, text=True, env=base)
    assert int(q.stdout) == cores - 1

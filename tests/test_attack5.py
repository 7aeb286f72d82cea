"""Attack 5: hostile inputs that still end a command in a Python traceback, wrap a time in the lake,
lose an archive member, or make the analysis of a 2.6 MB export take all the machine's memory.
Each case is a corpus file changed in one way (or a few handmade events); the rule they break
(docs/usage.md): bad input gets one line naming the file, never a traceback, and a command's
memory is bounded per stage, not by what the input claims.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tarfile

from conftest import CORPUS, REPO, X

NSYS = CORPUS / "nsys" / "nsys-ai" / "mfu_2gpu_before.sqlite"
RANK0 = CORPUS / "hta" / "tests" / "data" / "trace_filter" / "sampled_rank-0.json.gz"
RANK1 = CORPUS / "hta" / "tests" / "data" / "trace_filter" / "sampled_rank-1.json.gz"

LIMITED = """
import resource, runpy, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
sys.argv = ["tracelake", *sys.argv[1:]]
runpy.run_module("pipeline.cli", run_name="__main__")
"""


def _cli(*args: str, timeout: int = 300, limited: bool = False, stdout=None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", LIMITED] if limited else [sys.executable, "-m", "pipeline.cli"]
    return subprocess.run(
        [*cmd, *args],
        cwd=REPO,
        stdout=stdout if stdout is not None else subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        timeout=timeout,
    )


def _no_traceback(p: subprocess.CompletedProcess, codes=(0,)) -> None:
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    assert p.returncode in codes, (p.returncode, p.stderr[-3000:])


def _ingest(lake, *paths) -> None:
    p = _cli("ingest", *map(str, paths), "--lake", str(lake), "--quiet")
    assert p.returncode == 0, p.stderr[-2000:]


def _kernel_trace(kernels: list[tuple[int, int]], extra=()) -> dict:
    """Two ProfilerSteps and one launched kernel per (ts, dur), on stream 7 of device 0."""
    ev = [
        X("user_annotation", "ProfilerStep#1", 1000, 1000),
        X("user_annotation", "ProfilerStep#2", 2000, 1000),
    ]
    for i, (ts, dur) in enumerate(kernels):
        ids = {"correlation": 100 + i, "External id": 100 + i}
        ev.append(X("cuda_runtime", "cudaLaunchKernel", ts - 5 if ts > 5 else 1, 2, **ids))
        ev.append(X("kernel", f"gemm_kernel_{i % 2}", ts, dur, pid=0, tid=7, device=0, stream=7, **ids))
    ev.extend(extra)
    info = {"backend": "nccl", "rank": 0, "world_size": 1}
    return {"schemaVersion": 1, "distributedInfo": info, "traceEvents": ev}


def _changed_export(tmp_path, *updates: str):
    """A copy of nsys-ai's export (tmp_path/in/prof.sqlite) with these SQL statements run on it."""
    src = tmp_path / "in" / "prof.sqlite"
    src.parent.mkdir()
    shutil.copy(NSYS, src)
    src.chmod(0o644)
    c = sqlite3.connect(src)
    for u in updates:
        c.execute(u)
    c.commit()
    c.close()
    return src


def _write(path, doc) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def test_an_export_whose_nvtx_ranges_repeat_one_step_number_is_analysed_in_bounded_memory(tmp_path):
    """47 NVTX ranges named `ProfilerStep#1` (every 400th range of nsys-ai's export renamed) made
    47 steps of one number per rank; the per-step joins multiply them (the mfu view alone has
    1,105 rows for 47 steps; 2,020 such ranges a rank gave 8.4 M rows), and `analyze` took 2.6 GB
    of RSS for 47, 23 GB (the out-of-memory killer) for 950 of a 2.6 MB file. The unchanged
    export is analysed in 0.26 GB. Under a 3 GiB address space it must still finish."""
    src = _changed_export(
        tmp_path, "UPDATE NVTX_EVENTS SET text = 'ProfilerStep#1', textId = NULL WHERE rowid % 400 = 0"
    )
    lake = tmp_path / "lake"
    _ingest(lake, src.parent)
    p = _cli("sql", "--lake", str(lake), "SELECT (SELECT count(*) FROM steps), (SELECT count(*) FROM mfu)",
             "--format", "csv")  # fmt: skip
    steps, mfu = map(int, p.stdout.strip().splitlines()[-1].split(","))
    assert mfu <= steps, (steps, mfu)
    _no_traceback(_cli("analyze", "--lake", str(lake), "--json", limited=True, timeout=180))


def test_kernels_that_share_one_start_time_do_not_end_the_analysis_in_a_traceback(tmp_path):
    """Every kernel of sampled_rank-0 moved to the first kernel's start: the what-if replay that
    analyze runs for its findings raised ValueError ('the replay did not settle in 100000 rounds
    (the graph has a cycle)') out of analyze, report, run and diff, after 20 s of spinning;
    `tracelake whatif` on the same lake says it in one line."""
    doc = json.load(gzip.open(RANK0))
    first = min(e["ts"] for e in doc["traceEvents"] if e.get("cat") == "kernel")
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            e["ts"] = first
    _write(tmp_path / "in" / "rank-0.json", doc)
    lake = tmp_path / "lake"
    _ingest(lake, tmp_path / "in")
    p = _cli("analyze", "--lake", str(lake), "--json")
    _no_traceback(p, codes=(0, 4))
    # the findings keep their additive estimates, and a note says why they are not replayed
    doc = json.loads(p.stdout)
    assert all("replay" not in f for f in doc["findings"])
    notes = doc["notes"]
    assert any("gains are not replayed (the replay did not settle" in n for n in notes), notes


def test_a_kernel_near_the_end_of_the_int64_clock_does_not_wrap_its_end_in_the_lake(tmp_path):
    """A kernel at ts 9223372036854775 µs (9,223,372,036,854,775,000 ns, in range) and dur 10 µs
    was stored with end_ns -9,223,372,036,854,766,616 (the sum wrapped: the range check on ts +
    dur passes in float64, where both round to 2^63), and analyze then failed with a DuckDB
    ConversionException traceback. Expected: the event dropped or the file failed with its note,
    no row that ends before it starts, and analyze without a traceback."""
    _write(tmp_path / "in" / "rank-0.json", _kernel_trace([(1100, 50), (2100, 50), (9223372036854775, 10)]))
    lake = tmp_path / "lake"
    p = _cli("ingest", str(tmp_path / "in"), "--lake", str(lake), "--quiet")
    _no_traceback(p, codes=(0, 3, 4))
    if p.returncode == 4:
        return
    q = _cli("sql", "--lake", str(lake), "SELECT count(*) FROM gpu_activities WHERE end_ns < start_ns",
             "--format", "csv")  # fmt: skip
    assert q.stdout.strip().splitlines()[-1] == "0", q.stdout
    _no_traceback(_cli("analyze", "--lake", str(lake)), codes=(0, 4))


def test_a_run_whose_modelled_kernels_all_last_0_ns_gets_its_report(tmp_path):
    """Kernels of dur 0 launched by an aten::mm with shapes: the roofline summary has modelled
    kernels but no compute time, so coverage_pct is None, and roofline_text formatted it with
    :.0f: TypeError out of `report --format md` and html (and `run`); analyze is fine."""
    shapes = {"Input Dims": [[64, 64], [64, 64]], "Input type": ["float", "float"]}
    mm = X("cpu_op", "aten::mm", 1090, 20, **{"External id": 100, **shapes})
    _write(tmp_path / "in" / "rank-0.json", _kernel_trace([(1100, 0), (1200, 0), (2100, 0), (2200, 0)], [mm]))
    lake = tmp_path / "lake"
    _ingest(lake, tmp_path / "in")
    for fmt, out in (("md", "-"), ("html", str(tmp_path / "r.html"))):
        _no_traceback(_cli("report", "--lake", str(lake), "--format", fmt, "-o", out))


def test_steps_whose_kept_time_adds_up_to_zero_do_not_divide_by_zero(tmp_path):
    """nsys-ai's export with every kernel and runtime call given correlationId 1: the steps found
    (an op-level NVTX range repeating) keep 0 ns in all, and verdict_for_run's _numbers divided
    by it (ZeroDivisionError out of analyze, report, runs, diff and timeline), though its
    docstring says it never raises on empty input."""
    src = _changed_export(
        tmp_path,
        "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET correlationId = 1",
        "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET correlationId = 1",
    )
    lake = tmp_path / "lake"
    _ingest(lake, src.parent)
    _no_traceback(_cli("analyze", "--lake", str(lake), "--json"), codes=(0, 4))
    _no_traceback(_cli("runs", "--lake", str(lake)), codes=(0, 4))


def test_a_pftrace_timeline_of_a_run_with_a_negative_timestamp(tmp_path):
    """A kernel at ts -7 µs is kept in the lake (start_ns -7000); `timeline --all -o t.pftrace`
    then failed with 'ValueError: Value out of range: -7000' (a protobuf uint64 timestamp), while
    the same selection as .json.gz is written. Expected: the file written, or one line (exit 2)."""
    _write(tmp_path / "in" / "rank-0.json", _kernel_trace([(1100, 50), (2100, 50), (-7, 3)]))
    lake = tmp_path / "lake"
    _ingest(lake, tmp_path / "in")
    p = _cli("timeline", "--lake", str(lake), "--all", "-o", str(tmp_path / "t.pftrace"))
    _no_traceback(p, codes=(2,))
    assert p.stderr.count("\n") == 1 and "(-7000 ns)" in p.stderr and ".json.gz" in p.stderr, p.stderr
    assert not (tmp_path / "t.pftrace").exists()
    _no_traceback(_cli("timeline", "--lake", str(lake), "--all", "-o", str(tmp_path / "t.json.gz")))


def test_a_full_standard_output_is_one_line_not_a_traceback(tmp_path):
    """`tracelake sql ... > file` on a full disk (here /dev/full): OSError [Errno 28] escaped from
    rich's console as a traceback (sql, analyze and runs alike). A closed pipe is handled (141);
    a full one should be one line and a failure exit."""
    lake = tmp_path / "lake"
    _ingest(lake, RANK0)
    with open("/dev/full", "w") as full:
        for args in (("sql", "SELECT * FROM gpu_activities"), ("analyze",), ("runs",)):
            p = _cli(*args, "--lake", str(lake), stdout=full)
            assert "Traceback" not in p.stderr, (args, p.stderr[-2000:])
            assert p.returncode == 4, args
            assert "error: cannot write standard output: No space left on device" in p.stderr, p.stderr


def test_a_tar_gz_with_two_members_of_one_name_loses_neither_silently(tmp_path):
    """Two members named rank-0.json.gz (rank 0's and rank 1's traces: `tar -r` of an updated
    file writes such a pair). A plain .tar ingests both; a .zip refuses the name (docs/usage.md).
    The .tar.gz read the second member twice: 'ingested 1, skipped 1 (already in the lake)', the
    first member's trace silently gone. Expected: both contents in the lake, or the name refused
    with a failed row, as for the other two archive kinds."""
    r0, r1 = RANK0.read_bytes(), RANK1.read_bytes()
    arc = tmp_path / "in" / "a.tar.gz"
    arc.parent.mkdir()
    with tarfile.open(arc, "w:gz") as t:
        for data in (r0, r1):
            ti = tarfile.TarInfo("rank-0.json.gz")
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
    lake = tmp_path / "lake"
    p = _cli("ingest", str(arc.parent), "--lake", str(lake), "--quiet")
    _no_traceback(p, codes=(0, 3))
    q = _cli("sql", "--lake", str(lake), "SELECT status, content_sha256 FROM sources", "--format", "json")
    rows = json.loads(q.stdout)
    want = {hashlib.sha256(r0).hexdigest(), hashlib.sha256(r1).hexdigest()}
    ok = {r["content_sha256"] for r in rows if r["status"] != "failed"}
    assert ok == want and len(rows) == 2, (rows, p.stderr)  # each member by its place, as a .tar


def test_an_empty_path_argument_is_a_usage_error_not_the_current_directory(tmp_path):
    """`tracelake ingest "$TRACES"` with TRACES unset: the empty argument was read as Path(""),
    the current directory, which was searched recursively and ingested (exit 0 here; in a
    directory holding other lakes their `results/*.json` and `_compacted/*.json` were read as
    traces and failed). An empty path names no file: a usage error, exit 2 (docs/usage.md, Exit
    codes: a path that does not exist), as `" "` already is."""
    cwd = tmp_path / "cwd"
    shutil.copytree(RANK0.parent, cwd)
    p = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "ingest", "", "--lake", str(tmp_path / "lake")],
        cwd=cwd, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    assert p.returncode == 2, (p.returncode, p.stderr)


def test_sql_tables_do_not_print_a_traces_control_characters_raw(tmp_path):
    """A kernel named with terminal escapes (OSC 0 sets the window title, CSI 2J clears the
    screen) reaches the terminal raw through `tracelake sql`'s table, while every other line
    the commands print (analyze, runs, whatif, diff, the one-line errors: pipeline/oneline.py)
    writes control characters as \\xNN. csv and json are data and may keep them."""
    doc = _kernel_trace([(1100, 50), (2100, 50)])
    for e in doc["traceEvents"]:
        if e["cat"] == "kernel":
            e["name"] = "\x1b]0;PWNED\x07\x1b[2J" + e["name"]
    _write(tmp_path / "in" / "rank-0.json", doc)
    lake = tmp_path / "lake"
    _ingest(lake, tmp_path / "in")
    p = _cli("sql", "--lake", str(lake), "SELECT DISTINCT name FROM gpu_activities")
    assert p.returncode == 0, p.stderr
    assert "PWNED" in p.stdout
    assert "\x1b" not in p.stdout and "\x07" not in p.stdout, repr(p.stdout[:300])


def test_a_query_file_without_end_is_refused_not_read_until_the_memory_runs_out(tmp_path):
    """`tracelake sql @/dev/zero` read the file whole, until the out-of-memory killer: a query file
    holds at most lake_cmd.MAX_QUERY_BYTES (16 MiB), one line and exit 2 past it."""
    lake = tmp_path / "lake"
    _ingest(lake, RANK0)
    p = _cli("sql", "--lake", str(lake), "@/dev/zero", limited=True, timeout=60)
    _no_traceback(p, codes=(2,))
    assert p.stderr == "error: /dev/zero: more than 16 MiB: not a query\n", p.stderr

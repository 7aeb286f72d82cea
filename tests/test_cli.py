"""The CLI end to end on sample_traces/ (real traces, no ../shared needed) and the report's safety."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil

from conftest import REPO, X, write_trace
from typer.testing import CliRunner

from pipeline.cli import EXIT_FAILED, EXIT_OK, app

runner = CliRunner()


def test_run_analyze_sql_report(tmp_path):
    lake, out = tmp_path / "lake", tmp_path / "r.html"
    r = runner.invoke(app, ["run", str(REPO / "sample_traces"), "--lake", str(lake), "-o", str(out)])
    assert r.exit_code == EXIT_OK, r.output
    html = out.read_text()
    assert html.count("window.vegaEmbed=") == 1  # the Vega bundle is inlined once
    assert not re.search(r"""(src|href)=["']https?://""", html)
    # breakdown, overlap, phases (the sample ranks have backward and optimizer ops), bus bandwidth
    # (the all-to-alls are sized from their nccl:all_to_all records since issue 14), collective
    # wait, top kernels, idle gaps, roofline (the sample ranks' ops carry Input Dims), and each
    # step's critical path across ranks (docs/whatif.md)
    assert html.count("vegaEmbed('#chart") == 9
    r = runner.invoke(app, ["analyze", "--lake", str(lake), "--json", "--window", "hta"])
    assert r.exit_code == EXIT_OK
    res = json.loads(r.stdout)
    assert res["schema"] == "tracelake.analyze/5" and res["window"] == "hta"
    ranks = {x["rank"]: x for x in res["ranks"]}
    # HTA's figures for these files (../shared/reference/hta.md 4.2): overlap rank0 11.81 %, rank1 20.05 %
    assert (
        round(ranks[0]["comm_comp_overlap_pct"], 2) == 11.81
        and round(ranks[1]["comm_comp_overlap_pct"], 2) == 20.05
    )
    r = runner.invoke(
        app,
        [
            "sql",
            "--lake",
            str(lake),
            "--format",
            "csv",
            "SELECT rank, count(*) AS n FROM gpu_activities GROUP BY rank ORDER BY rank",
        ],
    )
    assert r.exit_code == EXIT_OK
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    # kernels + memcpy + memset per rank: sampled_rank-0 1154 + 40 + 10, sampled_rank-1 1104 + 40 + 10
    # (hta.md section 2)
    assert rows == [{"rank": "0", "n": "1204"}, {"rank": "1", "n": "1154"}]
    r = runner.invoke(
        app, ["sql", "--lake", str(lake), "--format", "csv", "SELECT [1, 2] AS l, {'a': 'x'} AS s"]
    )
    assert r.exit_code == EXIT_OK and list(csv.DictReader(io.StringIO(r.stdout))) == [
        {"l": "[1, 2]", "s": '{"a": "x"}'}
    ]
    r = runner.invoke(
        app, ["sql", "--lake", str(lake), "--format", "json", "SELECT count(*) AS n FROM steps"]
    )
    assert json.loads(r.stdout) == [{"n": 4}]
    r = runner.invoke(app, ["sql", "--lake", str(lake), "SELEC nonsense"])
    assert r.exit_code == 2 and r.output.startswith("error: Parser Error")  # a usage error
    # a query gets the metric views it names (query.for_query), and a catalog listing all of them
    q = "SELECT rank FROM breakdown WHERE level = 'rank' ORDER BY rank"
    r = runner.invoke(app, ["sql", "--lake", str(lake), "--format", "json", q])
    assert r.exit_code == EXIT_OK and json.loads(r.stdout) == [{"rank": 0}, {"rank": 1}]
    r = runner.invoke(app, ["sql", "--lake", str(lake), "--format", "json", "SHOW TABLES"])
    names = {x["name"] for x in json.loads(r.stdout)}
    assert {"breakdown", "step_time", "gpu_work", "scope", "gpu_activities"} <= names
    # connect's helpers (empty typed tables, materialized views) live in the schema `internal`
    assert not [n for n in names if n.startswith("_")], names


def test_every_command_has_help():
    for cmd in ([], ["ingest"], ["analyze"], ["report"], ["sql"], ["run"]):
        r = runner.invoke(app, cmd + ["--help"])
        assert r.exit_code == 0 and "Usage" in r.output


def test_report_escapes_input_strings(tmp_path):
    evil = ["<img src=x onerror=alert(1)>", "</script><script>alert(1)</script>"]
    ev = [X("user_annotation", "ProfilerStep#1", 0, 1000)]
    for i, name in enumerate(evil):
        ev += [
            X("cuda_runtime", "cudaLaunchKernel", 1 + i, 1, correlation=i + 1),
            X("kernel", name, 10 + 100 * i, 50, pid=0, tid=7, stream=7, device=0, correlation=i + 1),
        ]
    write_trace(tmp_path / "t" / "rank0.json", ev)
    out = tmp_path / "r.html"
    r = runner.invoke(app, ["run", str(tmp_path / "t"), "--lake", str(tmp_path / "lake"), "-o", str(out)])
    assert r.exit_code == EXIT_OK, r.output
    html = out.read_text()
    assert "<img src=x" not in html
    assert "</script><script>alert(1)" not in html
    assert "alert(1)" in html  # the names are there, as inert text


def test_analyze_and_report_one_run_of_the_lake(tmp_path):
    """`--run ID` analyses that run only: the same run rows as the whole lake's analysis, no other
    run; a run the lake does not hold is a usage error naming the runs it does hold."""
    from pipeline.analyze import analyze as analyze_lake
    from pipeline.lake import Lake

    runner = CliRunner()
    lake = tmp_path / "lake"
    src = REPO / "sample_traces" / "hta_trace_filter"
    for run in ("a", "b"):
        assert runner.invoke(app, ["ingest", str(src), "--lake", str(lake), "--run", run]).exit_code == 0
    r = runner.invoke(app, ["analyze", "--json", "--lake", str(lake), "--run", "b"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    whole = analyze_lake(Lake(lake))
    assert [x["run_id"] for x in doc["runs"]] == ["b"]
    for key in ("steps", "ranks", "step_time", "verdicts"):
        assert doc[key] == [x for x in whole[key] if x["run_id"] == "b"], key
    r = runner.invoke(app, ["report", "--format", "md", "--lake", str(lake), "--run", "a"])
    assert r.exit_code == 0 and "## Run a" in r.stdout and "## Run b" not in r.stdout
    r = runner.invoke(app, ["analyze", "--lake", str(lake), "--run", "nope"])
    assert r.exit_code == 2 and "--run nope: not in the lake (runs: a, b)" in r.output


def test_run_writes_the_format_its_output_names(tmp_path):
    """`run -o x.md` / `-o x.json` write what `report --format md|json` writes for the same lake
    (the format comes from the suffix unless --format says otherwise)."""
    lake = tmp_path / "lake"
    md, js, forced = tmp_path / "r.md", tmp_path / "r.json", tmp_path / "r.txt"
    for out, extra in ((md, []), (js, []), (forced, ["--format", "md"])):
        r = runner.invoke(
            app, ["run", str(REPO / "sample_traces"), "--lake", str(lake), "-o", str(out), *extra]
        )
        assert r.exit_code == EXIT_OK, r.output
    r = runner.invoke(app, ["report", "--lake", str(lake), "--format", "md"])
    assert r.exit_code == EXIT_OK
    assert md.read_text() == r.stdout == forced.read_text()
    assert not md.read_text().lstrip().startswith("<")
    doc = json.loads(js.read_text())
    r = runner.invoke(app, ["report", "--lake", str(lake), "--format", "json"])
    assert doc == json.loads(r.stdout) and doc["schema"] == "tracelake.report/2"
    r = runner.invoke(
        app, ["run", str(REPO / "sample_traces"), "--lake", str(lake), "-o", str(md), "--format", "pdf"]
    )
    assert r.exit_code == 2 and "--format must be html, json or md" in r.output


def test_report_output_suffix_stdout_and_bad_paths(tmp_path):
    """report takes its format from -o's suffix like run (--format in any case wins); '-' is
    standard output; an output that is a directory, or in a missing one, is a usage error before
    any analysis."""
    lake = tmp_path / "lake"
    assert (
        runner.invoke(app, ["ingest", str(REPO / "sample_traces"), "--lake", str(lake)]).exit_code == EXIT_OK
    )
    want = runner.invoke(app, ["report", "--lake", str(lake), "--format", "md"]).stdout
    assert (
        runner.invoke(app, ["report", "--lake", str(lake), "-o", str(tmp_path / "r.md")]).exit_code == EXIT_OK
    )
    assert (tmp_path / "r.md").read_text() == want
    assert (
        runner.invoke(
            app, ["report", "--lake", str(lake), "-o", str(tmp_path / "r.txt"), "--format", "MD"]
        ).exit_code
        == EXIT_OK
    )
    assert (tmp_path / "r.txt").read_text() == want
    r = runner.invoke(app, ["report", "--lake", str(lake), "-o", "-", "-f", "json"])
    assert r.exit_code == EXIT_OK and json.loads(r.stdout)["schema"] == "tracelake.report/2"
    for bad, why in ((tmp_path, "is a directory"), (tmp_path / "nope" / "r.html", "does not exist")):
        for cmd in (
            ["report", "--lake", str(lake)],
            ["run", str(REPO / "sample_traces"), "--lake", str(tmp_path / "l2")],
        ):
            r = runner.invoke(app, [*cmd, "-o", str(bad)])
            assert r.exit_code == 2 and why in re.sub(r"[\s│╭╮╰╯─]+", " ", r.output), r.output
    assert not (tmp_path / "l2").exists()  # run stopped before ingesting
    r = runner.invoke(app, ["report", "--lake", str(lake), "--format", ""])
    assert r.exit_code == 2 and "--format must be html, json or md" in r.output


def test_run_reports_the_runs_of_its_inputs(tmp_path):
    """run on one trace directory reports that run only, even when the lake holds others; it takes
    --jobs."""
    lake = tmp_path / "lake"
    other = tmp_path / "other_job"
    other.mkdir()
    write_trace(
        other / "rank0.json", [X("kernel", "k", 10, 5, pid=0, tid=7, device=0, stream=7, correlation=1)]
    )
    assert runner.invoke(app, ["ingest", str(other), "--lake", str(lake)]).exit_code == EXIT_OK
    r = runner.invoke(
        app,
        [
            "run",
            str(REPO / "sample_traces"),
            "--lake",
            str(lake),
            "-o",
            str(tmp_path / "r.json"),
            "--jobs",
            "1",
        ],
    )
    assert r.exit_code == EXIT_OK, r.output
    runs = {x["run_id"] for x in json.loads((tmp_path / "r.json").read_text())["runs"]}
    assert runs == {"hta_trace_filter"}
    r = runner.invoke(app, ["analyze", "--lake", str(lake), "--json"])
    assert {x["run_id"] for x in json.loads(r.stdout)["runs"]} == {"hta_trace_filter", "other_job"}


def test_a_non_empty_directory_that_is_not_a_lake_is_refused(tmp_path):
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "notes.txt").write_text("my notes\n")
    r = runner.invoke(app, ["ingest", str(REPO / "sample_traces"), "--lake", str(traces)])
    # a bad --lake is a usage error (exit 2), and nothing is written into the directory
    assert r.exit_code == 2 and "not a tracelake lake (no TRACELAKE file)" in r.output, r.output
    assert sorted(p.name for p in traces.iterdir()) == ["notes.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (
        runner.invoke(app, ["ingest", str(REPO / "sample_traces"), "--lake", str(empty)]).exit_code == EXIT_OK
    )


def _ingest_with_links(tmp_path, links: dict[str, str]):
    """Ingest a directory holding one sample trace and the symbolic links {name: target}."""
    d = tmp_path / "job"
    d.mkdir()
    for name, target in links.items():
        (d / name).symlink_to(target)
    sub = next(REPO.joinpath("sample_traces", "hta_trace_filter").glob("*.json.gz"))
    (d / sub.name).write_bytes(sub.read_bytes())
    return runner.invoke(app, ["ingest", str(d), "--lake", str(tmp_path / "lake")])


def test_a_broken_symlink_found_in_a_directory_fails_with_one_line(tmp_path):
    r = _ingest_with_links(tmp_path, {"rank1.json.gz": str(tmp_path / "gone.json.gz")})
    assert r.exit_code == 3, r.output
    assert re.search(r"failed .*rank1\.json\.gz: broken symbolic link", r.output), r.output


def test_a_failed_file_found_in_a_directory_gets_the_run_its_place_gives(tmp_path):
    """A broken link, a link loop, a cut-off tar and a corrupt tar.gz lying in top/a/b beside a
    healthy trace: their failed rows are in the healthy file's run (a/b: the path below the
    directory given), not in one named by their directory alone ('b'); issue 39 item 13. A file
    in the root directory, which has no name, gets run '/' (run-42099b), never ''."""
    import io
    import tarfile

    from pipeline.ingest.runs import dir_name, run_for
    from pipeline.lake import Lake
    from pipeline.query import connect

    d = tmp_path / "top" / "a" / "b"
    write_trace(d / "rank0.json", [X("kernel", "k", 10, 5, pid=0, tid=7, device=0, stream=7, correlation=1)])
    (d / "rank1.json").symlink_to(tmp_path / "gone.json")
    (d / "loop.json").symlink_to("loop.json")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        info = tarfile.TarInfo("rank2.json")
        info.size = 5000
        t.addfile(info, io.BytesIO(b"x" * 5000))
    (d / "cut.tar").write_bytes(buf.getvalue()[:1500])
    (d / "bad.tar.gz").write_bytes(__import__("gzip").compress(buf.getvalue()[:1500]))
    lake = tmp_path / "lake"
    r = runner.invoke(app, ["ingest", str(tmp_path / "top"), "--lake", str(lake), "-j", "1"])
    assert r.exit_code == 3, r.output
    rows = connect(Lake(lake)).execute("SELECT regexp_extract(path, '[^/]+$'), status, run_id FROM sources")
    # bad.tar.gz is cut inside its member rank2.json: the member fails, in the run a member at
    # the archive's top gets (the archive's name: a.b.bad), as a healthy one would be
    assert sorted(rows.fetchall()) == [
        ("bad.tar.gz!rank2.json", "failed", "a.b.bad"),
        ("cut.tar", "failed", "a.b"),
        ("loop.json", "failed", "a.b"),
        ("rank0.json", "ok", "a.b"),
        ("rank1.json", "failed", "a.b"),
    ]
    assert dir_name("/rank0.json") == "/" and run_for(dir_name("/rank0.json"), None) == "run-42099b"


NOT_LOGS = "not NCCL-family logs (no NCCL_DEBUG, nccl-tests or PyTorch NCCL lines in the first 64 KiB)"


def test_files_named_like_logs_that_are_not_logs_are_said_to_be_passed_over(tmp_path):
    """A *.log in a directory that is not an NCCL-family log was passed over without a word, while
    'no trace files' listed *.log among what is read (issue 39 item 13): one line names them and
    why, in the error when nothing else is there, else in a note; archive members alike."""
    import tarfile
    import zipfile

    d = tmp_path / "job"
    d.mkdir()
    (d / "notes.log").write_text("training started\nloss 0.1\n")
    r = runner.invoke(app, ["ingest", str(d), "--lake", str(tmp_path / "l1")])
    assert r.exit_code == EXIT_FAILED
    assert r.output.splitlines() == [
        "error: no trace files (*.json, *.json.gz, *.gz, *.sqlite, *.nsys-rep, *.qdrep, *_pqtdir/, *.tar, "
        f"*.tar.gz, *.zip; NCCL logs *.log, *.txt, *.out, *.err, *.jsonl) in {d}; passed over 1 file(s) "
        f"named like logs that are {NOT_LOGS}: {d / 'notes.log'}"
    ]
    for k in range(4):
        (d / f"stdout{k}.txt").write_text("hello\n")
    write_trace(d / "rank0.json", [X("kernel", "k", 10, 5, pid=0, tid=7, device=0, stream=7, correlation=1)])
    with zipfile.ZipFile(d / "more.zip", "w") as z:
        z.writestr("rank1.json", (d / "rank0.json").read_bytes().replace(b'"k"', b'"k1"'))
        z.writestr("app.err", "Traceback? no, just text\n")
    with tarfile.open(d / "more.tar.gz", "w:gz") as t:
        text = b"epoch 1 done\n"
        info = tarfile.TarInfo("app.out")
        info.size = len(text)
        t.addfile(info, io.BytesIO(text))
    r = runner.invoke(app, ["ingest", str(d), "--lake", str(tmp_path / "l2"), "-j", "1"])
    assert r.exit_code == EXIT_OK, r.output
    assert r.output.splitlines()[-1] == (
        f"note: passed over 7 file(s) named like logs that are {NOT_LOGS}: {d / 'notes.log'}, "
        f"{d / 'stdout0.txt'}, {d / 'stdout1.txt'} and 4 more"
    )
    from pipeline.ingest import ingest_paths
    from pipeline.lake import Lake

    passed: list = []
    res = ingest_paths([d], Lake(tmp_path / "l3"), jobs=1, not_logs=passed)
    assert [r.status for r in res] == ["ok", "ok"]
    assert [str(p) for p in passed] == [
        *(str(d / n) for n in ("notes.log", *(f"stdout{k}.txt" for k in range(4)))),
        f"{d / 'more.zip'}!app.err",
        f"{d / 'more.tar.gz'}!app.out",
    ]


def test_a_symlink_loop_or_a_link_we_may_not_follow_is_one_line(tmp_path):
    """A directory holding a link to itself (no input suffix: passed over), a link loop named like a
    trace and a link into /proc (found by an adversarial helper: a traceback, and 'cannot write to
    the lake')."""
    r = _ingest_with_links(tmp_path, {"self": "self", "loop.json": "loop.json", "pc": "/proc/1/cwd"})
    assert r.exit_code == 3, r.output
    assert re.search(r"failed .*loop\.json: symbolic link loop", r.output), r.output
    assert "Traceback" not in r.output and "cannot write to the lake" not in r.output


def test_run_reports_the_run_a_skipped_file_is_stored_in(tmp_path):
    """A file moved to its own run (its rank was taken) and skipped later is reported under that
    run, not under its directory's."""
    d = tmp_path / "job"
    d.mkdir()
    write_trace(d / "rank0.json", [X("kernel", "k", 10, 5, pid=0, tid=7, device=0, stream=7, correlation=1)])
    write_trace(
        d / "worker0.json", [X("kernel", "k2", 10, 9, pid=0, tid=7, device=0, stream=7, correlation=1)]
    )
    lake = tmp_path / "lake"
    assert runner.invoke(app, ["ingest", str(d), "--lake", str(lake)]).exit_code == EXIT_OK
    moved = {
        r
        for r in json.loads(runner.invoke(app, ["analyze", "--lake", str(lake), "--json"]).stdout)["runs"]
        for r in [r["run_id"]]
    } - {"job"}
    assert len(moved) == 1 and next(iter(moved)).startswith("job_")
    r = runner.invoke(
        app, ["run", str(d / "worker0.json"), "--lake", str(lake), "-o", str(tmp_path / "r.json")]
    )
    assert r.exit_code == EXIT_OK, r.output
    assert {x["run_id"] for x in json.loads((tmp_path / "r.json").read_text())["runs"]} == moved


def test_an_archive_with_every_member_excluded_is_nothing_to_ingest(tmp_path):
    import tarfile

    src = tmp_path / "job"
    src.mkdir()
    write_trace(
        src / "rank0.json", [X("kernel", "k", 10, 5, pid=0, tid=7, device=0, stream=7, correlation=1)]
    )
    with tarfile.open(tmp_path / "a.tar", "w") as t:
        t.add(src / "rank0.json", arcname="job/rank0.json")
    r = runner.invoke(
        app, ["ingest", str(tmp_path / "a.tar"), "--lake", str(tmp_path / "lake"), "--exclude", "job"]
    )
    assert r.exit_code == 4 and "nothing to ingest" in r.output and "left out by --exclude" in r.output, (
        r.output
    )


def test_a_report_never_replaces_an_input_or_a_lake_part(tmp_path):
    """`run -o` naming one of the traces it ingests, or `report -o` / `run -o` inside the lake,
    is a usage error before any work, and every file stays as it was (an attack replaced a
    sources part, and rank 0's trace, with the report). Beside the inputs, a report is fine."""
    traces = tmp_path / "traces"
    shutil.copytree(REPO / "sample_traces" / "hta_trace_filter", traces)
    lake = tmp_path / "lake"
    assert runner.invoke(app, ["ingest", str(traces), "--lake", str(lake)]).exit_code == EXIT_OK
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    part = next((lake / "sources").rglob("*.parquet"))
    rank0 = sorted(traces.glob("*.json.gz"))[0]
    for argv in (
        ["run", str(traces), "--lake", str(lake), "-o", str(rank0), "--format", "json"],
        ["report", "--lake", str(lake), "-o", str(part), "--format", "json"],
        ["report", "--lake", str(lake), "-o", str(lake / "report.html")],
        ["run", str(traces), "--lake", str(lake), "-o", str(lake / "report.md")],
    ):
        r = runner.invoke(app, argv)
        assert r.exit_code == 2 and r.stdout == "", (argv, r.output)
        assert "is one of the inputs" in r.output or "lies inside the lake" in r.output, r.output
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    r = runner.invoke(app, ["run", str(traces), "--lake", str(lake), "-o", str(traces / "report.md")])
    assert r.exit_code == EXIT_OK and (traces / "report.md").read_text().startswith("#")


def test_analyze_of_a_lake_whose_every_source_failed_is_a_failure(tmp_path):
    """A CI job reading exit 0 would take 'nothing to analyse' for success (issue 39 item 12)."""
    bad = tmp_path / "in" / "x.json"
    bad.parent.mkdir()
    bad.write_text("not json")
    lake = str(tmp_path / "lake")
    assert runner.invoke(app, ["ingest", str(bad.parent), "--lake", lake]).exit_code == EXIT_FAILED
    for args in (["analyze"], ["analyze", "--json"], ["report", "-o", str(tmp_path / "r.html")]):
        r = runner.invoke(app, [*args, "--lake", lake])
        assert r.exit_code == EXIT_FAILED, (args, r.output)
        # the command it prints names the lake, which is not the default (issue 39 item 13)
        assert r.output == (
            f"error: {lake}: every source in scope failed to ingest (1 file(s)), nothing to analyse; "
            f"their errors: tracelake sql --lake {lake} "
            "\"SELECT path, error FROM sources WHERE status = 'failed'\"\n"
        )


def test_sql_json_writes_integers_past_2_53_as_text(tmp_path):
    """A double-based JSON reader rounds 9007199254740993 to ...992 (issue 39 item 13): such
    integers, a HUGEINT sum among them, are written as text; smaller ones stay numbers."""
    lake = str(tmp_path / "lake")
    assert runner.invoke(app, ["ingest", str(REPO / "sample_traces"), "--lake", lake]).exit_code == EXIT_OK
    r = runner.invoke(
        app,
        [
            "sql",
            "SELECT 9007199254740993 AS big, 9007199254740991 AS safe, sum(start_ns)::HUGEINT AS s, 2.5 AS d "
            "FROM gpu_activities",
            "--lake",
            lake,
            "--format",
            "json",
        ],
    )
    row = json.loads(r.stdout)[0]
    assert row["big"] == "9007199254740993" and row["safe"] == 9007199254740991 and row["d"] == 2.5
    assert isinstance(row["s"], str) and int(row["s"]) > 2**53


def test_the_rank_table_states_mfu_only_where_enough_compute_has_flops():
    """The per-rank table of `analyze` shows a rank's MFU only at FLOP coverage of at least 50 %
    (findings.MIN_FLOP_COVERAGE_PCT, the report's and `runs`' bar): PARAM's DLRM, 17-20 % covered,
    printed "MFU % 0.027" beside a report saying MFU is not measurable (a new user's trial). A
    hand-written document: rank 0 at 80 % coverage keeps its 31.5 %, rank 1 at 20 % shows a dash."""
    from rich.console import Console

    from pipeline.cli.summary import print_summary

    rank = dict.fromkeys(
        ("span_ns", "compute_ns", "comm_ns", "exposed_comm_ns", "comm_comp_overlap_pct", "gpu_idle_ns",
         "idle_host_wait_ns"), 1_000_000,
    )  # fmt: skip
    res = {
        "runs": [{"run_id": "r"}],
        "verdicts": [
            {"run_id": "r", "verdict": "compute-bound", "confidence": "high", "reason": "x", "basis": "trace"}
        ],
        "findings": [],
        "ranks": [
            {**rank, "run_id": "r", "rank": 0, "mfu_pct": 31.5, "flop_coverage_pct": 80.0},
            {**rank, "run_id": "r", "rank": 1, "mfu_pct": 0.027, "flop_coverage_pct": 20.0},
        ],
    }
    con = Console(record=True, width=200)
    print_summary(con, res, ranks_table=True)
    out = con.export_text()
    cells = {
        ln.split("│")[1].strip(): [c.strip() for c in ln.split("│")[1:-1]]
        for ln in out.splitlines()
        if ln.startswith("│")
    }
    assert cells["0"][-2:] == ["31.500", "80.000"]
    assert cells["1"][-2:] == ["—", "20.000"]
    assert "MFU — where under 50 % of the compute has modelled FLOPs" in " ".join(out.split())

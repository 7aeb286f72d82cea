"""Truncated Kineto traces (a job killed while the profiler wrote): every complete event is kept,
the source is marked partial and its note gives the unreadable byte count. Real corpus traces are
cut at several places; the expected numbers come from the standard json module decoding the same
prefix event by event (JSONDecoder.raw_decode), not from tracelake."""

from __future__ import annotations

import gzip
import json
import re
import zlib
from pathlib import Path

import pytest
from conftest import corpus

from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
from pipeline.query import connect, run

GPU_CATS = {
    "kernel",
    "Kernel",
    "mtia_ccp_events",
    "gpu_memcpy",
    "Memcpy",
    "gpu_memset",
    "Memset",
    "cuda_sync",
    "cuda_profiler_range",
}
SKIP = {
    "Trace",
    "ac2g",
    "async_cpu_to_gpu",
    "async",
    "fwdbwd",
    "critical_path",
    "cpu_instant_event",
    "gpu_user_annotation",
}

TRACES = {
    # compact one-line JSON, distributedInfo before the events
    "sampled": ("hta", "tests", "data", "trace_filter", "sampled_rank-1.json.gz"),
    # Kineto's own layout (one key per line), deviceProperties first
    "dlrm": (
        "param",
        "et_replay",
        "tests",
        "inputs",
        "dlrm_kineto",
        "worker2_step_12.1694128201554.pt.trace.json",
    ),
    # relative timestamps with baseTimeNanoseconds written after the events
    "bert": ("tracelens", "tests", "traces", "h100", "gaunernst_bert-small-uncased__1016001.json.gz"),
}


def text_of(key: str) -> bytes:
    raw = corpus(*TRACES[key]).read_bytes()
    return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw


def complete_events(prefix: bytes) -> tuple[list[dict], int]:
    """The events of traceEvents that are whole in `prefix`, decoded one by one with json, and
    the byte offset just after the last one (0 when none)."""
    s = prefix.decode("utf-8", "replace")
    m = re.search(r'"traceEvents"\s*:\s*\[', s)
    i, dec, out, end = m.end(), json.JSONDecoder(), [], 0
    while True:
        while i < len(s) and s[i] in " \t\r\n,":
            i += 1
        if i >= len(s) or s[i] == "]":
            return out, end
        try:
            ev, i = dec.raw_decode(s, i)
        except json.JSONDecodeError:
            return out, end
        out.append(ev)
        end = len(s[:i].encode("utf-8"))


def expected(events: list[dict]) -> tuple[int, int]:
    x = [e for e in events if e.get("ph") == "X"]
    return (
        sum(1 for e in x if e.get("cat") in GPU_CATS),
        sum(1 for e in x if e.get("cat") not in GPU_CATS and e.get("cat") not in SKIP),
    )


def ingest_one(path: Path, tmp_path: Path):
    lake = Lake(tmp_path / ("lake_" + path.parent.name + "_" + path.name))
    (r,) = ingest_paths([path], lake, run="cut")
    con = connect(lake)
    n = lambda t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]  # noqa: E731
    src = con.execute("SELECT status, event_count, notes, error FROM sources").fetchone()
    (unreadable,) = con.execute("SELECT unreadable_bytes FROM sources").fetchone()
    assert unreadable == (
        r.unreadable_bytes if r.status != "failed" else None
    )  # the column says what the result says
    return r, n("gpu_activities"), n("cpu_ops"), src


@pytest.mark.parametrize("key", list(TRACES))
@pytest.mark.parametrize("frac", [0.31, 0.77])
@pytest.mark.parametrize("gz", [False, True])
def test_cut_inside_the_events_keeps_every_complete_one(key, frac, gz, tmp_path):
    data = text_of(key)
    prefix = data[: int(len(data) * frac)]
    events, end = complete_events(prefix)
    assert 0 < len(events) and end < len(prefix)
    f = tmp_path / (f"{key}_rank-1.json" + (".gz" if gz else ""))
    f.write_bytes(gzip.compress(prefix) if gz else prefix)
    r, n_gpu, n_cpu, (status, n_events, notes, error) = ingest_one(f, tmp_path)
    assert r.status == "partial" and status == "partial" and error is None, r.error
    assert (n_gpu, n_cpu) == expected(events)
    assert n_events == len(events)
    assert r.unreadable_bytes == len(prefix) - end  # (and the sources column: ingest_one)
    assert any(
        f"{len(events)} complete events kept, {len(prefix) - end} bytes (of {len(prefix)}) unreadable" in n
        for n in notes
    ), notes


def test_cut_right_after_an_event_and_after_its_comma(tmp_path):
    data = text_of("dlrm")
    events, end = complete_events(data[: len(data) // 2])
    for name, prefix in (("brace", data[:end]), ("comma", data[:end] + b",\n")):
        f = tmp_path / name / "worker2.json"
        f.parent.mkdir()
        f.write_bytes(prefix)
        r, n_gpu, n_cpu, (status, n_events, _, _) = ingest_one(f, tmp_path)
        assert status == "partial" and n_events == len(events) and (n_gpu, n_cpu) == expected(events)
        assert r.unreadable_bytes == len(prefix) - end


def test_cut_after_the_events_loses_only_the_trailing_keys(tmp_path):
    data = text_of("bert")
    tail_at = data.rindex(b'"baseTimeNanoseconds"')
    all_events, _ = complete_events(data)
    prefix = data[: tail_at + 10]
    base = json.loads(data)["baseTimeNanoseconds"]
    f = tmp_path / "bert.json"
    f.write_bytes(prefix)
    r, n_gpu, n_cpu, (status, n_events, notes, _) = ingest_one(f, tmp_path)
    assert status == "partial" and n_events == len(all_events) and (n_gpu, n_cpu) == expected(all_events)
    assert any("baseTimeNanoseconds" in n and "relative" in n for n in notes), notes
    # the whole file puts the same events at base + ts; the cut one cannot know the base
    whole = tmp_path / "whole" / "bert.json"
    whole.parent.mkdir()
    whole.write_bytes(data)
    lake = Lake(tmp_path / "lake_whole")
    ingest_paths([whole], lake, run="whole")
    lo = connect(lake).execute("SELECT min(start_ns) FROM gpu_activities").fetchone()[0]
    lo_cut = (
        connect(Lake(tmp_path / ("lake_" + f.parent.name + "_" + f.name)))
        .execute("SELECT min(start_ns) FROM gpu_activities")
        .fetchone()[0]
    )
    assert lo - lo_cut == base


def test_a_gzip_stream_cut_while_written(tmp_path):
    data = text_of("sampled")
    raw = gzip.compress(data)
    cut = raw[: int(len(raw) * 0.6)]
    inflated = zlib.decompressobj(31).decompress(cut)  # what the bytes that exist hold
    events, end = complete_events(inflated)
    assert len(inflated) - end > 16  # the decompressors agree up to the last complete event
    f = tmp_path / "sampled_rank-1.json.gz"
    f.write_bytes(cut)
    r, n_gpu, n_cpu, (status, n_events, notes, _) = ingest_one(f, tmp_path)
    assert status == "partial" and n_events == len(events) and (n_gpu, n_cpu) == expected(events)
    assert any("gzip stream ends early" in n for n in notes)


def test_nothing_complete_is_a_one_line_failure(tmp_path):
    data = text_of("dlrm")
    head = data[: data.index(b'"traceEvents"') + 40]
    f = tmp_path / "rank0.json"
    f.write_bytes(head)
    r, *_ = ingest_one(f, tmp_path)
    assert r.status == "failed" and "truncated JSON" in r.error and "\n" not in r.error


@pytest.mark.parametrize("key", ["sampled", "dlrm"])
def test_small_batches_and_spilled_tables_give_the_same_rows(key, tmp_path):
    """The stream is decoded in batches (here ~20 KB) and tables spill to disk past the memory
    budget (here at once): the rows are those of the file decoded in one piece."""
    import io

    import polars as pl

    from pipeline.ingest import kineto

    data = text_of(key)

    def frames(**kw):
        s = kineto.parse_stream(io.BytesIO(data).read, **kw)
        try:
            out = {
                t: pl.concat(list(v() if callable(v) else v), how="vertical_relaxed")
                for t, v in s.tables().items()
            }
            return out, s.event_count, s.acc.spools["cpu"].path is not None
        finally:
            s.close()

    whole, n, spilled = frames(batch_bytes=1 << 30)
    small, m, spilled2 = frames(batch_bytes=20_000, spool_bytes=0, spool_dir=tmp_path)
    assert n == m == len(complete_events(data)[0]) and not spilled and spilled2
    for t in whole:
        assert whole[t].equals(small[t]), t
    assert not list(tmp_path.iterdir())  # spill files are removed


@pytest.mark.parametrize("key", list(TRACES))
def test_a_complete_trace_has_no_unreadable_bytes(key, tmp_path):
    f = tmp_path / f"{key}_rank-1.json"
    f.write_bytes(text_of(key))
    r, *_, (status, n_events, _, _) = ingest_one(f, tmp_path)
    assert status == "ok" and n_events == len(complete_events(text_of(key))[0])
    assert r.unreadable_bytes == 0  # ingest_one checked that the sources column agrees


def test_unreadable_bytes_is_null_for_failed_files_and_old_lakes(tmp_path):
    import polars as pl

    f = tmp_path / "rank0.json"
    data = text_of("dlrm")
    f.write_bytes(data[: data.index(b'"traceEvents"') + 40])  # nothing complete: failed
    r, *_ = ingest_one(f, tmp_path)
    assert r.status == "failed"
    # a lake written before the column existed: its sources parts lack it, and still read
    lake = Lake(tmp_path / "old")
    g = tmp_path / "old_in" / "dlrm_rank-1.json"
    g.parent.mkdir()
    g.write_bytes(data)
    ingest_paths([g], lake, run="old")
    for p in lake.table_files("sources"):
        pl.read_parquet(p).drop("unreadable_bytes").write_parquet(p)
    (lake.root / "TRACELAKE").write_text("tracelake lake, schema v1\n")  # as such a lake is marked
    src = lake.sources()
    assert (
        src.height == 1 and src["unreadable_bytes"].to_list() == [None] and src["status"].to_list() == ["ok"]
    )
    # only old parts: upgraded when read (pipeline/upgrade.py), the column is NULL, in v2's order
    con = connect(lake)
    assert con.execute("SELECT status, unreadable_bytes FROM sources").fetchall() == [("ok", None)]
    assert [d[0] for d in con.execute("SELECT * FROM sources").description] == list(lake.sources().columns)
    h = tmp_path / "new_in" / "bert_rank-2.json"
    h.parent.mkdir()
    h.write_bytes(text_of("bert"))
    ingest_paths([h], lake, run="old")
    con = connect(lake)
    assert con.execute(
        "SELECT unreadable_bytes FROM sources ORDER BY unreadable_bytes NULLS FIRST"
    ).fetchall() == [(None,), (0,)]
    assert sorted(lake.sources()["unreadable_bytes"].to_list(), key=str) == [0, None]


def test_analysis_and_report_name_a_partial_trace(tmp_path):
    """A cut rank is said in the analysis notes (and so in the report), with its unreadable bytes,
    beside a complete rank of the same run (found by a new-user trial: only sources said it)."""
    from pipeline.analyze import analyze
    from pipeline.report import document, markdown

    data = text_of("dlrm")
    prefix = data[: int(len(data) * 0.5)]
    events, end = complete_events(prefix)
    job = tmp_path / "job"
    job.mkdir()
    (job / "dlrm_rank-1.json").write_bytes(prefix)
    (job / "bert_rank-2.json").write_bytes(text_of("bert"))
    lake = Lake(tmp_path / "lake")
    assert sorted(r.status for r in ingest_paths([job], lake, run="job")) == ["ok", "partial"]
    doc = analyze(lake)
    cut = [n for n in doc["notes"] if "is partial" in n]
    assert (
        len(cut) == 1
        and "dlrm_rank-1.json" in cut[0]
        and f"{len(prefix) - end:,} bytes at its end unreadable" in cut[0]
    )
    assert cut[0] in markdown.render(document.build(doc, None)).replace("\\_", "_")  # markdown escapes _
    # the cut file's steps (its one step, ProfilerStep#10, is at byte 188,866 of 899,599, inside the
    # half kept) is cut off with it (queries/step_status.sql): incomplete; the complete file's
    # step is not; and the cut file's verdict carries the truncated-input caveat. (Both files
    # say rank 2 in distributedInfo, so the cut one went to a run of its own.)
    src = {r["status"]: r["run_id"] for r in lake.sources().to_dicts()}
    st = {r["run_id"]: r for r in run(connect(lake), "step_status").to_dicts()}
    assert (
        st[src["partial"]]["step"],
        st[src["partial"]]["in_truncated_source"],
        st[src["partial"]]["complete"],
    ) == (10, True, False)
    assert (st[src["ok"]]["in_truncated_source"], st[src["ok"]]["complete"]) == (False, True)
    v = next(x for x in doc["verdicts"] if x["run_id"] == src["partial"])
    assert any(c["kind"] == "truncated_input" and "dlrm_rank-1.json" in c["text"] for c in v["caveats"])


def test_profiler_stopped_mid_step_leaves_the_last_step_incomplete(tmp_path):
    """The profiler stopped inside the last step (queries/step_status.sql): the host recorded the
    step's launch calls, but the GPU records (and their flow events) of the launches made after
    instant T, the middle of HTA's nccl_data.json.gz ProfilerStep#6 window, were never written.
    Only that step is incomplete; the cuDNN cudaMemsetAsync of each step, which never has a GPU
    record, leaves steps 4 and 5 complete. Expected counts: conftest.raw_step_counts over the
    modified JSON (the standard json module)."""
    from conftest import GPU_RECORD_CATS, raw_step_counts

    from pipeline.query import run

    doc = json.loads(
        gzip.decompress(
            corpus("hta", "tests", "data", "nccl_parser_config", "nccl_data.json.gz").read_bytes()
        )
    )
    (s6,) = [
        e
        for e in doc["traceEvents"]
        if e.get("cat") == "user_annotation" and e.get("name") == "ProfilerStep#6"
    ]
    t_stop = s6["ts"] + s6["dur"] / 2
    late = {
        e["args"]["correlation"]
        for e in doc["traceEvents"]
        if e.get("cat") in ("cuda_runtime", "cuda_driver")
        and e["ts"] > t_stop
        and "correlation" in e.get("args", {})
    }
    doc["traceEvents"] = [
        e
        for e in doc["traceEvents"]
        if not (e.get("cat") in GPU_RECORD_CATS and e.get("args", {}).get("correlation") in late)
        and not (e.get("cat") == "ac2g" and e.get("id") in late)
    ]
    raw = raw_step_counts(doc)
    assert raw[4] == raw[5] == (1259, 1, {"cudaMemsetAsync"}, 0)
    # step 6: 746 launches after the last one with GPU work (1259 - 513 before T), and the step's
    # memset, which lies before T, without GPU work but not cut off
    assert raw[6] == (
        1259,
        747,
        {"cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync", "cudaMemsetAsync"},
        746,
    )
    f = tmp_path / "stopped" / "nccl_data_rank-0.json"
    f.parent.mkdir()
    f.write_text(json.dumps(doc))
    lake = Lake(tmp_path / "lake_stopped")
    assert [r.status for r in ingest_paths([f], lake, run="stopped")] == ["ok"]
    got = {
        r["step"]: (
            r["launches"],
            r["launches_without_gpu_work"],
            r["launches_cut_off"],
            r["complete"],
            r["is_last"],
        )
        for r in run(connect(lake), "step_status").to_dicts()
    }
    assert got == {
        4: (1259, 1, 0, True, False),
        5: (1259, 1, 0, True, False),
        6: (1259, raw[6][1], raw[6][3], False, True),
    }

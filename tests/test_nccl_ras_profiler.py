"""NCCL RAS reports (text corpus file, JSON from the documented field list) and the NCCL example
profiler plugin's output (corpus excerpt, and the 2.28-2.29 bare-token variant)."""

from __future__ import annotations

import json

from conftest import corpus

from pipeline.ingest import nccl


def test_ras_text_report():
    name = "nccl-issue-1911-ncclras-text-mismatch-32gpu.txt"
    p = nccl.parse(corpus("nccl", name).read_bytes(), name)
    assert p.format == "nccl_ras"
    # line 1: "NCCL version 2.26.2 compiled with CUDA 12.6";
    # line 2: "CUDA runtime version 12060, driver version 12060"
    assert p.tool_versions == {
        "nccl_version": "2.26.2",
        "cuda_version": "12.6",
        "cuda_runtime_version": 12060,
        "cuda_driver_version": 12060,
    }
    rs = {r["line_no"]: r for r in p.tables["nccl_ras"].to_dicts()}
    # line 9: "      4          8            1         32       32"
    # under "Nodes Processes GPUs Processes GPUs"
    j = rs[9]
    assert (
        j["kind"],
        j["nodes"],
        j["processes_per_node"],
        j["gpus_per_process"],
        j["processes"],
        j["gpus"],
    ) == ("job", 4, 8, 1, 32, 32)
    # line 16: "    0         1         4         8        32        32   RUNNING  MISMATCH"
    g = rs[16]
    assert (
        g["kind"],
        g["comm_group"],
        g["comms_in_group"],
        g["nodes_per_comm"],
        g["ranks_per_node"],
        g["ranks_per_comm"],
        g["ranks_in_group"],
        g["status"],
        g["errors"],
    ) == ("comm_group", 0, 1, 4, 8, 32, 32, "RUNNING", "MISMATCH")
    # line 24 (Warnings section): "#0-0 (fa93daea854b060b) MISMATCH"
    i = rs[24]
    assert (i["kind"], i["severity"], i["comm_group"], i["comm_index"], i["comm_id"], i["status"]) == (
        "issue",
        "warning",
        0,
        0,
        "0xfa93daea854b060b",
        "MISMATCH",
    )
    # line 25: "Communicator ranks have different AllGather operation counts"
    # lines 26-27: "30 ranks have launched up to operation 640", "2 ranks have launched up to operation 641"
    assert [(rs[n]["kind"], rs[n]["collective"], rs[n]["n_ranks"], rs[n]["op_count"]) for n in (26, 27)] == [
        ("op_count", "AllGather", 30, 640),
        ("op_count", "AllGather", 2, 641),
    ]
    # line 28: "Rank 12 -- GPU 4 managed by process 323032 on node 192.0.2.1"
    r = rs[28]
    assert (r["kind"], r["rank"], r["cuda_dev"], r["pid"], r["host"], r["comm_id"]) == (
        "rank",
        12,
        4,
        323032,
        "192.0.2.1",
        "0xfa93daea854b060b",
    )
    assert rs[29]["rank"] == 13
    assert len(rs) == 8 and p.world_size == 32


def test_ras_text_dead_process_and_monitor_lines():
    report = (
        "Errors\n======\n\nDEAD\n  1 job process is considered dead (unreachable via the RAS network)\n"
        "  Process 3487984 on node 172.16.64.213 managing GPU 5\n\n"
        "Warnings\n========\n\n#0-0 (78db921d1c117b4a) MISMATCH\n"
        "  Communicator ranks have different AllReduce operation counts\n"
        "  7 ranks have launched up to operation 64\n"
        "  Rank 7 has launched up to operation 60 -- GPU 3 managed by process 1650386 on node node1\n"
        "[2025-12-19 13:07:07] PEER_DEAD: Process 1 on node node1 managing GPU 1\n"
    )
    p = nccl.parse(report.encode(), "ras.txt", "nccl_ras")
    rs = {r["line_no"]: r for r in p.tables["nccl_ras"].to_dicts()}
    assert (rs[4]["kind"], rs[4]["status"], rs[4]["severity"]) == ("issue", "DEAD", "error")
    assert (rs[5]["kind"], rs[5]["message"]) == (
        "line",
        "1 job process is considered dead (unreachable via the RAS network)",
    )
    assert (rs[6]["kind"], rs[6]["pid"], rs[6]["host"], rs[6]["cuda_dev"]) == (
        "dead_process",
        3487984,
        "172.16.64.213",
        5,
    )
    assert (rs[13]["collective"], rs[13]["n_ranks"], rs[13]["op_count"]) == ("AllReduce", 7, 64)
    assert (rs[14]["kind"], rs[14]["rank"], rs[14]["op_count"], rs[14]["collective"], rs[14]["comm_id"]) == (
        "rank",
        7,
        60,
        "AllReduce",
        "0x78db921d1c117b4a",
    )
    assert (
        rs[15]["kind"],
        rs[15]["status"],
        rs[15]["report_time"],
        rs[15]["pid"],
        rs[15]["host"],
        rs[15]["cuda_dev"],
    ) == ("event", "PEER_DEAD", "2025-12-19 13:07:07", 1, "node1", 1)


def test_ras_json_report():
    doc = {
        "nccl_version": "2.28.7",
        "cuda_runtime_version": 12080,
        "cuda_driver_version": 12080,
        "timestamp": "2026-01-01 00:00:00",
        "communicators_count": 1,
        "communicators": [
            {
                "hash": "fa93daea854b060b",
                "secondary_hash": "1",
                "size": 2,
                "ranks_count": 1,
                "missing_ranks_count": 1,
                "ranks": [
                    {
                        "rank": 0,
                        "host": "node01",
                        "pid": 100,
                        "cuda_dev": 0,
                        "nvml_dev": 0,
                        "status": {
                            "init_state": 0,
                            "async_error": 6,
                            "finalize_called": False,
                            "destroy_flag": False,
                            "abort_flag": True,
                        },
                        "collective_counts": {"AllReduce": 641, "AllGather": 12},
                    }
                ],
                "missing_ranks": [
                    {
                        "rank": 1,
                        "host": "node02",
                        "pid": 200,
                        "cuda_dev": 1,
                        "nvml_dev": 1,
                        "status": {"unresponsive": True, "considered_dead": False},
                    }
                ],
            }
        ],
        "ras": {"collection_time_sec": 0.01, "timeouts_count": 0},
    }
    data = json.dumps(doc).encode()
    assert nccl.sniff(data, "ras.json") == "nccl_ras"
    p = nccl.parse(data, "ras.json")
    assert p.tool_versions["nccl_version"] == "2.28.7" and p.world_size == 2
    by_kind: dict[str, list] = {}
    for r in p.tables["nccl_ras"].to_dicts():
        by_kind.setdefault(r["kind"], []).append(r)
    (c,) = by_kind["comm_group"]
    assert (c["comm_id"], c["ranks_per_comm"], c["report_time"]) == (
        "0xfa93daea854b060b",
        2,
        "2026-01-01 00:00:00",
    )
    (r,) = by_kind["rank"]
    assert (r["rank"], r["host"], r["pid"], r["async_error"], r["abort_flag"], r["status"]) == (
        0,
        "node01",
        100,
        6,
        True,
        "0",
    )
    assert sorted((x["collective"], x["op_count"]) for x in by_kind["op_count"]) == [
        ("AllGather", 12),
        ("AllReduce", 641),
    ]
    (m,) = by_kind["missing_rank"]
    assert (m["rank"], m["host"], m["unresponsive"], m["considered_dead"]) == (1, "node02", True, False)
    # monitor events, one JSON object per line
    ev = (
        b'{"timestamp": "2025-12-19 13:07:07", "group": "LIFECYCLE", "event": "PEER_DEAD", '
        b'"peer": {"host": "node1", "pid": 5, "cuda_devs": [1], "nvml_devs": [1]}, "details": "x"}\n'
    )
    assert nccl.sniff(ev, "mon.json") == "nccl_ras"
    (e,) = nccl.parse(ev * 1, "mon.json").tables["nccl_ras"].to_dicts()
    assert (e["kind"], e["status"], e["host"], e["pid"], e["cuda_dev"]) == (
        "event",
        "PEER_DEAD",
        "node1",
        5,
        1,
    )


def test_profiler_plugin_truncated_excerpt():
    name = "nccl-issue-1765-profiler-example-plugin-trace-truncated.json.txt"
    p = nccl.parse(corpus("nccl", name).read_bytes(), name)
    assert p.format == "nccl_profiler"
    g, c = sorted(p.tables["nccl_profiler_events"].to_dicts(), key=lambda r: r["event_index"])
    # line 2: {"name": "Group", "cat": "GROUP", "ph": "b", "id": 0, "pid": 12079, "tid": 1,
    #          "ts": 201606.441406, ...}
    # line 5: {"name": "Group", "cat": "GROUP", "ph": "e", ..., "ts": 201607.501953}
    assert (g["name"], g["cat"], g["pid"], g["tid"], g["start_rel_ns"], g["end_rel_ns"], g["dur_ns"]) == (
        "Group",
        "GROUP",
        12079,
        1,
        201606441,
        201607502,
        201607502 - 201606441,
    )
    # line 3: "AllReduce" COLL b at 201607.300781 with {"SeqNum": 0, "CommHash": 6479621443159067765,
    #         "Rank": 0, "Count": 2097152, "Datatype": "ncclFloat32", "Algorithm": "RING",
    #         "Protocol": "LL128", "nChannels": 24}
    # line 4: its e at 201607.453125
    assert (c["name"], c["cat"], c["start_rel_ns"], c["end_rel_ns"], c["seq_num"], c["rank"], c["count"]) == (
        "AllReduce",
        "COLL",
        201607301,
        201607453,
        0,
        0,
        2097152,
    )
    assert c["comm_id"] == hex(6479621443159067765)
    assert (c["datatype"], c["algorithm"], c["protocol"], c["n_channels"]) == (
        "ncclFloat32",
        "RING",
        "LL128",
        24,
    )
    # the array is not closed (excerpt): read leniently, with a note
    assert p.notes == ["lenient JSON: truncated: cut after the last complete element"]


def test_profiler_plugin_bare_tokens_and_missing_end():
    # NCCL 2.28-2.29 builds print API-event datatypes and streams unquoted; the array ends with {}]
    text = (
        '[\n{"name": "AllReduce", "cat": "COLL_API", "ph": "b", "id": 3, "pid": 7, "tid": 1, "ts": 10.5, '
        '"args": {"count": 8, "datatype": ncclFloat32, "Stream": 0x5020000567d0}},\n'
        '{"name": "AllReduce", "cat": "COLL", "ph": "b", "id": 4, "pid": 7, "tid": 1, "ts": 11.0, '
        '"args": {"SeqNum": 2}},\n'
        "{}]\n"
    )
    p = nccl.parse(text.encode(), "prof-node01-1.txt")
    a, b = sorted(p.tables["nccl_profiler_events"].to_dicts(), key=lambda r: r["event_index"])
    assert json.loads(a["args"]) == {"count": 8, "datatype": "ncclFloat32", "Stream": "0x5020000567d0"}
    assert (a["start_rel_ns"], a["end_rel_ns"], b["seq_num"]) == (10500, None, 2)
    assert "2 begin events without their end (output cut off)" in p.notes
    assert any("bare words read as strings" in n for n in p.notes)


def test_ras_issues_are_findings(tmp_path):
    """An NCCL RAS report's issues are findings (issue 39 item 10: the MISMATCH status had none).
    nccl#1911's report, line 24 "#0-0 (fa93daea854b060b) MISMATCH", lines 25-29: different
    AllGather operation counts, 30 ranks up to operation 640, 2 ranks up to 641, ranks 12 and 13 on
    192.0.2.1. A DEAD process (Errors section) is a finding of its own."""
    from pipeline.analyze import analyze
    from pipeline.ingest import ingest_paths
    from pipeline.lake import Lake

    d = tmp_path / "in"
    d.mkdir()
    name = "nccl-issue-1911-ncclras-text-mismatch-32gpu.txt"
    (d / name).write_bytes(corpus("nccl", name).read_bytes())
    (d / "dead-ras.txt").write_text(
        "NCCL version 2.26.2 compiled with CUDA 12.6\n\nErrors\n======\n\nDEAD\n"
        "  1 job process is considered dead (unreachable via the RAS network)\n"
        "  Process 3487984 on node 172.16.64.213 managing GPU 5\n"
    )
    lk = Lake(tmp_path / "lake")
    assert [r.status for r in ingest_paths([d], lk)] == ["ok", "ok"]
    fs = [f for f in analyze(lk)["findings"] if f["kind"] == "nccl_ras_issue"]
    # the two reports share no communicator or process: two runs, one finding each
    assert len(fs) == 2
    for f in fs:
        assert f["title"] == "NCCL RAS reports a communicator problem" and f["severity"] == "high"
        assert f["recommendation"].startswith("MISMATCH")
    assert sorted(e for f in fs for e in f["evidence"]) == [
        "NCCL RAS: DEAD; considered dead: process 3487984 on node 172.16.64.213 (GPU 5) "
        "(dead-ras.txt, line 6)",
        "NCCL RAS: communicator #0-0 (0xfa93daea854b060b) MISMATCH: its ranks launched different numbers of "
        "AllGather operations (30 rank(s) up to operation 640, 2 rank(s) up to operation 641); the report "
        f"names rank(s) 12 (192.0.2.1), 13 (192.0.2.1) ({name}, line 24)",
    ]

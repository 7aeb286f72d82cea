"""columns.sort_events: the fast decoder's events (decode._TEv, JSON scalars in cat, name, pid
and tid) skip the per-event check for a list or object there, the general decoder's (KEvent) take
it. The reference: the loop that was the only one before (reference_sort below, copied from 2c0434f's
pipeline/ingest/kineto/columns.py) on the general decoder's events of the same bytes, for real
corpus traces of several shapes; and a batch with an object in `cat`, which the fast decoder
refuses (so the batch is decoded the general way) and the check turns into text and counts."""

from __future__ import annotations

import gzip

import msgspec
import pytest
from conftest import corpus

from pipeline.ingest.kineto import columns
from pipeline.ingest.kineto.columns import CONTAINERS, CPU_KIND, GPU_KIND, SKIP_CATS, _as_text
from pipeline.ingest.kineto.stream import _BATCH_FAST, _BATCH_GENERAL


def reference_sort(events: list, unknown: dict) -> tuple[list, list, list, list]:
    """sort_events as it was before the fast path (2c0434f): every event checked."""
    gpu_idx, ann_idx, cpu_idx, ctr = [], [], [], []
    for i, e in enumerate(events):
        ph = e.ph
        if ph == "X" or ph == "C":
            odd = isinstance(e.cat, CONTAINERS) or isinstance(e.name, CONTAINERS)
            if odd or isinstance(e.pid, CONTAINERS) or isinstance(e.tid, CONTAINERS):
                _as_text(e, unknown)
        if ph == "X":
            c = e.cat
            if c in GPU_KIND:
                gpu_idx.append(i)
            elif c == "gpu_user_annotation":
                ann_idx.append(i)
            elif c not in SKIP_CATS:
                cpu_idx.append(i)
                if c not in CPU_KIND:
                    unknown[str(c)] = unknown.get(str(c), 0) + 1
        elif ph == "C":
            ctr.append(i)
    return gpu_idx, cpu_idx, ann_idx, ctr


TRACES = [
    ("hta", "tests", "data", "trace_filter", "sampled_rank-0.json.gz"),
    ("hta", "tests", "data", "with_gpu_user_annotation", "step_based_trace_2543932.json.gz"),
    ("hta", "tests", "data", "amd_trace", "mi250_minitoy_train_ROCm6_2_kineto.json.gz"),
    ("hta", "tests", "data", "mtia_trace_single_rank", "mtia_rank_0.json.gz"),
    ("hta", "tests", "data", "cpu_only", "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"),
    ("hta", "tests", "data", "call_stack", "backward_thread.json"),
    ("param", "et_replay", "tests", "inputs", "resnet_kineto.json.gz"),
    ("kineto", "tb_plugin", "samples", "resnet50_num_workers_0", "worker0.pt.trace.json.gz"),
]


def _events_json(parts) -> bytes:
    p = corpus(*parts)
    data = gzip.decompress(p.read_bytes()) if p.name.endswith(".gz") else p.read_bytes()
    if data.lstrip()[:1] == b"[":  # a bare event array (tb_plugin's sample)
        return data
    return bytes(msgspec.json.decode(data, type=dict[str, msgspec.Raw])["traceEvents"])


@pytest.mark.parametrize("parts", TRACES, ids=lambda p: p[-1][:40])
def test_fast_events_sort_as_the_checked_loop(parts):
    raw = _events_json(parts)
    fast, general = _BATCH_FAST.decode(raw), _BATCH_GENERAL.decode(raw)
    got_unknown, ref_unknown = {}, {}
    got = columns.sort_events(fast, got_unknown)
    ref = reference_sort(general, ref_unknown)
    assert got == ref and got_unknown == ref_unknown
    assert len(got[0]) + len(got[1]) > 0  # the trace's events were sorted, not an empty batch
    # the general decoder's events (checked first) sort the same
    again = {}
    assert columns.sort_events(_BATCH_GENERAL.decode(raw), again) == ref and again == ref_unknown


def test_an_object_in_cat_is_decoded_the_general_way_and_counted():
    raw = (
        b'[{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 2},'
        b' {"ph": "X", "cat": {"odd": 1}, "name": "op", "pid": 0, "tid": 1, "ts": 3, "dur": 1},'
        b' {"ph": "X", "cat": "cpu_op", "name": ["x"], "pid": 0, "tid": 1, "ts": 5, "dur": 1},'
        b' {"ph": "C", "name": "mem", "pid": [1], "tid": 0, "ts": 6}]'
    )
    with pytest.raises(msgspec.ValidationError):
        _BATCH_FAST.decode(raw)
    events = _BATCH_GENERAL.decode(raw)
    unknown = {}
    gpu, cpu, ann, ctr = columns.sort_events(events, unknown)
    assert (gpu, cpu, ann, ctr) == ([0], [1, 2], [], [3])
    ref_unknown = {}
    assert reference_sort(_BATCH_GENERAL.decode(raw), ref_unknown) == (gpu, cpu, ann, ctr)
    assert ref_unknown == unknown
    assert unknown[columns.NOT_SCALAR] == 3  # three events had a list or object in those fields
    assert events[1].cat == '{"odd":1}' and unknown['{"odd":1}'] == 1  # its text, an unknown category
    assert events[2].name == '["x"]' and events[3].pid == "[1]"

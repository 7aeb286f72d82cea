"""PyTorch profiler (Kineto) Chrome-trace JSON -> schema v3 tables.

Input: the bytes of one trace (already decompressed). Handles, per
../shared/reference/hta.md section 1d: top-level object or 2021 bare event array; categories old
(Operator/Runtime/Kernel/Memcpy/Memset) and new; integer epoch µs, ns-fraction µs and
`baseTimeNanoseconds`-relative ts; ROCm (hip*, stream 0) and MTIA (mtia_ccp_events) traces;
CPU-only traces; missing distributedInfo or ProfilerStep; uint64 `Comms Id`; invalid UTF-8
(replaced, noted). Overlapping events on one stream are kept as they are.

Output: `Parsed`, polars frames without run_id/source_id/rank (the caller adds them).
Errors: `NotKinetoError` for files that are valid JSON but not a Kineto trace, `TraceError` for
unreadable ones; both carry a one-line message.

The package (this module only re-exports; the parts never import it):
  api.py          parse() (in memory -> Parsed) and parse_stream() (a stream -> StreamParsed)
  decode.py       the msgspec structs (KEvent, KArgs, KTrace) and decode() / decode_args()
  stream.py       the streaming splitter: the traceEvents array cut into decoded batches,
                  every complete event of a truncated file kept (_Splitter)
  ../spool.py     (shared) phase-1 tables in memory up to a budget, then in Arrow IPC files
  acc.py          phase 1: the accumulator of a parse (_Acc: add() per batch, finish())
  columns.py      one batch -> gpu_activities / cpu_ops / annotations / counters rows
  values.py       the tolerant value conversions the table builders share (_int, _ints, ...)
  summary.py      the whole-trace tables built by finish() (steps, devices, process groups, ...)
  result.py       TraceMeta, Parsed, StreamParsed (tables(): phase 2, streamed)
  collectives.py  the collectives table (_collectives, msg_bytes)
  comm.py         a NCCL kernel's collective from the host records around its launch
"""

from ...ncclname import kernel_meta
from ..errors import TraceError
from ..spool import SPOOL_BYTES
from .api import parse, parse_stream
from .collectives import msg_bytes
from .columns import CPU_KIND, GPU_KIND, SKIP_CATS
from .decode import KArgs, KEvent, KTrace, NotKinetoError, decode, decode_args
from .result import Parsed, StreamParsed, TraceMeta
from .stream import BATCH_BYTES, HEAD_LIMIT, IN_MEMORY_LIMIT, MAX_EVENT_BYTES, READ_BYTES, TAIL_LIMIT

__all__ = [
    "BATCH_BYTES",
    "CPU_KIND",
    "GPU_KIND",
    "HEAD_LIMIT",
    "IN_MEMORY_LIMIT",
    "MAX_EVENT_BYTES",
    "READ_BYTES",
    "SKIP_CATS",
    "SPOOL_BYTES",
    "TAIL_LIMIT",
    "KArgs",
    "KEvent",
    "KTrace",
    "NotKinetoError",
    "Parsed",
    "StreamParsed",
    "TraceError",
    "TraceMeta",
    "decode",
    "decode_args",
    "kernel_meta",
    "msg_bytes",
    "parse",
    "parse_stream",
]

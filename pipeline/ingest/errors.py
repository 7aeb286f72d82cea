"""The errors every input format raises (one place, so no format imports another for them).

TraceError: the file cannot be read as what it looks like (empty, truncated, not JSON, wrong
shape, a corrupt archive). Its message is one line that names what is wrong; ingest stores it in
the file's failed `sources` row (pipeline/ingest/commit.py) and goes on with the batch.
UnknownFormat: a TraceError raised where the file turned out not to be the format it was taken
for at all (a file that starts like a zip but cannot be opened as one): its row's format is then
`unknown`, "when detection failed" (schemas/v3.toml, sources.format).
"""

from __future__ import annotations


class TraceError(ValueError):
    """The file cannot be read as a trace (empty, truncated, not JSON, wrong shape)."""


class UnknownFormat(TraceError):
    """The file is not the format it was taken for (its format is recorded as unknown)."""


# what parsing a malformed input raises from inside a format's own code: caught where one bad
# line or value must not stop a file (nccl/log.py) or must become one line (nccl/unpickle.py)
DATA_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError)

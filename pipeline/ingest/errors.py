"""The errors every input format raises (one place, so no format imports another for them).

TraceError: the file cannot be read as what it looks like (empty, truncated, not JSON, wrong
shape, a corrupt archive). Its message is one line that names what is wrong; ingest stores it in
the file's failed `sources` row (pipeline/ingest/commit.py) and goes on with the batch.
"""

from __future__ import annotations


class TraceError(ValueError):
    """The file cannot be read as a trace (empty, truncated, not JSON, wrong shape)."""


# what parsing a malformed input raises from inside a format's own code: caught where one bad
# line or value must not stop a file (nccl/log.py) or must become one line (nccl/unpickle.py)
DATA_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError)

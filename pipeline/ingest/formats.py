"""The facts that tell input formats apart, in one place: file-name suffixes and magic numbers.

pipeline/ingest/discover.py sniffs with them; the format modules and archive.py import them from
here rather than from each other. Sources: SQLite's file header (sqlite.org/fileformat.html,
section 1.3), the zip local-file and end-of-central-directory signatures (PKWARE APPNOTE 4.3.7,
4.3.16), gzip's ID1 ID2 (RFC 1952 section 2.3.1), the first line of an Nsight Systems report
(../shared/reference/nsys.md, section 0).
"""

from __future__ import annotations

# files a directory search picks up by suffix (Kineto JSON, Nsight Systems, archives, pickles)
TRACE_SUFFIXES = (
    ".json",
    ".json.gz",
    ".gz",
    ".sqlite",
    ".nsys-rep",
    ".qdrep",
    ".zip",
    ".pkl",
    ".pickle",
    ".tar",
    ".tgz",
)
# text outputs (NCCL_DEBUG logs, nccl-tests, watchdog messages, RAS): picked up by a directory
# search only when their first 64 KiB look like one (pipeline/ingest/nccl sniff); named files always
LOG_SUFFIXES = (".log", ".txt", ".out", ".err", ".jsonl")
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".zip")
REPORT_SUFFIXES = (".nsys-rep", ".qdrep")  # Nsight Systems reports (converted by nsys export)
NSYS_SUFFIXES = REPORT_SUFFIXES + (".sqlite",)

GZIP_MAGIC = b"\x1f\x8b"
ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
SQLITE_MAGIC = b"SQLite format 3\x00"
REPORT_MAGIC = b"NVIDIA Tegra Profiler Report"  # first line of .nsys-rep / .qdrep
# members that mark a zip as an nsys-jax archive rather than an archive of traces
NSYS_JAX_MEMBER_SUFFIXES = (".parquet", ".nsys-analysis", ".hlo.pb.xz")

# the files SQLite keeps beside a database (sqlite.org/fileformat.html section 4, walformat.html):
# a write-ahead log ("-wal") holds committed pages not yet copied into the database file (its
# 32-byte header alone holds none); a rollback journal ("-journal") whose header starts with its
# magic holds the pages a transaction cut short overwrote, to be put back
SQLITE_SIDECARS = ("-wal", "-journal")
WAL_MAGIC = (b"\x37\x7f\x06\x82", b"\x37\x7f\x06\x83")
WAL_HEADER_BYTES = 32
JOURNAL_MAGIC = b"\xd9\xd5\x05\xf9\x20\xa1\x63\xd7"


def archive_suffix(name: str) -> str | None:
    """The archive suffix of ARCHIVE_SUFFIXES that `name` ends with, case-insensitively (none of
    them ends another); None for none."""
    low = name.lower()
    return next((s for s in ARCHIVE_SUFFIXES if low.endswith(s)), None)


def archive_stem(name: str) -> str:
    """`name` without its archive suffix (as it is where it has none, or where nothing would be
    left)."""
    s = archive_suffix(name)
    return (name[: -len(s)] or name) if s else name

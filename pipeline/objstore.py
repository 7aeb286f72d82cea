"""Object storage: inputs and lakes given as URLs (`s3://bucket/prefix/`), read and written
through fsspec's S3 file system (s3fs, the `s3` extra: `pip install 'tracelake[s3]'`).

Credentials and the endpoint come from where boto finds them (AWS_ACCESS_KEY_ID /
AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, AWS_PROFILE and ~/.aws/config and credentials, an
instance role; AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL for an S3-compatible server such as MinIO
or moto): nothing here reads, stores or prints them. A URL carrying credentials of its own
(`s3://KEY:SECRET@bucket/...`) is refused, so none can reach a `sources` row, a report or a log.

Errors: ObjectStoreError, one line naming the URL (no such bucket, access denied, s3fs missing).
"""

from __future__ import annotations

import os
import re
from functools import lru_cache

SCHEMES = ("s3",)
_URL = re.compile(r"^(s3)://([^/]*)(/.*)?$", re.IGNORECASE)
# a path that went through pathlib (typer's Path options) lost one slash of its scheme
_MANGLED = re.compile(r"^(s3):/(?!/)", re.IGNORECASE)
EXTRA_HINT = "s3:// paths need the s3 extra: pip install 'tracelake[s3]' (s3fs)"


class ObjectStoreError(OSError):
    """One line naming the URL and what is wrong (str() is that line; .filename the URL)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def is_url(path) -> bool:
    """Whether `path` (str or os.PathLike) names an object-store location (`s3://...`; also the
    `s3:/...` pathlib makes of it)."""
    s = os.fspath(path) if isinstance(path, os.PathLike) else path
    return isinstance(s, str) and bool(_URL.match(s) or _MANGLED.match(s))


def normalize(path) -> str:
    """The URL of `path` (is_url): scheme lower-case, the slash pathlib dropped put back, no
    trailing slash. Raises ObjectStoreError for a URL without a bucket or with credentials in it."""
    s = os.fspath(path) if isinstance(path, os.PathLike) else str(path)
    s = _MANGLED.sub(lambda m: m.group(1) + "://", s, count=1)
    m = _URL.match(s)
    if m is None or not m.group(2):
        raise ObjectStoreError(f"{s}: not an s3://bucket/prefix URL")
    if "@" in m.group(2) or ":" in m.group(2):
        raise ObjectStoreError(
            "s3 URL with credentials or a port in its bucket name: give the bucket only, and the "
            "credentials through the AWS environment or ~/.aws (docs/usage.md, 'Object storage')"
        )
    return f"{m.group(1).lower()}://{m.group(2)}{(m.group(3) or '').rstrip('/')}"


def key(url: str) -> str:
    """`bucket/prefix` of an s3:// URL (the form fsspec's methods take)."""
    return normalize(url).split("://", 1)[1]


def url_of(fs_path: str) -> str:
    """The s3:// URL of a `bucket/key` path fsspec returns."""
    return "s3://" + fs_path.lstrip("/")


@lru_cache(maxsize=None)
def _fs(pid: int):
    try:
        import s3fs
    except ImportError:
        raise ObjectStoreError(EXTRA_HINT) from None
    # the listing cache would hide objects other machines write (a lake shared by Dask workers)
    return s3fs.S3FileSystem(use_listings_cache=False, skip_instance_cache=True)


def filesystem():
    """The S3 file system of this process (one per process: s3fs's event loop is not fork-safe,
    so a forked worker gets its own). ObjectStoreError when s3fs is not installed."""
    return _fs(os.getpid())


def describe(url: str, e: BaseException) -> ObjectStoreError:
    """The one-line error for an exception of the object store about `url` (no credentials: boto's
    messages name the bucket, key and error code only)."""
    if isinstance(e, ObjectStoreError):
        return e
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    if isinstance(e, FileNotFoundError) and ("bucket" in text.lower() or key(url).count("/") == 0):
        text = "no such bucket"
    elif isinstance(e, FileNotFoundError):
        text = "no such object or prefix"
    elif isinstance(e, PermissionError):
        text = f"access denied ({text})"
    out = ObjectStoreError(f"{url}: {text}"[:400].replace("\n", " "))
    out.filename = url
    return out


def check_bucket(url: str, whole: bool = False) -> None:
    """Raise ObjectStoreError naming `url` when its bucket does not exist or cannot be reached;
    whole: also when no object is at or under `url`."""
    fs = filesystem()
    bucket = key(url).split("/", 1)[0]
    try:
        fs.call_s3("head_bucket", Bucket=bucket)  # (fs.exists says False for any error)
        if whole and not fs.exists(key(url)):
            raise FileNotFoundError("no such key")
    except Exception as e:  # botocore's and aiohttp's errors: unreachable endpoint, bad credentials
        raise describe(url, e) from None

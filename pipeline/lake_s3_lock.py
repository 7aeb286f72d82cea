"""The writer lock of a lake in object storage (pipeline/lake_s3.py's module doc, "One writer at a
time"): the object <url>/.lock created with a conditional PUT (If-None-Match: *), holding its
holder's pid, host, start and lease expiry; renewed every LOCK_TTL_S / 3 seconds by a PUT
conditional on its ETag; taken over, by a PUT conditional on the stale ETag, once its lease
expired or when its holder on this host no longer runs; deleted by its holder when done.
TRACELAKE_S3_LOCK_TTL_S sets the lease (default 300 s); the machines' clocks are assumed to agree
to well within it."""

from __future__ import annotations

import datetime
import json
import os
import socket
import threading
import time
from contextlib import contextmanager

from .lake_base import LakeBusy, LakeError

LOCK_TTL_S = 300


def lock_ttl_s() -> float:
    return float(os.environ.get("TRACELAKE_S3_LOCK_TTL_S", LOCK_TTL_S))


class S3Lock:
    """The writer lock of an S3Files (module doc: a conditional PUT of <url>/.lock, a lease)."""

    def _s3(self, method: str, k: str, **kw):
        bucket, _, key = k.partition("/")
        return self.filesystem.call_s3(method, Bucket=bucket, Key=key, **kw)

    def _lock_body(self) -> bytes:
        now = time.time()
        return json.dumps(
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "since": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                "expires": now + lock_ttl_s(),
            }
        ).encode()

    def _stale(self, holder: dict) -> bool:
        if float(holder.get("expires") or 0) < time.time():
            return True
        if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
            try:
                os.kill(holder["pid"], 0)
            except ProcessLookupError:
                return True
            except OSError:
                return False
        return False

    def _take(self, k: str) -> str:
        """Create or take over the lock object; its ETag. LakeBusy when another holds it."""
        try:
            return self._s3("put_object", k, Body=self._lock_body(), IfNoneMatch="*")["ETag"]
        except Exception as e:
            if not _precondition(e):
                raise self._fail("cannot lock the lake", e) from None
        try:
            fs = self.filesystem  # the ETag first: a body newer than it fails the IfMatch below
            etag = self._s3("head_object", k)["ETag"]
            holder = json.loads(fs.cat_file(k) or b"{}")
        except Exception:
            holder, etag = {}, None
        if etag is not None and self._stale(holder):
            try:
                return self._s3("put_object", k, Body=self._lock_body(), IfMatch=etag)["ETag"]
            except Exception as e:
                if not _precondition(e):
                    raise self._fail("cannot lock the lake", e) from None
        who = (
            f" (pid {holder.get('pid')} on {holder.get('host')}, since {holder.get('since')})"
            if holder.get("pid")
            else ""
        )
        raise LakeBusy(
            f"{self.url}: another tracelake command (ingest or forget) is writing to this lake{who}; wait "
            "for it to finish, then run this one again"
        )

    def held(self) -> None:
        """Raise LakeError when this process's lease ran out or was taken over (it could not renew
        it for LOCK_TTL_S, and another writer may hold the lake now): commit() stops then."""
        until = getattr(self, "_lease_until", None)
        if until is not None and time.time() > until:
            raise LakeError(
                f"{self.url}: this ingest lost the lake's lock (its lease could not be renewed for "
                f"{lock_ttl_s():g} s); run it again"
            )

    @contextmanager
    def lock(self):
        """Hold the lake's writer lock (module doc) for the duration. LakeBusy (one line, naming
        the holder) when another process holds it."""
        self.ensure()
        k = self._key(".lock")
        etag = [self._take(k)]
        self._lease_until = time.time() + lock_ttl_s()
        stop = threading.Event()

        def renew() -> None:
            while not stop.wait(lock_ttl_s() / 3):
                try:
                    until = time.time() + lock_ttl_s()
                    etag[0] = self._s3("put_object", k, Body=self._lock_body(), IfMatch=etag[0])["ETag"]
                    self._lease_until = until
                except Exception as e:  # unreachable: tried again; taken over: lost (held())
                    if _precondition(e):
                        self._lease_until = 0.0

        t = threading.Thread(target=renew, name="tracelake-s3-lock", daemon=True)
        t.start()
        try:
            yield self
        finally:
            stop.set()
            t.join()
            self._lease_until = None
            try:
                if self._s3("head_object", k)["ETag"] == etag[0]:
                    self._s3("delete_object", k)
            except Exception:  # gone already, or unreachable: the lease expires
                pass


def _precondition(e: BaseException) -> bool:
    """Whether an S3 error is a failed conditional write (the object exists, or changed)."""
    text = f"{type(e).__name__} {e}"
    return isinstance(e, FileExistsError) or any(
        s in text for s in ("pre-condition", "PreconditionFailed", "ConditionalRequestConflict", "412")
    )

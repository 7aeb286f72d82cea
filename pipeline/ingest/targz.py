"""A compressed tar (.tar.gz, .tgz), read front to back by one worker: it cannot be listed
without inflating it whole, so its members are hashed in a first pass and only the new ones
parsed in a second (pipeline/ingest/prepare.py prepare() for each).
"""

from __future__ import annotations

import hashlib
import tarfile
import zlib
from pathlib import Path

from ..lake import Lake, one_line
from . import archive as arc
from .discover import excluded
from .errors import TraceError
from .formats import LOG_SUFFIXES
from .prepare import prepare
from .rows import PASSED_OVER, Options, Prepared, content_sha256, failed, skipped
from .runs import dir_name, is_done, run_for


def work_targz(path: str, opts: Options, done, lake: Lake, below: str | None = None) -> list[Prepared]:
    """A compressed tar, front to back: pass 1 hashes every wanted member; pass 2 (only when some
    member is new, or force) parses the new ones. Members that sniff as nothing of ours are left
    out, as a directory search would."""
    display = str(Path(path).absolute())
    out: list[Prepared] = []
    try:
        shas = {}
        for m, f, why in arc.stream_members(Path(path)):
            if f is not None and not excluded(m.name, opts.exclude):
                h = hashlib.sha256()
                while block := f.read(1 << 20):
                    h.update(block)
                shas[m.name] = h.hexdigest()
        todo = {
            n
            for n, s in shas.items()
            if opts.force
            or not is_done(
                done, s, run_for(arc.member_run_name(display, n, below), opts.run), opts.run is None
            )
        }
        for m, f, why in arc.stream_members(Path(path)):
            if excluded(m.name, opts.exclude):
                continue
            run_id = run_for(arc.member_run_name(display, m.name, below), opts.run)
            disp = f"{display}!{m.name}"
            if why is not None:
                out.append(failed(disp, run_id, why))
                continue
            if m.name not in todo:
                out.append(skipped(disp, done, shas[m.name], run_id, opts.run is None))
                continue
            inp = arc.StreamMember(display, m.name, m.size, f, below)
            try:
                p = prepare(inp, opts, done, lake, sha=shas[m.name])
            except TraceError:
                raise  # the archive itself (its gzip stream) failed
            except MemoryError:
                p = failed(disp, run_id, "out of memory while ingesting this member", shas[m.name], m.size)
            except Exception as e:
                p = failed(
                    disp,
                    run_id,
                    f"could not ingest ({type(e).__name__}: {one_line(str(e))[:200]}); "
                    "please report this file",
                    shas[m.name],
                    m.size,
                )
            if (
                p is not None
                and p.status == "failed"
                and (p.error or "").startswith("not a Kineto trace, Nsight")
                and m.name.lower().endswith(LOG_SUFFIXES)
            ):  # named like a log, not one: passed over as a directory search does (no sources row)
                p = Prepared(disp, run_id, PASSED_OVER)
            if p is not None:
                out.append(p)
    except (TraceError, OSError, tarfile.TarError, EOFError, zlib.error) as e:
        # a member's data cut short raises from its read, not from the tar header walk
        err = (
            str(e)
            if isinstance(e, TraceError)
            else f"cannot read: {e.strerror or e}"
            if isinstance(e, OSError)
            else f"corrupt or truncated tar.gz ({one_line(str(e)) or type(e).__name__})"
        )
        for p in out:
            if p.staged is not None:
                Lake(opts.lake).discard(p.staged)
        sha = content_sha256(Path(path)) if Path(path).is_file() else None
        return [
            failed(
                display,
                run_for(below if below not in (None, "", ".") else dir_name(path), opts.run),
                err,
                sha,
                Path(path).stat().st_size if Path(path).exists() else 0,
            )
        ]
    return out

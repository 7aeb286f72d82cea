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
        shas, cut = _hashed(path, opts)
        if cut is not None and cut[0] is None and not shas:
            raise cut[1]  # nothing complete before the archive's fault: the archive fails
        # by place, not by name: two members may share a name (`tar -r` of an updated file)
        todo = {
            k
            for k, (n, s) in enumerate(shas)
            if opts.force
            or not is_done(
                done, s, run_for(arc.member_run_name(display, n, below), opts.run), opts.run is None
            )
        }
        k = -1  # the wanted member's place in pass 1's order
        for m, f, why in _until(arc.stream_members(Path(path)), cut, len(shas), opts):
            if excluded(m.name, opts.exclude):
                continue
            run_id = run_for(arc.member_run_name(display, m.name, below), opts.run)
            disp = f"{display}!{m.name}"
            if why is not None:
                out.append(failed(disp, run_id, why))
                continue
            k += 1
            sha = shas[k][1]
            if k not in todo:
                out.append(skipped(disp, done, sha, run_id, opts.run is None))
                continue
            inp = arc.StreamMember(display, m.name, m.size, f, below)
            try:
                p = prepare(inp, opts, done, lake, sha=sha)
            except TraceError:
                raise  # the archive itself (its gzip stream) failed
            except MemoryError:
                p = failed(disp, run_id, "out of memory while ingesting this member", sha, m.size)
            except Exception as e:
                p = failed(
                    disp,
                    run_id,
                    f"could not ingest ({type(e).__name__}: {one_line(str(e))[:200]}); "
                    "please report this file",
                    sha,
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
    except _FAULTS as e:
        err = _error(e)
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
    if cut is not None:  # the complete members before the fault are kept; one line for the rest
        name, e = cut
        kept = f"the {len(shas)} complete member(s) before it were kept" if shas else "no member before it"
        if name is not None:
            run_id = run_for(arc.member_run_name(display, name, below), opts.run)
            out.append(
                failed(
                    f"{display}!{name}", run_id, f"{_error(e)}: the archive ends inside this member; {kept}"
                )
            )
        else:
            run_id = run_for(below if below not in (None, "", ".") else dir_name(path), opts.run)
            out.append(failed(display, run_id, f"{_error(e)} after its last complete member; {kept}"))
    return out


# a member's data cut short raises from its read, not from the tar header walk
_FAULTS = (TraceError, OSError, tarfile.TarError, EOFError, zlib.error)


def _error(e: BaseException) -> str:
    """The one-line error of a fault reading a compressed tar."""
    if isinstance(e, TraceError):
        return str(e)
    if isinstance(e, OSError):
        return f"cannot read: {e.strerror or e}"
    return f"corrupt or truncated tar.gz ({one_line(str(e)) or type(e).__name__})"


def _hashed(path: str, opts: Options) -> tuple[list, tuple | None]:
    """Pass 1 of work_targz: ([(member name, sha256 of its bytes)] for each wanted member read
    whole, in the archive's order (two may share a name); cut), cut being None for an archive
    read to its end, else (the name of the member whose data the fault cut short, or None when
    it came between members or after the last; the exception): a truncated archive keeps its
    complete members (as a truncated .json.gz keeps its complete events)."""
    shas: list = []
    current = None
    try:
        for m, f, why in arc.stream_members(Path(path)):
            if f is not None and not excluded(m.name, opts.exclude):
                current = m.name
                h = hashlib.sha256()
                while block := f.read(1 << 20):
                    h.update(block)
                shas.append((m.name, h.hexdigest()))
                current = None
    except _FAULTS as e:
        return shas, (current, e)
    return shas, None


def _until(members, cut: tuple | None, complete: int, opts: Options):
    """Pass 2's members: all of them, or (cut) those before the member cut short (the wanted
    member after the `complete` ones pass 1 read whole), the archive's fault where pass 1 met it
    not raised again."""
    if cut is None:
        yield from members
        return
    k = 0
    try:
        for m, f, why in members:
            if f is not None and not excluded(m.name, opts.exclude):
                if k == complete:
                    return
                k += 1
            yield m, f, why
    except _FAULTS:
        return

"""An archive in a bucket (.tar, .tar.gz, .tgz, .zip: an "object_archive" unit of
pipeline/ingest/objects.py plan_urls), read by the worker that gets it: fetched to a local
temporary file, then read as a local archive is."""

from __future__ import annotations

import shutil

from .. import objstore, scratch
from .discover import plan
from .objects import ObjectInput
from .rows import failed
from .runs import run_for


def work_archive(work, unit, opts, done, own_process: bool = True) -> list:
    """The outcomes of an archive object's members (executors.work calls it for an
    "object_archive" unit; work: executors.work, for each unit the local archive makes): the object
    fetched to a local temporary file (removed when done) in a directory named as the object's
    (archive.member_run_name names a top member stating a job by it), planned as a local archive is
    (discover.plan; members' runs below the object's own prefix), every outcome's path and row
    path given back as the object's URL. A fetch or listing that fails is one failed outcome."""
    inp: ObjectInput = unit.item
    d = scratch.make("archive")
    home = inp.dir_run_name  # the object's "directory": a top member stating a job is named by it
    local = (d / home if home not in ("", ".", "..") and "/" not in home else d) / inp.name
    try:
        try:
            local.parent.mkdir(exist_ok=True)
            objstore.filesystem().get_file(objstore.key(inp.url), str(local))
        except Exception as e:
            return [failed(inp.url, run_for(inp.run_name, opts.run), str(objstore.describe(inp.url, e)))]
        units, _ = plan([local], opts.exclude)
        out = []
        for u in units:
            if u.kind == "problem":
                why = u.item.error.replace(str(local), inp.url)
                out.append(failed(inp.url, run_for(inp.run_name, opts.run), why, size=inp.length))
                continue
            if u.kind == "targz":
                u.below = inp.run
            elif hasattr(u.item, "member"):  # a zip or tar member, or one refused
                u.item.below = inp.run
            else:  # not an archive after all (a gzipped trace named .tar.gz, an nsys-jax zip)
                u.item.run = inp.run_name
            out += work(u, opts, done, own_process) if u.kind != "refused" else [_refused(u.item, opts)]
        for p in out:
            p.path = p.path.replace(str(local), inp.url)
            if p.row and isinstance(p.row.get("path"), str):
                p.row["path"] = p.row["path"].replace(str(local), inp.url)
        return out
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _refused(member, opts):
    return failed(member.display, run_for(member.run_name, opts.run), member.error)

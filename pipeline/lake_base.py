"""What every kind of lake shares (pipeline/lake.py on a local disk, pipeline/lake_s3.py in object
storage): the one-line errors, a staged source and how its tables are written to a staging
directory on the local disk (stage_into)."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from . import schema as sch
from .oneline import one_line  # noqa: F401  (re-exported: lake.py, lake_s3.py)
from .parts import derive_staged, write_parquet, write_stream


class LakeError(RuntimeError):
    pass


class LakeBusy(LakeError):
    """Another ingest holds the lake's lock."""


@dataclass
class Staged:
    """A source's parts written under <lake>/.tmp/<id>/ (an object-store lake: a local staging
    directory, or <lake>/.tmp/<id>/ in the bucket once published), not yet in the lake (picklable:
    a worker process stages, the ingesting process commits)."""

    dir: str
    run_id: str
    source_id: str
    tables: list[str] = field(default_factory=list)  # tables with a staged part (sources excluded)


def stage_into(tmp: Path, run_id: str, source_id: str, tables: dict[str, object]) -> Staged:
    """Write one source's tables as <tmp>/<table>.parquet (Lake.stage's doc: tables, streaming,
    conforming, the derived columns of gpu_activities). tmp must not exist yet; it is removed
    again when a table cannot be written (SchemaError, OSError)."""
    whole = {t: sch.conform(t, d) for t, d in tables.items() if isinstance(d, (pa.Table, dict))}
    tmp.mkdir(parents=True)
    done: list[str] = []
    try:
        staged = [(tmp / f"{t}.parquet", t, tbl) for t, tbl in whole.items() if tbl.num_rows]
        # Parquet encoding releases the GIL: write the tables side by side
        with ThreadPoolExecutor(max_workers=2) as pool:
            list(pool.map(lambda x: write_parquet(x[2], x[0]), staged))
        done += [t for _, t, _ in staged]
        for t, d in tables.items():
            if d is None or t in whole:
                continue
            if write_stream(t, d() if callable(d) else d, tmp / f"{t}.parquet"):
                done.append(t)
        if "gpu_activities" in done:
            derive_staged(tmp, done)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Staged(str(tmp), run_id, source_id, done)

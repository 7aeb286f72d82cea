"""The lake from Python, for notebooks and scripts: the connection `tracelake sql` and `tracelake
analyze` use (pipeline.query.connect), with every table, derived view and metric of queries/ as
a view, returned as polars DataFrames or Arrow tables.

    import pipeline
    lake = pipeline.open_lake(".tracelake")            # or a path; options as the CLI's
    lake.runs()                                         # one row per run
    lake.df("step_time", run="dlrm_kineto")             # any table, view or metric, one run or all
    lake.sql("SELECT * FROM mfu WHERE rank = $rank", {"rank": 0})   # DuckDB SQL with parameters
    doc = lake.analysis()                               # the tracelake.analyze/5 document

Names a user can query: `lake.names()` (the schema tables, the metric files of queries/, the
derived views of queries/views/; DuckDB's schema `internal` holds helpers and is not listed).
Column docs: schemas/v3.toml, the SQL files' headers, docs/sql-reference.md.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa

from . import query
from .lake import Lake
from .lake_damage import fallback_note

KERNEL_WAIT_MAX_US = 1e9  # as the CLI's --kernel-wait-us (pipeline/cli/options.py): 1,000 s


def open_lake(
    path: str | Path = ".tracelake",
    *,
    window: str = "all",
    kernel_wait_us: float = 30.0,
    peak_tflops: float | None = None,
    model_flops_per_step: float | None = None,
    tokens_per_step: float | None = None,
) -> LakeSession:
    """A session on the lake at path, with the analysis options of the CLI (docs/usage.md:
    window 'all' | 'hta', kernel_wait_us in µs, peak_tflops in TFLOP/s, model_flops_per_step in
    FLOP per step and rank, tokens_per_step per rank), checked as the CLI checks them. Raises
    FileNotFoundError when path holds no lake (the TRACELAKE marker), ValueError for a bad window
    or a value that is not a finite number (kernel_wait_us 0 to KERNEL_WAIT_MAX_US, the others
    > 0)."""
    lake = Lake(path)
    if not lake.exists():
        raise FileNotFoundError(f"{path}: not a tracelake lake (run `tracelake ingest TRACES --lake {path}`)")
    if window not in ("all", "hta"):
        raise ValueError("window must be 'all' or 'hta'")
    for name, v, least in (
        ("kernel_wait_us", kernel_wait_us, 0),
        ("peak_tflops", peak_tflops, None),
        ("model_flops_per_step", model_flops_per_step, None),
        ("tokens_per_step", tokens_per_step, None),
    ):
        if v is None and least is None:
            continue
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or (v < least if least is not None else v <= 0):
            raise ValueError(
                f"{name} must be a finite number {'>= 0' if least is not None else '> 0'}: {v!r}"
            )
    if kernel_wait_us > KERNEL_WAIT_MAX_US:
        raise ValueError(
            f"kernel_wait_us must be a finite number from 0 to {KERNEL_WAIT_MAX_US:,.0f} (µs): "
            f"{kernel_wait_us!r}"
        )
    return LakeSession(
        lake,
        dict(
            window=window,
            kernel_wait_threshold_ns=int(kernel_wait_us * 1000),
            peak_tflops=peak_tflops,
            model_flops_per_step=model_flops_per_step,
            tokens_per_step=tokens_per_step,
        ),
    )


class LakeSession:
    """One lake and one DuckDB connection to it (opened on first use; `with open_lake(...) as
    lake:` closes it). The connection sees the lake as it was when it opened: after an ingest,
    open a new session. A per-source result part that cannot be read (a local_* file cut or
    damaged: pipeline/lake_damage.py fallback_note) is not an error: the session warns once
    (UserWarning, one line naming the file) and reads every metric from the lake's own rows
    from then on, as analysis does."""

    def __init__(self, lake: Lake, options: dict):
        self.lake, self.options = lake, options
        self._con: duckdb.DuckDBPyConnection | None = None
        self._local = True  # the per-source results are read (until one cannot be)

    @property
    def connection(self) -> duckdb.DuckDBPyConnection:
        """The DuckDB connection (query.connect with this session's options), for what the
        methods below do not cover."""
        if self._con is None:
            try:
                self._con = query.connect(self.lake, **self.options, local_results=self._local)
            except duckdb.Error as e:  # a small lake's tables are read as it connects
                note = fallback_note(self.lake, e) if self._local else None
                if note is None:
                    raise
                self._without_local(note)
                self._con = query.connect(self.lake, **self.options, local_results=False)
        return self._con

    def _without_local(self, note: str) -> None:
        self.close()
        self._local = False
        warnings.warn(
            f"{note}, on a new connection (temporary tables made on the old one are gone)", stacklevel=4
        )

    def _read(self, fn):
        """fn(connection), once more without the per-source results when it fails reading one
        (connecting's own failure is the connection property's)."""
        con = self.connection
        try:
            return fn(con)
        except duckdb.Error as e:
            note = fallback_note(self.lake, e) if self._local else None
            if note is None:
                raise
            self._without_local(note)
        return fn(self.connection)

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None

    def __enter__(self) -> LakeSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def runs(self) -> pl.DataFrame:
        """One row per run: run_id, sources (files), failed (of them, failed ingests), ranks
        (distinct ranks of the files read: a file's rank, or the ranks of a file of several
        processes, sources.ranks, as an Nsight Systems export of 2 processes), formats (sorted
        list), first_path (one file of it)."""
        src = self.lake.sources()
        ok = src.filter(pl.col("status") != "failed")
        parts = [ok.select("run_id", r=pl.col("rank").cast(pl.Int64))]
        if "ranks" in ok.columns:
            parts.append(
                ok.select("run_id", r=pl.col("ranks"))
                .explode("r")
                .select("run_id", pl.col("r").cast(pl.Int64))
            )
        ranks = pl.concat(parts).drop_nulls("r").group_by("run_id").agg(ranks=pl.col("r").n_unique())
        return (
            src.group_by("run_id")
            .agg(
                sources=pl.len(),
                failed=(pl.col("status") == "failed").sum(),
                formats=pl.col("format").unique().sort(),
                first_path=pl.col("path").sort().first(),
            )
            .join(ranks, on="run_id", how="left")
            .with_columns(pl.col("ranks").fill_null(0).cast(pl.UInt32))
            .select("run_id", "sources", "failed", "ranks", "formats", "first_path")
            .sort("run_id")
        )

    def names(self) -> list[str]:
        """Every table and view a user can query, sorted: what `tracelake sql --list` lists
        (pipeline/sqldoc.py) that this lake's connection holds; the per-source results
        (local_*) and the internal views are left out, though a query may still name them."""
        from .sqldoc import listed

        documented = {d.name for d in listed()}
        rows = self.connection.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' ORDER BY table_name"
        ).fetchall()
        return [r[0] for r in rows if r[0] in documented]

    def arrow(self, name: str, run: str | None = None) -> pa.Table:
        """The rows of a table, view or metric (a name of names()), of one run or of all.
        Raises KeyError naming the known names for another name, ValueError for a run of a
        view without runs (the device catalog)."""
        known = self.names()
        name = name.lower() if name.lower() in known else name  # names are case-insensitive, as in SQL
        if name not in known:
            raise KeyError(f"{name!r}: no such table or view (known: {', '.join(known)})")
        ident = '"' + name.replace('"', '""') + '"'
        if run is None:
            return self._read(lambda con: con.sql(f"SELECT * FROM {ident}").to_arrow_table())
        if "run_id" not in self.connection.sql(f"SELECT * FROM {ident} LIMIT 0").columns:
            raise ValueError(f"{name} has no run_id column: leave run out")
        return self._read(
            lambda con: con.sql(
                f"SELECT * FROM {ident} WHERE run_id = $run", params={"run": run}
            ).to_arrow_table()
        )

    def df(self, name: str, run: str | None = None) -> pl.DataFrame:
        """arrow(name, run) as a polars DataFrame."""
        return pl.from_arrow(self.arrow(name, run))

    def sql_arrow(self, text: str, params: dict | list | None = None) -> pa.Table:
        """The result of one DuckDB query; params fill its `$name` (dict) or `?` (list)
        parameters. Raises duckdb.Error for a bad query, ValueError for text that is no query (empty,
        or a statement that returns no rows). Unlike `tracelake sql`, the session runs any
        statement (CREATE TEMP TABLE for a notebook's own tables, COPY ... TO for exports): the
        lake's files are the caller's to keep intact."""

        def rows(con):
            rel = con.sql(text, params=params)
            if rel is None:
                raise ValueError("the statement returns no rows (give a query)")
            return rel.to_arrow_table()

        return self._read(rows)

    def sql(self, text: str, params: dict | list | None = None) -> pl.DataFrame:
        """sql_arrow(text, params) as a polars DataFrame."""
        return pl.from_arrow(self.sql_arrow(text, params))

    def analysis(self, **options) -> dict:
        """The `tracelake.analyze/5` document (docs/analyze-json.md) with this session's options;
        options: more of pipeline.analyze.analyze's keyword arguments (runs, top_n, gpu_hour_cost,
        global_tokens_per_step, palm_flops_per_token)."""
        from .analyze import analyze

        return analyze(self.lake, **{**self.options, **options})

    def _one_run(self, run: str | None) -> str:
        """`run`, else the lake's only run; ValueError for an unknown run or a lake of several."""
        known = self.runs()["run_id"].to_list()
        if run is None:
            if len(known) != 1:
                raise ValueError(
                    f"the lake holds {len(known)} runs: name one (runs: {', '.join(known) or 'none'})"
                )
            return known[0]
        if run not in known:
            raise ValueError(f"run {run!r}: not in the lake (runs: {', '.join(known) or 'none'})")
        return run

    def whatif(self, run: str | None = None, changes: list | None = None) -> dict:
        """The `tracelake.whatif/1` document (docs/whatif.md) of `run` (default: the lake's only
        run): the measured step, the identity replay's error and, per change, the predicted step
        with its critical path. changes: pipeline.whatif.changes objects (scale("kernel:gemm*=0.5"),
        on_time(7), ...), or the `tracelake whatif` options as text ('--on-time 7',
        '--scale kernel:gemm*=0.5': pipeline.whatif.changes.from_text); None: the defaults. Raises
        ValueError for an unknown run, a lake of several runs without `run`, a run without GPU work
        or steps, a change it cannot read or one the run cannot take (a rank it does not have)."""
        from . import whatif as wi

        run = self._one_run(run)
        given = None
        if isinstance(changes, str | wi.changes.Change):  # one change, not in a list
            changes = [changes]
        if changes is not None:
            given = [wi.changes.from_text(c) if isinstance(c, str) else c for c in changes]
            for c in given:
                if not isinstance(c, wi.changes.Change):
                    raise ValueError(f"change {c!r}: not a pipeline.whatif.changes object or option text")

        def doc(con):
            g = wi.build(con, run)
            wi.changes.check(g, given or [])  # as the CLI: a change the run cannot take
            wanted = given if given is not None else wi.changes.defaults(g)
            return wi.whatif(con, run, wanted, graph=g)

        return self._read(doc)

    def critical_path(self, run: str | None = None) -> pl.DataFrame:
        """Each step's critical path across ranks as segments (docs/whatif.md): step, end_rank,
        seq, kind, rank, start_ns, end_ns (absolute clock), dur_ns, name. Raises ValueError as
        whatif()."""
        from . import whatif as wi

        run = self._one_run(run)
        return self._read(lambda con: wi.critical_path(con, run))

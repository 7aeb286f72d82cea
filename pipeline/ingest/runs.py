"""Which run each file lands in. The rule, as docs/usage.md states it:

1. A file's run is named by `--run`, else by its directory: its path below the directory given
   (as TensorBoard names runs), or the directory's own name for a file given by name or lying
   directly in it; an archive member as if the archive were unpacked where it lies.
2. A run holds one file per rank and, without `--run`, one profiling window (files whose time
   spans overlap); a file that does not fit its named run goes to the first run it fits among
   those its name was moved to, else to a new run `<name>_<8 hex>`, with a note saying so.
3. Content already in the lake (without `--run` in any run, with it in that run) is skipped;
   `--force` re-ingests it where it is.

Ranks come from the trace (pipeline/ingest/prepare.py). This module owns names (run_for), the
index of what the lake already holds (done_index) and the rank and time claims (Runs).
"""

from __future__ import annotations

import polars as pl

from ..lake import safe_run_id

# in the note of a file not put in its named run (Runs.claim), before the run it was put in
PLACED = "; this file was put in run "


def run_for(name: str, run: str | None) -> str:
    """The run id of a file whose directory gives `name` (rule 1): --run when given."""
    return safe_run_id(run) if run else safe_run_id(name)


def moved_run(run_id: str, source_id: str) -> str:
    """The new run a file goes to when no run of its name fits it (rule 2)."""
    return safe_run_id(f"{run_id}_{source_id[:8]}")


def stored_sources(src: pl.DataFrame) -> pl.DataFrame:
    """The sources rows that did not fail, with column `named`: the run each was named
    (sources.named_run_id, before it was moved to another run; its run_id in lakes written
    before that column)."""
    ok = src.filter(pl.col("status") != "failed")
    return ok.with_columns(named=pl.coalesce("named_run_id", "run_id"))


# ------------------------------------------------------------------ what the lake holds (rule 3)

Done = dict  # (content sha256, named run | None) -> (run it is stored in, committed in this batch)


def done_index(stored: pl.DataFrame) -> Done:
    """(content sha256, named run) and (content sha256, None) -> (the run the content is stored
    in, False), for the sources of stored_sources(); files committed by this ingest are added
    with True (pipeline/ingest/commit.py). Without --run, content already in any run counts as
    in the lake (the None key): the same bytes are the same trace, whichever directory it was
    reached from."""
    done: Done = {}
    cols = (stored["content_sha256"].to_list(), stored["named"].to_list(), stored["run_id"].to_list())
    for h, n, r in zip(*cols):
        done[(h, n)] = (r, False)
        done.setdefault((h, None), (r, False))
    return done


def done_entry(done: Done, sha: str, run_id: str, any_run: bool):
    """(run, in this batch) of content `sha` named run_id when it is in the lake, else None:
    looked up in any run (any_run: no --run) or in run_id."""
    return done.get((sha, None) if any_run else (sha, run_id))


def is_done(done: Done, sha: str, run_id: str, any_run: bool) -> bool:
    """Whether content `sha` named run_id is already in the lake (done_entry)."""
    return done_entry(done, sha, run_id, any_run) is not None


def stored_run(done: Done, sha: str, run_id: str, any_run: bool) -> str:
    """The run a file already in the lake is stored in: its named run, the one it was moved to
    (Runs.claim), or (any_run) the run the same content is in."""
    return (done_entry(done, sha, run_id, any_run) or (run_id,))[0]


def skip_note(done: Done, sha: str, run_id: str, any_run: bool) -> str:
    """The note of a file skipped because its content is already in the lake or the batch."""
    run, in_batch = done_entry(done, sha, run_id, any_run) or (run_id, False)
    where = f", in run {run}" if run != run_id else ""
    if in_batch:
        return f"same content as a file ingested earlier in this batch{where}; --force re-ingests"
    return f"already in the lake (same content{where}); --force re-ingests"


# ------------------------------------------------------------------ ranks and time windows (rule 2)


class Runs:
    """The lake's runs as committing needs them: the source holding each (run, rank), each run's
    time span (the union of its sources' trace_start_ns..trace_end_ns), per named run the runs its
    files were moved to, the runs holding each content, and each source's stored row. Built from
    stored_sources(); add() keeps it current as files are committed."""

    def __init__(self, stored: pl.DataFrame):
        """stored: stored_sources() of the lake."""
        self.ranks: dict[tuple[str, int], str] = {}
        self.spans: dict[str, tuple[int, int]] = {}
        self.moved: dict[str, list[str]] = {}
        self.by_content: dict[str, list[str]] = {}
        # (run, source_id) -> (path, named run, notes saying where it was put): kept by --force
        self.rows: dict[tuple[str, str], tuple[str, str, list[str]]] = {}
        names = (
            "run_id",
            "named",
            "source_id",
            "content_sha256",
            "rank",
            "ranks",
            "trace_start_ns",
            "trace_end_ns",
            "notes",
            "path",
        )
        for r, n, s, h, k, ks, t0, t1, notes, path in zip(*[stored[c].to_list() for c in names]):
            rank_list = [k for k in (ks if ks is not None else [k]) if k is not None]
            self.add(r, n, s, h, rank_list, t0, t1, notes or [], path)

    def add(
        self,
        run_id: str,
        named: str,
        source_id: str,
        sha: str,
        rank_list: list[int],
        t0: int | None,
        t1: int | None,
        notes: list[str],
        path: str,
    ) -> None:
        """A committed source, with its sources path and notes."""
        self.rows[(run_id, source_id)] = (path, named, [n for n in notes if PLACED in n])
        for r in rank_list:
            self.ranks[(run_id, r)] = source_id
        if t0 is not None and t1 is not None:
            lo, hi = self.spans.get(run_id, (t0, t1))
            self.spans[run_id] = (min(lo, t0), max(hi, t1))
        if run_id != named and run_id not in self.moved.setdefault(named, []):
            self.moved[named].append(run_id)
        if run_id not in self.by_content.setdefault(sha, []):
            self.by_content[sha].append(run_id)

    def taken(self, run_id: str, source_id: str, rank_list: list[int]) -> list[int]:
        """The ranks of rank_list another source already holds in run_id."""
        return [r for r in rank_list if self.ranks.get((run_id, r), source_id) != source_id]

    def claim(
        self,
        run_id: str,
        source_id: str,
        rank_list: list[int],
        t0: int | None,
        t1: int | None,
        notes: list[str],
        by_time: bool = True,
    ) -> str:
        """The run a source named run_id goes to (rule 2). by_time=False (--run named it): run_id
        when no other source holds one of its ranks there. Otherwise the candidates are run_id and
        the runs files named run_id were moved to, those where no other source holds one of its
        ranks; the first whose time span overlaps the file's wins: the files of one profiling
        window run at the same time, so a second cycle of a job, or a second job of the same name
        that ran at another time, stays one run whatever the order the files come in. Else run_id
        when it is a candidate and holds no timed file yet; else a new run moved_run(). A note
        (also printed) says when the file is not put in run_id."""
        taken = self.taken(run_id, source_id, rank_list)
        if not by_time and not taken:
            return run_id
        free = [c for c in [run_id] + self.moved.get(run_id, []) if not self.taken(c, source_id, rank_list)]
        if taken:
            what = f"rank {taken[0]}" if len(taken) == 1 else f"ranks {', '.join(map(str, taken))}"
            why = f"{what} of run {run_id} is already held by source {self.ranks[(run_id, taken[0])]}"
        else:
            why = (
                f"its time span does not overlap run {run_id}'s "
                "(another profiling cycle or job in the same directory)"
            )
        if t0 is not None and t1 is not None:
            for c in free:
                span = self.spans.get(c)
                if span and span[0] <= t1 and t0 <= span[1]:
                    if c != run_id:
                        notes.append(f"{why}{PLACED}{c}, with the files of the same time window")
                    return c
            if not taken and run_id not in self.spans:
                return run_id
        elif not taken:
            return run_id
        moved = moved_run(run_id, source_id)
        notes.append(f"{why}{PLACED}{moved}")
        return moved

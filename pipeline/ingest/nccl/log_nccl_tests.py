"""nccl-tests text output (nccl.md 2.1): the '#' lines (version, test start, config, device list,
column header, units, out-of-bounds and average bus bandwidth summaries) -> nccl_events; the result
tables -> nccl_tests_results (one row per placement: out-of-place, in-place); at end of file the
device lists onto nccl_processes and each table's ranks, nodes and test name (stated or inferred).
"""

from __future__ import annotations

import re

from ... import catalog
from .common import INT32, dumps, infer_test, to_float, to_int
from .log_state import LogState, Table, TestRun

# --- nccl-tests (nccl.md 2.1) ---------------------------------------------------------------------------
T_VERSION = re.compile(
    r"#\s*nccl-tests version (?P<v>\S+)(?: nccl-headers=(?P<h>\d+))?(?: nccl-library=(?P<l>\d+))?"
)
T_START = re.compile(r"#\s*Collective test starting: (?P<t>\S+)")
T_CONFIG = re.compile(
    r"#\s*nThread (?P<n_threads>\d+) nGpus (?P<n_gpus>\d+) minBytes (?P<min_bytes>\d+) "
    r"maxBytes (?P<max_bytes>\d+) "
    r"step: (?P<step>\d+)\((?P<step_kind>\w+)\) warmup iters: (?P<warmup_iters>\d+) iters: (?P<iters>\d+)"
    r"(?: agg iters: (?P<agg_iters>\d+))? validation: (?P<validation>\d+)(?: graph: (?P<graph>\d+))?"
)
T_DEVICE = re.compile(
    r"#\s+Rank\s+(?P<rank>\d+)(?:\s+Group\s+(?P<group>\d+))?\s+Pid\s+(?P<pid>\d+)\s+on\s+(?P<host>\S+)"
    r"\s+device\s+(?P<dev>\d+)\s+\[(?P<bus>[^\]]*)\]\s*(?P<name>.*?)\s*$"
)
T_UNITS = re.compile(r"#\s+\(B\)\s+\(elements\)")
T_OOB = re.compile(r"#\s*Out of bounds values\s*:\s*(?P<n>\d+)\s*(?P<ok>\w*)")
T_AVG = re.compile(r"#\s*Avg bus bandwidth\s*:\s*(?P<bw>[-\d.eE+]+|nan)")
T_CONCLUDED = re.compile(r"#\s*Collective test concluded: (?P<t>\S+)")
MODERN_HEADER = "size count type redop root time algbw busbw #wrong time algbw busbw #wrong".split()


class TestsLines(LogState):
    """The '#' lines of nccl-tests output and its device lists (see the module docstring)."""

    def _run(self, new: bool = False) -> TestRun:
        if self.run is None or (new and self.run.used):
            self.hold("nccl-tests runs")
            self.run = TestRun()
            self.runs.append(self.run)
        return self.run

    def tests_line(self, li: dict, s: str) -> bool:
        if not s.startswith("#"):
            return self.tests_row(li, s)
        m = T_DEVICE.match(s)
        if m:
            run = self._run()
            rank = int(m.group("rank"))
            # the set holds the rank's digits: a str's hash is randomized, an int's is not (ranks
            # k * (2**61 - 1) would all share one hash)
            digits = m.group("rank").lstrip("0") or "0"
            if self.table is not None or digits in run.ranks:
                run = self._run(new=True)
            run.used = True
            dev = {k: m.group(k) for k in ("rank", "group", "pid", "host", "dev", "bus", "name")}
            self.hold("nccl-tests devices", *dev.values())
            run.ranks.add(digits)
            run.devices.append(dev | {"rank": rank, "line_no": li["line_no"]})
            self.event(li, "nccl_tests_device")
            self.recognized += 1
            return True
        m = T_VERSION.match(s)
        if m:
            run = self._run(new=True)
            run.version = m.group("v")
            self.versions.setdefault("nccl_tests_version", m.group("v"))
            self.event(
                li,
                "nccl_tests_version",
                detail=dumps(
                    {"version": m.group("v"), "nccl_headers": m.group("h"), "nccl_library": m.group("l")}
                ),
            )
            self.table = None
            return True
        m = T_START.match(s)
        if m:
            run = self._run(new=True)
            run.test = m.group("t")
            self.table = None
            self.event(li, "nccl_tests_start", detail=dumps({"test": m.group("t")}))
            return True
        m = T_CONFIG.match(s)
        if m:
            run = self._run(new=True)
            run.used = True
            self.table = None
            self.event(
                li,
                "nccl_tests_config",
                detail=dumps({k: (int(v) if v and v.isdigit() else v) for k, v in m.groupdict().items()}),
            )
            self.recognized += 1
            return True
        toks = s.lstrip("#").split()
        if "size" in toks and "count" in toks and ("time" in toks or "cputime" in toks):
            self.open_table(toks)
            self.event(li, "nccl_tests_header")
            self.recognized += 1
            return True
        if T_UNITS.match(s):
            if self.table is None or self.table.rows:
                self.open_table(MODERN_HEADER)
                self.headless[0] = self.headless[0] or li["line_no"]  # one note at the end (close_tests)
                self.headless[1] += 1
            self.event(li, "nccl_tests_header")
            return True
        m = T_OOB.match(s)
        if m:
            self.event(
                li,
                "nccl_tests_summary",
                detail=dumps({"out_of_bounds": int(m.group("n")), "status": m.group("ok")}),
            )
            return True
        m = T_AVG.match(s)
        if m:
            self.event(
                li,
                "nccl_tests_summary",
                detail=dumps(
                    {
                        "avg_busbw_gbps": to_float(m.group("bw")),
                        "table_index": self.table.index if self.table else None,
                    }
                ),
            )
            self.table = None
            return True
        m = T_CONCLUDED.match(s)
        if m:
            self.table = None
            self.event(li, "nccl_tests_concluded", detail=dumps({"test": m.group("t")}))
            return True
        if "out-of-place" in s or "in-place" in s:
            self.event(li, "nccl_tests_header")
            return True
        self.event(li, "nccl_tests_comment")
        return True

    def close_devices(self) -> None:
        """At end of file: the nccl-tests device lists onto nccl_processes."""
        p = self.t["nccl_processes"]
        rows_of: dict[tuple, list[int]] = {}  # (host, pid, cuda_dev) -> rows, built once (not per device)
        for i in range(p.n):
            rows_of.setdefault((p.get(i, "host"), p.get(i, "pid"), p.get(i, "cuda_dev")), []).append(i)
        # nccl-tests device lists
        for run in self.runs:
            for d in run.devices:
                pid, dev = to_int(d["pid"]), to_int(d["dev"], INT32)
                bus = d["bus"]
                pci = None
                mb = re.fullmatch(r"([0-9a-fA-F]{4}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})", bus or "")
                if mb:
                    pci = f"{mb.group(1).lower()}:{mb.group(2).lower()}:{mb.group(3).lower()}.0"
                hits = rows_of.get((d["host"], pid, dev))
                if not hits:
                    hits = rows_of[d["host"], pid, dev] = [
                        p.add(
                            host=d["host"], pid=pid, cuda_dev=dev, rank=d["rank"], first_line_no=d["line_no"]
                        )
                    ]
                for i in hits:
                    p.fill(
                        i,
                        gpu_name=d["name"] or None,
                        bus_id=f"[{bus}]" if p.get(i, "bus_id") is None else None,
                        pci_bus_id=pci,
                        rank=d["rank"],
                    )


class TestsTables(LogState):
    """nccl-tests result tables: header -> column layout, result lines -> nccl_tests_results."""

    def open_table(self, toks: list[str]) -> None:
        toks = [t for t in toks if t]
        idx = [i for i, t in enumerate(toks) if t in ("time", "cputime")]
        lead = toks[: idx[0]]
        extra = 0
        if toks and toks[-1] == "timestamp":
            toks = toks[:-1]
            extra = 2  # date and time tokens
        bounds = idx + [len(toks)]
        places = ["out_of_place", "in_place"] if len(idx) >= 2 else ["out_of_place"]
        groups = [
            (places[k] if k < len(places) else f"group{k}", toks[bounds[k] : bounds[k + 1]])
            for k in range(len(idx))
        ]
        run = self._run()
        run.used = True
        self.hold("nccl-tests tables", *toks)
        self.table = Table(len(self.tables), run, lead, groups, extra, toks[idx[0]] == "cputime")
        self.tables.append(self.table)

    def tests_row(self, li: dict, s: str) -> bool:
        tb = self.table
        toks = s.split()
        if not toks or not toks[0].isdigit():
            return False
        n_lead = len(tb.lead)
        sizes = [len(g) for _, g in tb.groups]
        full = n_lead + sum(sizes)
        if len(toks) == full + tb.extra or len(toks) == full:
            groups = tb.groups
            body = toks[n_lead:full]
        elif len(tb.groups) == 2 and len(toks) in (n_lead + sizes[1], n_lead + sizes[1] + tb.extra):
            groups = tb.groups[1:]  # trace replay: only the in-place block
            body = toks[n_lead : n_lead + sizes[1]]
        else:
            return False
        lead = dict(zip(tb.lead, toks[:n_lead]))
        size, count = to_int(lead.get("size")), to_int(lead.get("count"))
        if size is None or count is None:
            return False
        parsed = []
        pos = 0
        for placement, cols in groups:
            vals = dict(zip(cols, body[pos : pos + len(cols)]))
            pos += len(cols)
            t = to_float(vals.get("time", vals.get("cputime")))
            if t is None or not abs(t) < 9e15:  # NaN, inf or beyond int64 ns: not a result row
                return False
            wrong = vals.get("#wrong")
            err = vals.get("error")
            parsed.append(
                dict(
                    placement=placement,
                    time_ns=round(t * 1000),
                    algbw_gbps=to_float(vals.get("algbw")),
                    busbw_gbps=to_float(vals.get("busbw")),
                    wrong=None
                    if wrong in (None, "N/A")
                    else (round(to_float(wrong)) if to_float(wrong) is not None else None),
                    max_error=None if err in (None, "N/A") else to_float(err),
                )
            )
        typ = lead.get("type")
        for p in parsed:
            tb.rows.append(
                self.t["nccl_tests_results"].add(
                    line_no=li["line_no"],
                    table_index=tb.index,
                    size_bytes=size,
                    count=count,
                    type=typ,
                    dtype_bytes=catalog.dtype_bytes(typ),
                    redop=lead.get("redop"),
                    root=to_int(lead.get("root"), INT32),
                    cpu_time=tb.cpu,
                    nccl_tests_version=tb.run.version,
                    **p,
                )
            )
        self.recognized += 1
        return True

    def close_tests(self) -> None:
        """At end of file: each table's ranks, nodes and test name (stated, else inferred)."""
        # nccl-tests: ranks, nodes, test name
        first, n = self.headless
        if n:  # one note, however many times a log repeats it
            more = f" (and {n - 1} more)" if n > 1 else ""
            self.notes.append(
                f"line {first}{more}: nccl-tests units line without its header; assumed the "
                "nccl-tests >= 2.13 columns"
            )
        res = self.t["nccl_tests_results"]
        for tb in self.tables:
            devs = tb.run.devices
            n_ranks = len({d["rank"] for d in devs}) or None
            n_nodes = len({d["host"] for d in devs}) or None
            test, src = tb.run.test, "stated" if tb.run.test else None
            if test is None:
                test = infer_test(
                    [
                        (
                            res.get(i, "size_bytes"),
                            res.get(i, "count"),
                            res.get(i, "dtype_bytes"),
                            res.get(i, "redop"),
                            res.get(i, "root"),
                        )
                        for i in tb.rows
                    ],
                    n_ranks,
                    "redop" in tb.lead,
                    "root" in tb.lead,
                )
                src = "inferred" if test else None
            for i in tb.rows:
                res.set(i, n_ranks=n_ranks, n_nodes=n_nodes, test=test, test_source=src)

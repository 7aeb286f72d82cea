"""PyTorch ProcessGroupNCCL lines (nccl.md 1.10): watchdog timeouts and failures, heartbeat
timeouts, 'NCCL error in:' messages, initialization options and environments -> nccl_watchdog;
the glog prefix ('[I1210 12:00:00.123 123 ProcessGroupNCCL.cpp:1234] ') that log.py also reads on
other PyTorch lines, and the application's 'using nccl==X' line.
"""

from __future__ import annotations

import re

from .common import INT32, dumps, to_int
from .log_state import LogState, split_wrapper, wrapper_rank

# --- PyTorch (nccl.md 1.10) ---------------------------------------------------------------------------
GLOG = re.compile(
    r"\[(?P<lvl>[IWEF])(?P<date>\d{3,4})? ?(?P<time>\d{1,2}:\d{2}:\d{2}\.\d+)?\s*(?:(?P<tid>\d+) )?"
    r"(?P<src>[\w.-]+\.(?:cpp|cc|hpp|h|cu|py)):(?P<sline>\d+)\] (?P<msg>.*)$"
)
PG_TAG = re.compile(
    r"\[(?:PG ID (?P<pgid>\d+) PG GUID (?P<guid>[^\s(\]]+)(?:\((?P<desc>[^)]*)\))? "
    r"|PG (?P<pgid2>\d+) (?:\((?P<desc2>[^)]*)\) )?)?Rank (?P<rank>\d+)\] ?"
)
WORK = re.compile(r"WorkNCCL\((?P<body>(?:[^()]|\([^()]*\))*)\)")
WORK_KV = re.compile(r"(?<!\w)(\w+(?:\(ms\))?)=([^,]*)")
RAN_FOR = re.compile(r"ran for (\d+) milliseconds")
AT_WORK = re.compile(r"(?:at work|work sequence id): (\d+)")
LAST = re.compile(r"last (enqueued|started|completed) (?:NCCL )?work: (\d+)")
NCCL_ERROR = re.compile(r"NCCL error in: (?P<where>\S+?), (?P<err>.*?), NCCL version (?P<v>\d+\.\d+\.\d+\S*)")
HEARTBEAT = re.compile(r"Heartbeat monitor timed out")
APP_VERSION = re.compile(r"(?:using nccl==|NCCL version: ?)(\d+\.\d+\.\d+)")


def glog_time(m: re.Match) -> str | None:
    date, time = m.group("date"), m.group("time")
    if not time:
        return None
    if date:
        return f"{int(date[:-2]):02d}-{date[-2:]} {time}"
    return time


class TorchLines(LogState):
    """PyTorch ProcessGroupNCCL / WorkNCCL lines (see the module docstring)."""

    def torch_line(self, li: dict, text: str) -> bool:
        g = GLOG.search(text)
        wrap = text[: g.start()] if g else ""
        msg = g.group("msg") if g else text
        pg = PG_TAG.search(msg)
        body = msg[pg.end() :] if pg and pg.start() <= 2 else msg
        work = WORK.search(body)
        nerr = NCCL_ERROR.search(body)
        kind = None
        if "Watchdog caught collective operation timeout" in body or (work and "timing out" in body):
            kind = "timeout"
        elif "failure detected by watchdog" in body or "detected by watchdog at work sequence id" in body:
            kind = "failure_detected"
        elif "detected by watchdog at work" in body:
            kind = "exception_detected"
        elif HEARTBEAT.search(body):
            kind = "heartbeat_timeout"
        elif nerr:
            kind = "nccl_error"
        elif "ProcessGroupNCCL initialization options:" in body:
            kind = "init_options"
        elif "ProcessGroupNCCL environments:" in body:
            kind = "environments"
        elif g and "ProcessGroupNCCL" in g.group("src"):
            kind = "info"
        if kind is None:
            return False
        wrank = wrapper_rank(wrap) if wrap else None
        if wrank is None and wrap:
            _, _, wrank = split_wrapper(wrap)
        row = dict(
            line_no=li["line_no"],
            kind=kind,
            text=text,
            message=body.strip(),
            rank=to_int(pg.group("rank"), INT32) if pg else wrank,
        )
        if pg:
            row.update(
                pg_id=to_int(pg.group("pgid") or pg.group("pgid2")),
                pg_name=pg.group("guid"),
                pg_desc=pg.group("desc") or pg.group("desc2"),
            )
        if g:
            row.update(
                level=g.group("lvl"),
                log_time=glog_time(g),
                src_file=g.group("src"),
                src_line=to_int(g.group("sline"), INT32),
            )
        if work:
            kv = {k: v.strip() for k, v in WORK_KV.findall(work.group("body"))}
            to_ms = to_int(kv.get("Timeout(ms)"))
            row.update(
                seq=to_int(kv.get("SeqNum")),
                op_type=kv.get("OpType"),
                numel_in=to_int(kv.get("NumelIn")),
                numel_out=to_int(kv.get("NumelOut")),
                timeout_ns=to_ms * 1_000_000 if to_ms is not None else None,
            )
        m = RAN_FOR.search(body)
        if m:
            row["ran_for_ns"] = int(m.group(1)) * 1_000_000
        m = AT_WORK.search(body)
        if m and row.get("seq") is None:
            row["seq"] = to_int(m.group(1))
        for what, n in LAST.findall(body):
            row[f"last_{what}"] = to_int(n)
        if nerr:
            row["nccl_version"] = nerr.group("v")
            row["detail"] = dumps({"where": nerr.group("where"), "error": nerr.group("err")})
        if kind in ("init_options", "environments"):
            kv = {}
            for part in body.split(":", 1)[1].split(", "):
                k, _, v = part.partition(": ")
                if k.strip():
                    kv[k.strip()] = v.strip()
            row["detail"] = dumps(kv)
            if kind == "init_options":
                to_ms = to_int(kv.get("TIMEOUT(ms)"))
                row.update(
                    group_size=to_int(kv.get("size"), INT32),
                    timeout_ns=to_ms * 1_000_000 if to_ms is not None else None,
                )
                if row.get("rank") is None:
                    row["rank"] = to_int(kv.get("global rank"), INT32)
            else:
                row["nccl_version"] = kv.get("NCCL version")
        if row.get("nccl_version"):
            self.versions.setdefault("nccl_version_torch", row["nccl_version"])
        self.t["nccl_watchdog"].add(**row)
        self.recognized += 1
        return True

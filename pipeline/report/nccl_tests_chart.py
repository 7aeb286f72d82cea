"""The nccl-tests chart of the HTML report (html.py embeds its spec), in the (chart | None,
note | None) shape of charts.py: bus bandwidth against message size, log x, one line per test and
placement (out-of-place, in-place) as the output printed them (nccl_tests_results rows), with a
dashed rule at each test's link peak (queries/nccl_tests_bandwidth.sql: NVLink per direction when
every rank is on one node; across nodes the NICs' rate as the run's NCCL lines state it; otherwise
unknown, and the note says why, from its link_note)."""

from __future__ import annotations

from collections import Counter

from .altair_lib import alt
from .charts import WIDTH
from .spec_cache import Spec

_PLACEMENT = {"out_of_place": "out-of-place", "in_place": "in-place"}
# binary size labels on the log axis (8 B, 1 KiB, 8 MiB, 1 GiB)
_SIZE_LABEL = (
    "datum.value >= 1073741824 ? format(datum.value / 1073741824, '~g') + '\u00a0GiB' : "
    "datum.value >= 1048576 ? format(datum.value / 1048576, '~g') + '\u00a0MiB' : "
    "datum.value >= 1024 ? format(datum.value / 1024, '~g') + '\u00a0KiB' : "
    "format(datum.value, '~g') + '\u00a0B'"
)


def _size(n: int) -> str:
    """A message size in binary units, as the chart's axis labels it (8\u00a0B, 64\u00a0MiB)."""
    for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= k:
            return f"{n / k:g}\u00a0{unit}"
    return f"{n}\u00a0B"


def peak_lines(peaks: list[dict]) -> list[str]:
    """One sentence per test and placement of queries/nccl_tests_bandwidth.sql: the best busbw and
    its size, the smallest size reaching half of it (half_peak_size_bytes), and the share of the
    link peak when it is known."""
    out = []
    for p in sorted(peaks, key=lambda p: (p["file"] or "", p["test"], p["placement"] != "out_of_place")):
        nodes = f", {p['n_nodes']} node(s)" if p.get("n_nodes") else ""
        line = (
            f"{p['test']} {_PLACEMENT.get(p['placement'], p['placement'])} ({p['file']}{nodes}): best busbw "
            f"{p['peak_busbw_gbps']:,.1f}\u00a0GB/s at {_size(p['size_at_peak_bytes'])}"
        )
        if p.get("half_peak_size_bytes") is not None:
            line += f", half of it from {_size(p['half_peak_size_bytes'])} on"
        pct, peak = p.get("busbw_pct_of_link"), p.get("link_peak_gbps")
        if pct is not None and p.get("link_kind") == "nic" and pct > 100:
            # a ring cannot pass the NICs' rate, Tree / NVLS-Tree can (link_note says so): not a share
            line += (
                f", above the {peak:g}\u00a0GB/s ring bound of the {p['nics']} NIC(s) the logs state "
                "(Tree or NVLS-Tree can pass it)"
            )
        elif pct is not None and p.get("link_kind") == "nic":
            line += f", {pct:.0f}\u00a0% of the {peak:g}\u00a0GB/s the NICs give ({p['nic_names']})"
        elif pct is not None:
            line += f", {pct:.0f}\u00a0% of the {peak:g}\u00a0GB/s link"
        if p.get("busbw_pct_of_expected") is not None:
            line += (
                f", {p['busbw_pct_of_expected']:.0f}\u00a0% of NCCL's own estimate "
                f"({p['nccl_expected_gbps']:g}\u00a0GB/s)"
            )
        out.append(line)
    return out


def nccl_tests_chart(rows: list[dict], peaks: list[dict]):
    """rows: the run's nccl_tests rows of the analysis, peaks: its nccl_tests_bandwidth rows.
    Sizes of 0 bytes (no point on a log axis) are left out, and the note counts them."""
    pts = [r for r in rows if r["size_bytes"] > 0]
    if not pts:
        return None, "no nccl-tests measurement with a message size above 0 bytes"
    files = {r["file"] for r in pts}
    # a test measured in several tables of one file: each table its own line (#1, #2, ...)
    tables = Counter((f, t) for f, t, _ in {(r["file"], r["test"], r["table_index"]) for r in pts})

    def series(r: dict) -> str:
        nth = f" #{r['table_index'] + 1}" if tables[(r["file"], r["test"])] > 1 else ""
        return f"{r['test']}{nth}" + (f" ({r['file']})" if len(files) > 1 else "")

    data = [
        {
            "test": series(r),
            "placement": _PLACEMENT.get(r["placement"], r["placement"]),
            "size_bytes": r["size_bytes"],
            "busbw_gbps": r["busbw_gbps"],
            "algbw_gbps": r["algbw_gbps"],
            "time_us": r["time_ns"] / 1e3,
            "type": r["type"],
            "line": r["line_no"],
        }
        for r in pts
    ]
    known = sorted(
        {(p["test"], p["link_peak_gbps"], p["link_note"]) for p in peaks if p["link_peak_gbps"]},
        key=lambda x: (x[0], x[1]),
    )
    note = None
    if not known:
        why = sorted({p["link_note"] for p in peaks if p["link_note"]})
        note = "no link-peak line: " + ("; ".join(why) if why else "the link peak is unknown")
    zero = len(rows) - len(pts)
    if zero:
        note = (note + "; " if note else "") + f"{zero} measurement(s) of 0 bytes left out (log axis)"
    note = ". ".join(peak_lines(peaks) + ([note] if note else []))
    if not known:
        return Spec(_draw, data=data, title="nccl-tests: bus bandwidth against message size"), note
    rules = [{"peak": g, "label": f"link peak {g:g} GB/s for {t} ({why})"} for t, g, why in known]
    title = "nccl-tests: bus bandwidth against message size (dashed: link peak)"
    return Spec(_draw, data=data, rules=rules, title=title), note


def _draw(data, title, rules=None):
    """The tests' lines, with a dashed rule at each of rules (rows: peak, label) when given."""
    lines = (
        alt.Chart(alt.Data(values=data))
        .mark_line(point=True)
        .encode(
            x=alt.X(
                "size_bytes:Q",
                scale=alt.Scale(type="log", base=2),
                title="message size (bytes, log scale)",
                axis=alt.Axis(labelExpr=_SIZE_LABEL, tickCount=12),
            ),
            y=alt.Y("busbw_gbps:Q", title="bus bandwidth (GB/s)"),
            color=alt.Color("test:N", title="test"),
            strokeDash=alt.StrokeDash("placement:N", title=None),
            detail=alt.Detail("placement:N"),
            tooltip=[
                alt.Tooltip("test:N"),
                alt.Tooltip("placement:N"),
                alt.Tooltip("size_bytes:Q", format=",d", title="size (B)"),
                alt.Tooltip("type:N"),
                alt.Tooltip("busbw_gbps:Q", format=",.2f", title="busbw (GB/s)"),
                alt.Tooltip("algbw_gbps:Q", format=",.2f", title="algbw (GB/s)"),
                alt.Tooltip("time_us:Q", format=",.1f", title="time (µs)"),
                alt.Tooltip("line:Q", format="d", title="line"),
            ],
        )
    )
    layers = [lines]
    if rules is not None:
        layers.append(
            alt.Chart(alt.Data(values=rules))
            .mark_rule(strokeDash=[6, 4], color="#333")
            .encode(y=alt.Y("peak:Q"), tooltip=[alt.Tooltip("label:N")])
        )
    return alt.layer(*layers).properties(width=WIDTH, height=280, title=title)

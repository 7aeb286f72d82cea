"""The multi-run report's opening table (pipeline/fleet.py rows): one row per run, each linking to
its section, sortable by any column and filterable by text in the browser with a little inline
script (no request: the page's Content-Security-Policy allows inline scripts only).

fleet_table(rows, anchors) -> HTML text: a <table id="fleet"> of the fleet.DISPLAY columns; each
cell holds its raw value in data-v (numbers as numbers, the start as ns since the epoch; empty
for null), which the script sorts by (numbers numerically, text alphabetically, nulls last);
clicking a header sorts by it, again reverses, and the header's aria-sort says the order."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (annotations only: the html report of one run imports no polars)
    import polars as pl

from ..fleet import DISPLAY, NUMERIC_DISPLAY, display_cells

SORT_JS = """<script>
(() => {
  const t = document.getElementById('fleet'), body = t.tBodies[0];
  const heads = [...t.tHead.rows[0].cells];
  heads.forEach((th, i) => th.addEventListener('click', () => {
    const asc = th.getAttribute('aria-sort') !== 'ascending';
    heads.forEach(h => h.removeAttribute('aria-sort'));
    th.setAttribute('aria-sort', asc ? 'ascending' : 'descending');
    const num = th.dataset.type === 'num';
    const rows = [...body.rows];
    rows.sort((a, b) => {
      const x = a.cells[i].dataset.v, y = b.cells[i].dataset.v;
      if (x === '' || y === '') return (x === '') - (y === '');  // nulls last either way
      const c = num ? Number(x) - Number(y) : x.localeCompare(y);
      return asc ? c : -c;
    });
    rows.forEach(r => body.appendChild(r));
  }));
  const f = document.getElementById('fleet-filter');
  f.addEventListener('input', () => {
    const q = f.value.toLowerCase();
    [...body.rows].forEach(r => { r.hidden = q !== '' && !r.textContent.toLowerCase().includes(q); });
  });
})();
</script>"""

STYLE = (
    ".fleet-wrap { overflow-x: auto; } table.fleet { font-size: .85em; }\n"
    "table.fleet th.l { text-align: left; }\n"
    "table.fleet th { cursor: pointer; user-select: none; white-space: nowrap; }\n"
    "table.fleet th[aria-sort=ascending]::after { content: ' ▲'; }\n"
    "table.fleet th[aria-sort=descending]::after { content: ' ▼'; }\n"
)


def _raw(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v)
    return str(v)


def fleet_table(rows: pl.DataFrame, anchors: dict[str, str]) -> str:
    """The table of runs (HTML text, escaped) for fleet rows, each run's name a link to
    '#' + anchors[run_id] (its section's id), followed by its sorting script."""
    e = html.escape
    cols = [c for c, _, _ in DISPLAY]
    raw = rows.select([("start_ns" if c == "start_time" else c) for c in cols]).rows()
    num = NUMERIC_DISPLAY | {"start_time"}
    head = "".join(
        f'<th data-col="{c}" data-type="num">{e(h)}</th>'
        if c in num
        else f'<th class="l" data-col="{c}" data-type="text">{e(h)}</th>'
        for c, h, _ in DISPLAY
    )
    body = []
    for shown, values in zip(display_cells(rows), raw):
        cells = []
        for c, text, v in zip(cols, shown, values):
            cls = "" if c in num else ' class="l"'
            inner = f'<a href="#{e(anchors[v])}">{e(text)}</a>' if c == "run_id" else e(text)
            cells.append(f'<td{cls} data-v="{e(_raw(v))}">{inner}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        f"<style>{STYLE}</style><h2>Runs</h2>"
        '<p><input id="fleet-filter" type="search" placeholder="filter runs" aria-label="filter runs"> '
        "Click a column to sort; the run opens its section. <code>tracelake runs</code> prints the same "
        "table (--where, --sort, --format csv|json|md).</p>"
        f'<div class="fleet-wrap"><table class="fleet" id="fleet"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>" + SORT_JS
    )

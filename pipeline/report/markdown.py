"""The report as Markdown, for pull-request comments and CI logs (`tracelake report --format md`).

Renders the document of document.build (same verdict and findings as the HTML and JSON). Input
strings (run ids, kernel names, hosts) are made inert: '&', '<', '>' become HTML entities (GitHub
renders raw HTML in comments), the Markdown punctuation that could make a link, emphasis, code,
strike-through or table cell (backslash, backtick, * _ [ ] | ~) is backslash-escaped, and so is a
leading character that would start a heading, list or rule. SQL goes in fenced
code blocks whose fence is longer than any backtick run inside.
"""

from __future__ import annotations

import re

from ..kernelname import short_names
from .document import (
    basis_text,
    gpus_text,
    nccl_matching_lines,
    roofline_text,
    throughput_text,
    timing_text,
    versions_text,
)

_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~])")


def esc(text) -> str:
    """Inert Markdown text from an input string (one line)."""
    s = " ".join(str(text).split())
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    s = _MD_SPECIAL.sub(r"\\\1", s)
    return "\\" + s if re.match(r"[#+=-]|\d+[.)]\s", s) else s


def _fence(code: str) -> str:
    runs = [len(m) for m in re.findall(r"`+", code)]
    f = "`" * max(3, max(runs, default=0) + 1)
    return f"{f}sql\n{code}\n{f}"


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:.1f}%"


def render(doc: dict) -> str:
    """Markdown text of a report document (document.build)."""
    out = [
        "# tracelake report",
        "",
        f"tracelake {esc(doc['tracelake_version'])} · analysis window {esc(doc['window'])} · "
        f"kernel-wait threshold {doc['kernel_wait_threshold_ns'] / 1000:g} µs",
        "",
    ]
    for run in doc["runs"]:
        s, v = run["summary"], run["verdict"]
        conf = f" ({esc(v['confidence'])} confidence)" if v["confidence"] else ""
        out += [f"## Run {esc(run['run_id'])}: {esc(v['verdict'])}{conf}", "", esc(v["reason"]), ""]
        for h in v["headline"]:
            out.append(f"- **{_pct(h['pct'])}** {esc(h['label'])}")
        tp = throughput_text(run.get("throughput"), run.get("energy"), run.get("findings") or [])
        if tp:
            out += ["", esc(tp)]
        if run.get("gpu_metrics"):
            out += ["", esc(run["gpu_metrics"]) + "."]
        rl = roofline_text(run.get("roofline"))
        if rl:
            out += ["", esc(rl)]
        if v.get("caveats"):
            out += ["", "**Caveats**", ""] + [
                f"- {esc(c['text'])}" + (" *(lowers the confidence)*" if c["lowers_confidence"] else "")
                for c in v["caveats"]
            ]
        out += [
            "",
            basis_text(s, v),
            "",
            "| | |",
            "|---|---|",
            f"| ranks | {s['ranks']}"
            + (f" of world size {s['world_size']}" if s["world_size"] else "")
            + f" ({s['ranks_with_gpu_work']} with GPU work) |",
            f"| hosts | {esc(', '.join(s['hosts'])) or 'not recorded in the inputs'} |",
            f"| GPUs | {esc(gpus_text(s['gpus']))} |",
            f"| steps analysed | {s['steps_analysed']} of {s['steps']} |",
            f"| inputs | {s['sources']} file(s): {esc(', '.join(s['formats']))} |",
            f"| software | {esc(versions_text(s['tool_versions']))} |",
            "",
        ]
        out += [f"- {esc(x)}" for x in nccl_matching_lines(s.get("nccl_matching"))]
        out += [""] if s.get("nccl_matching") else []
        c = run["comparison"]
        if c is not None:
            out += [f"### Against baseline run {esc(c['baseline_run_id'])}", "", esc(c["summary"]), ""]
            if c["components"]:
                out += [
                    f"| component ({esc(c['per'])}) | baseline ms | this run ms | change ms | change |",
                    "|---|---:|---:|---:|---:|",
                ]
                for x in c["components"]:
                    out.append(
                        f"| {'**' if x['moved'] else ''}{esc(x['label'])}{'**' if x['moved'] else ''} | "
                        f"{x['baseline_ns'] / 1e6:,.3f} | {x['current_ns'] / 1e6:,.3f} | "
                        f"{x['delta_ns'] / 1e6:+,.3f} | "
                        f"{'n/a' if x['delta_pct'] is None else format(x['delta_pct'], '+.1f') + '%'} |"
                    )
                out.append("")
            if c["kernels"]:
                out += [
                    "| kernel | category | baseline ms | this run ms | change ms |",
                    "|---|---|---:|---:|---:|",
                ]
                label = short_names(k["name"] for k in c["kernels"][:10])
                for k in c["kernels"][:10]:
                    out.append(
                        f"| {esc(label[k['name']])} | {esc(k['category'])} | {k['baseline_ns'] / 1e6:,.3f} | "
                        f"{k['current_ns'] / 1e6:,.3f} | {k['delta_ns'] / 1e6:+,.3f} |"
                    )
                out.append("")
        out += ["### Findings (ranked by estimated recoverable time)", ""]
        if not run["findings"]:
            out += ["No finding reaches its threshold.", ""]
        for i, f in enumerate(run["findings"], 1):
            out += [f"{i}. **{esc(f['title'])}** — {esc(timing_text(f))}"]
            out += [f"   - {esc(e)}" for e in f["evidence"]]
            out += [
                f"   - *Recommendation:* {esc(f['recommendation'])}",
                *([f"   - *Timeline:* `{f['timeline']['command']}`"] if f.get("timeline") else []),
                "",
                "   <details><summary>SQL (tracelake sql)</summary>",
                "",
                "\n".join("   " + line for line in _fence(f["sql"]).splitlines()),
                "",
                "   </details>",
                "",
            ]
        if run["notes"]:
            out += ["### Notes", ""] + [f"- {esc(n)}" for n in run["notes"]] + [""]
    if doc["notes"]:
        out += ["## Notes", ""] + [f"- {esc(n)}" for n in doc["notes"]] + [""]
    return "\n".join(out).rstrip() + "\n"

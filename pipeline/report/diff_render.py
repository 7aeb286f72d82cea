"""Rendering of a `tracelake.diff/1` document (pipeline/diagnosis/diff.py) as text for a terminal
and as Markdown for a pull-request comment. Rendering only: every number comes from the document."""

from __future__ import annotations

import json


def _ms(ns: float | None) -> str:
    return "?" if ns is None else f"{ns / 1e6:,.3f}"


def _d(ns: float) -> str:
    return f"{ns / 1e6:+,.3f}"


def _names(doc: dict) -> tuple[str, str]:
    """How the two sides are named: their run ids, or the inputs given when the ids are the same
    (two exports of one directory)."""
    b, c = doc["baseline"], doc["candidate"]
    if b["run_id"] == c["run_id"] and b.get("input") and c.get("input") and b["input"] != c["input"]:
        return b["input"].rstrip("/").rsplit("/", 1)[-1], c["input"].rstrip("/").rsplit("/", 1)[-1]
    return b["run_id"], c["run_id"]


def _head(doc: dict) -> str:
    b, c = _names(doc)
    return f"{doc['verdict'].upper()}: {c} against {b} — {doc['reason']}"


def _who(doc: dict) -> str:
    w = doc.get("who_waited_for")
    if not w:
        return ""
    return (
        f"the candidate waits for rank {w['rank']}: last into {w['times_last']} of {w['calls']} collectives"
    )


def _lines(doc: dict) -> list[tuple[str, str, str, str]]:
    """(label, baseline ms, candidate ms, change ms) rows: step time, then the components."""
    st = doc["step_time"]
    rows = [("step time", _ms(st["baseline_ns"]), _ms(st["candidate_ns"]), _d(st["change_ns"]))]
    for c in doc["components"]:
        rows.append((f"  {c['label']}", _ms(c["baseline_ns"]), _ms(c["candidate_ns"]), _d(c["delta_ns"])))
    return rows


def _basis(doc: dict) -> str:
    b, c = doc["baseline"], doc["candidate"]
    return (
        f"per {b['unit']}: {b['samples']} sample(s) from {_span(b['steps'])} against {c['samples']} from "
        f"{_span(c['steps'])}, aligned by {'step number' if doc['align'] == 'step' else 'the steady steps'}"
    )


def _span(steps: list[int]) -> str:
    if not steps:
        return "no step"
    return f"step {steps[0]}" if len(steps) == 1 else f"{len(steps)} steps ({steps[0]} to {steps[-1]})"


def _gate(doc: dict) -> str:
    g = doc["gate"]
    if g["failed"]:
        return "gate FAILED: " + "; ".join(g["reasons"])
    if g["fail_on_regression_pct"] is None and not g["fail_on"]:
        return "no gate set (--fail-on-regression, --fail-on)"
    return "gate passed"


def _comparability(doc: dict, reason: str, warning: str, cell) -> list[str]:
    """One line per reason the pair is not comparable, then per warning (versions that differ,
    slow steps kept, one-step sides)."""
    comp = doc["comparability"]
    return [reason + cell(r) for r in comp["reasons"]] + [warning + cell(w) for w in comp["warnings"]]


def text(doc: dict) -> str:
    """The diff for a terminal: verdict line, comparability, step time and components, kernels, gate."""
    out = [_head(doc)] + _comparability(doc, "  not comparable: ", "  note: ", str)
    if doc["step_time"] is None:
        return "\n".join(out) + "\n"
    out.append(f"  {_basis(doc)}")
    out.append("")
    out.append(f"  {'ms per step':<60} {'baseline':>10} {'candidate':>10} {'change':>10}")
    for label, b, c, d in _lines(doc):
        out.append(f"  {label:<60} {b:>10} {c:>10} {d:>10}")
    if _who(doc):
        out.append(f"  ({_who(doc)})")
    if doc["kernels"]:
        out.append("")
        out.append("  kernels that moved (ms per step and rank):")
        for k in doc["kernels"]:
            out.append(
                f"    {_d(k['delta_ns']):>10}  {k['label']} [{k['category']}] "
                f"({_ms(k['baseline_ns'])} -> {_ms(k['candidate_ns'])})"
            )
    if doc.get("ops"):
        out.append("")
        out.append("  ops that moved (GPU time they launched, ms per step and rank):")
        for o in doc["ops"]:
            out.append(
                f"    {_d(o['delta_ns']):>10}  {o['op']} "
                f"({_ms(o['baseline_ns'])} -> {_ms(o['candidate_ns'])})"
            )
    out.append("")
    out.append(f"  {_gate(doc)}")
    return "\n".join(out) + "\n"


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def markdown(doc: dict) -> str:
    """The diff as a pull-request comment (GitHub-flavoured Markdown)."""
    bn, cn = _names(doc)
    out = [
        f"### tracelake diff: **{doc['verdict']}**",
        "",
        f"Candidate `{_md_cell(cn)}` against baseline `{_md_cell(bn)}`: {_md_cell(doc['reason'])}",
        "",
    ]
    out += _comparability(doc, "- not comparable: ", "- note: ", _md_cell)
    if doc["step_time"] is None:
        return "\n".join(out) + "\n"
    out += [f"{_md_cell(_basis(doc))[0].upper()}{_md_cell(_basis(doc))[1:]}.", ""]
    out += ["| ms per step | baseline | candidate | change |", "|---|---:|---:|---:|"]
    for label, bb, cc, d in _lines(doc):
        out.append(f"| {_md_cell(label.strip())} | {bb} | {cc} | {d} |")
    if _who(doc):
        out += ["", f"Waiting for peers: {_who(doc)}."]
    if doc["kernels"]:
        out += [
            "",
            "| kernel | category | baseline ms | candidate ms | change ms |",
            "|---|---|---:|---:|---:|",
        ]
        for k in doc["kernels"]:
            out.append(
                f"| `{_md_cell(k['label'])}` | {k['category']} | {_ms(k['baseline_ns'])} | "
                f"{_ms(k['candidate_ns'])} | {_d(k['delta_ns'])} |"
            )
    if doc.get("ops"):
        out += [
            "",
            "| op (GPU time it launched) | baseline ms | candidate ms | change ms |",
            "|---|---:|---:|---:|",
        ]
        for o in doc["ops"]:
            out.append(
                f"| `{_md_cell(o['op'])}` | {_ms(o['baseline_ns'])} | {_ms(o['candidate_ns'])} | "
                f"{_d(o['delta_ns'])} |"
            )
    out += ["", f"**{_md_cell(_gate(doc))}**"]
    return "\n".join(out) + "\n"


def render(doc: dict, fmt: str) -> str:
    """text, md or json (the document itself, indented)."""
    if fmt == "json":
        return json.dumps(doc, indent=1) + "\n"
    return markdown(doc) if fmt == "md" else text(doc)

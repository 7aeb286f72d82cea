"""The house rules of docs/architecture.md, checked on the source: which room may import which,
no import cycles between modules, and no module or class past its size.

Imports are read with `ast` from every module under pipeline/ (module-level and function-level
imports alike: a late import is still a dependency), so the test fails when a new import breaks
the layering, whatever the import style.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

PKG = REPO / "pipeline"

# the rooms above the lake (it, parts.py and derive.py must import none of them)
_AFTER_LAKE = {
    "upgrade",
    "ingest",
    "query",
    "local",
    "local_fill",
    "analyze",
    "analyze_cluster",
    "diagnosis",
    "report",
    "cli",
}
# the per-source results' two rooms (what they are and their SQL; filling them for committed sources)
_LOCAL = {"local", "local_fill"}
# room -> rooms it must never import (docs/architecture.md, "The rooms", column "never imports")
FORBIDDEN = {
    "ingest": {"query", "analyze", "analyze_cluster", "diagnosis", "report", "cli"},
    "lake": _AFTER_LAKE,
    "query": {"ingest", "analyze", "analyze_cluster", "diagnosis", "report", "cli"} | _LOCAL,
    # per-source metric results at ingest: above query (it runs the metric SQL), below ingest
    "local": {"ingest", "local_fill", "analyze", "analyze_cluster", "diagnosis", "report", "cli"},
    "local_fill": {"ingest", "analyze", "analyze_cluster", "diagnosis", "report", "cli"},
    "diagnosis": {"ingest", "analyze", "analyze_cluster", "report", "cli", "cluster"},
    "analyze": {"ingest", "analyze_cluster", "report", "cli"},
    "analyze_cluster": {"ingest", "report", "cli"},
    # the metric pass analyze() calls for the runs it does not read back
    "analyze_compute": {"ingest", "analyze", "analyze_cluster", "report", "cli"},
    # kept results: files under the lake, keyed by sources rows, options and code; no room's logic
    "results": {"lake", "query", "analyze", "analyze_compute", "analyze_cluster"}
    | _LOCAL
    | {"ingest", "diagnosis", "report", "cli", "cluster", "whatif", "timeline"},
    # the kept fleet rows and runs_overview: results' files, the fleet view's columns
    "results_fleet": {"lake", "query", "analyze", "analyze_compute", "analyze_cluster"}
    | _LOCAL
    | {"ingest", "report", "cli", "cluster", "whatif", "timeline"},
    "report": {"ingest", "query", "analyze_cluster", "cli", "cluster"},
    # the fleet view: rows of the analysis document, between diagnosis and report
    "fleet": {"ingest", "query", "analyze", "analyze_cluster", "cluster", "report", "cli"} | _LOCAL,
    "cluster": {"ingest", "query", "analyze", "analyze_cluster", "diagnosis", "report", "cli"},
    # the timeline reads the lake through query and the findings through analyze; analyze never
    # imports it (a finding only names the `tracelake timeline` command)
    "timeline": {"ingest", "analyze_cluster", "cluster", "report", "cli"},
    # the replay reads the lake through a query connection it is given; analyze calls it
    "whatif": {"ingest", "analyze", "analyze_cluster", "diagnosis", "report", "cli", "cluster"} | _LOCAL,
    "derive": {"lake"} | _AFTER_LAKE,
    "parts": {"lake"} | _AFTER_LAKE,
    # a part that cannot be read, on a reader's error path: files and the schema, no room's logic
    "lake_damage": {"lake"} | _AFTER_LAKE,
    # compaction's reading and writing sides: helpers of the lake, which imports them
    "lake_manifest": {"lake"} | _AFTER_LAKE,
    "lake_compact": {"lake"} | _AFTER_LAKE,
    # what local and object-store lakes share, and the object-store lake (Lake(url) makes one)
    "lake_base": {"lake", "lake_s3"} | _AFTER_LAKE,
    "lake_s3": {"lake"} | _AFTER_LAKE,
    "lake_s3_lock": {"lake", "lake_s3"} | _AFTER_LAKE,
    "lake_s3_files": {"lake", "lake_s3", "lake_s3_compact"} | _AFTER_LAKE,
    "lake_s3_compact": {"lake", "lake_s3"} | _AFTER_LAKE,
    # object storage's URLs, file system and errors: a shared fact below every room
    "objstore": {"lake", "lake_base", "lake_s3", "lake_s3_lock", "lake_s3_files", "lake_s3_compact"}
    | {"schema", "parts", "derive"}
    | _AFTER_LAKE,
    # the lake from Python: the query connection and the analysis, never ingest or rendering
    "api": {"ingest", "report", "cli", "analyze_cluster"} | _LOCAL,
    "upgrade": _AFTER_LAKE - {"upgrade"},
    # the docs of the tables and views: read from schemas/ and queries/, never from a lake
    "sqldoc": {"lake"} | _AFTER_LAKE,
}
MAX_MODULE_LINES = 560
MAX_CLASS_LINES = 230


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every pipeline module `path` imports (absolute names; `from . import x` resolved)."""
    mod = _module_name(path)
    pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("pipeline")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("pipeline"):
                continue
            for a in node.names:  # `from pkg import submodule` imports the submodule
                sub = f"{target}.{a.name}"
                out.add(sub if _exists(sub) else target)
    return out


def _exists(mod: str) -> bool:
    p = REPO / Path(*mod.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in sorted(PKG.rglob("*.py"))}


def _room(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


def _forbidden(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{m} imports {d}"
        for m, deps in graph.items()
        for d in sorted(deps)
        if _room(d) in FORBIDDEN.get(_room(m), ())
    ]


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    """Import loops between modules. A package face (its __init__) importing its own submodules
    is the usual face pattern and not a loop unless a submodule imports the face back."""
    edges = {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}
    cycles: list[str] = []
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in sorted(edges[m]):
            if state.get(d) == 1:
                cycles.append(" -> ".join(stack[stack.index(d) :] + [d]))
            elif d not in state:
                visit(d, stack + [d])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    return cycles


def test_rooms_import_only_what_the_architecture_allows():
    assert _forbidden(_graph()) == []


def test_no_import_cycles_between_modules():
    assert _cycles(_graph()) == []


def test_the_checks_catch_a_planted_cycle_and_a_forbidden_import():
    planted = {
        "pipeline.ingest.a": {"pipeline.ingest.b"},
        "pipeline.ingest.b": {"pipeline.ingest.a", "pipeline.report.html"},
        "pipeline.report.html": set(),
    }
    assert _cycles(planted) == ["pipeline.ingest.a -> pipeline.ingest.b -> pipeline.ingest.a"]
    assert _forbidden(planted) == ["pipeline.ingest.b imports pipeline.report.html"]
    # the import reader resolves relative imports: this repo's ingest face imports its rooms
    assert "pipeline.ingest.commit" in _imports(PKG / "ingest" / "__init__.py")
    assert "pipeline.lake" in _imports(PKG / "ingest" / "commit.py")


def test_no_module_or_class_past_its_size():
    big = []
    for p in sorted(PKG.rglob("*.py")):
        text = p.read_text()
        n = text.count("\n")
        if n > MAX_MODULE_LINES:
            big.append(f"{p.relative_to(REPO)}: {n} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                big.append(
                    f"{p.relative_to(REPO)}: class {node.name} {node.end_lineno - node.lineno + 1} lines"
                )
    assert big == []

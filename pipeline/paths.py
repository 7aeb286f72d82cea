"""Locations of the data files that ship beside the package (schemas/, queries/)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS_DIR = ROOT / "schemas"
QUERIES_DIR = ROOT / "queries"
CATALOG_DIR = Path(__file__).resolve().parent / "catalog"

"""Finding the inputs at the edges the tester found (findings 2 and 5): symbolic links to
directories are followed, each directory searched once (a link loop ends); --exclude compares
names in Unicode NFC, so a pattern typed decomposed leaves out a directory written composed and
the other way round. Files and names are made here; the expected lists are written by hand."""

from __future__ import annotations

import unicodedata

from pipeline.ingest.discover import discover, exclude_patterns, plan

NFC, NFD = unicodedata.normalize("NFC", "über"), unicodedata.normalize("NFD", "über")


def _touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}")
    return path


def test_symbolic_links_to_directories_are_followed_once(tmp_path):
    _touch(tmp_path / "elsewhere" / "x" / "rank0.json")
    root = tmp_path / "root"
    _touch(root / "own" / "rank1.json")
    (root / "linked").symlink_to(tmp_path / "elsewhere" / "x")  # followed: named by the link
    (root / "linked_again").symlink_to(tmp_path / "elsewhere" / "x")  # the same directory: once
    (root / "own" / "loop").symlink_to(root)  # a loop back to the top: ends there
    found = discover([root])
    assert [f.relative_to(root).as_posix() for f in found] == ["linked/rank0.json", "own/rank1.json"]
    # the run name is the path below the directory given, through the link's name
    units, problems = plan([root])
    assert problems == [] and [u.item.run for u in units] == ["linked", "own"]


def test_exclude_compares_names_in_nfc(tmp_path):
    root = tmp_path / "root"
    _touch(root / NFC / "rank0.json")  # written composed (Linux)
    _touch(root / "keep" / "rank0.json")
    assert [f.parent.name for f in discover([root], exclude=[NFD])] == ["keep"]
    assert [f.parent.name for f in discover([root], exclude=[f"{NFD[:2]}*"])] == ["keep"]  # 'u' + U+0308, '*'
    other = tmp_path / "other"
    _touch(other / NFD / "rank0.json")  # written decomposed (as macOS names it)
    _touch(other / "keep" / "rank0.json")
    assert [f.parent.name for f in discover([other], exclude=[NFC])] == ["keep"]
    assert exclude_patterns([NFD + "/"]) == [NFC]

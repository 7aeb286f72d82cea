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


def test_a_file_named_like_an_archive_that_is_none_is_a_corrupt_archive(tmp_path):
    """The tester's finding 4: bytes that are no zip in `bad.zip` were reported as "not a Kineto
    trace, Nsight Systems export or NCCL-family log"."""
    (tmp_path / "bad.zip").write_bytes(b"\x00\x01garbage, no PK signature" * 20)
    (tmp_path / "empty.zip").write_bytes(b"")
    (tmp_path / "x.tar").write_bytes(b"not a tar header")
    (tmp_path / "y.tgz").write_bytes(b"nope")
    _touch(tmp_path / "rank0.json")
    units, problems = plan([tmp_path])
    why = " (truncated, or another file renamed)"
    assert problems == []  # planned as failed units, each named
    assert {u.item.path.name: u.item.error for u in units if u.kind == "problem"} == {
        "bad.zip": "corrupt zip archive: it does not start with a zip signature (PK)" + why,
        "empty.zip": "corrupt zip archive: the file is empty",
        "x.tar": "corrupt tar archive: it does not start with a tar header" + why,
        "y.tgz": "corrupt tar.gz archive: it does not start with gzip's magic number (1f 8b)" + why,
    }
    assert [u.item.path for u in units if u.kind == "input"] == [str(tmp_path / "rank0.json")]


def test_a_link_to_a_directory_inside_the_inputs_is_not_followed(tmp_path):
    """The tester's third round, finding 1: arch/real/ was named by arch/linkA (the first link
    in name order); a directory inside the inputs is named by its own path."""
    arch = tmp_path / "arch"
    _touch(arch / "real" / "rank0.json")
    (arch / "linkA").symlink_to("real")
    (arch / "aaa").symlink_to(arch / "real")
    units, problems = plan([arch])
    assert problems == [] and [(u.item.path, u.item.run) for u in units] == [
        (str(arch / "real" / "rank0.json"), "real")
    ]


def test_files_that_are_no_regular_files_get_a_line_each(tmp_path):
    """The tester's third round, finding 8: a link to a FIFO or a device, named like a trace or a
    log, was passed over without a line; it is one problem each (never opened)."""
    import os

    root = tmp_path / "sl"
    _touch(root / "rank0.json")
    os.mkfifo(root / "fifo.json")
    (root / "null.json").symlink_to("/dev/null")
    (root / "tofifo.log").symlink_to("fifo.json")
    problems: list = []
    found = discover([root], problems)
    assert [f.name for f in found] == ["rank0.json"]
    assert [(p.path.name, p.error) for p in problems] == [
        ("fifo.json", "not a regular file (a FIFO)"),
        ("null.json", "not a regular file (a symbolic link to a character device)"),
        ("tofifo.log", "not a regular file (a symbolic link to a FIFO)"),
    ]

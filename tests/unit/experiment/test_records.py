"""Canary records: written atomically and root-only, read back bounded; corrupt, hostile or newer records are one
line naming the file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from knobfleet.experiment import records


def test_a_record_round_trips_without_nan(tmp_path: Path) -> None:
    path = records.new_path("ctas/../512", 1764681600.0, tmp_path)
    assert path.name == "20251202T132000Z-ctas_.._512.json" and path.parent == tmp_path
    records.write(path, "canary", {"profile": "ctas512", "x": float("nan"), "y": [float("inf"), 1.5]})
    assert os.stat(path).st_mode & 0o777 == 0o600
    doc = records.read(path)
    assert doc == {"schema_version": 1, "kind": "canary", "profile": "ctas512", "x": None, "y": [None, 1.5]}
    assert [x.doc for x in records.list_canaries(tmp_path)] == [doc]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not a knobfleet record (Expecting property name"),
        ("[1, 2]", "not a knobfleet record (no schema_version)"),
        ('{"schema_version": 99}', "record schema 99 is newer than this knobfleet reads (1); upgrade knobfleet"),
        ("[" * 100000 + "]" * 100000, "not a knobfleet record ("),
    ],
)
def test_bad_records_are_one_line(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "r.json"
    path.write_text(content)
    with pytest.raises(records.RecordError) as exc:
        records.read(path)
    assert message in str(exc.value) and "\n" not in str(exc.value)
    listed = records.list_canaries(tmp_path)
    assert listed[0].doc is None and message in listed[0].error


def test_hostile_nodes_are_refused_not_read(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "loop.json").symlink_to(tmp_path / "loop.json")
    (tmp_path / "dir.json").mkdir()
    listed = {x.path.name: x.error for x in records.list_canaries(tmp_path)}
    assert "fifo" in listed["fifo.json"] and "must be a regular file" in listed["fifo.json"]
    assert "cannot read" in listed["loop.json"]
    assert "directory" in listed["dir.json"]


def test_an_absent_folder_lists_nothing(tmp_path: Path) -> None:
    assert records.list_canaries(tmp_path / "none") == []
    (tmp_path / "notes.txt").write_text("not a record")  # only *.json files are records
    assert records.list_canaries(tmp_path) == []


def test_a_record_its_reader_would_refuse_is_never_written(tmp_path: Path) -> None:
    """Issue 56, cause 10: the writer refuses what the reader refuses (over 8 MiB), before writing; the earlier
    version of the record stays as it was."""
    import pytest

    from knobfleet.experiment import records

    path = tmp_path / "r.json"
    records.write(path, "tune", {"rows": [1, 2, 3]})
    before = path.read_text()
    with pytest.raises(records.RecordError) as exc:
        records.write(path, "tune", {"rows": ["x" * 1000] * 10_000})
    assert "more than the 8 MiB a record may hold; not written" in str(exc.value) and "\n" not in str(exc.value)
    assert path.read_text() == before and records.read(path)["rows"] == [1, 2, 3]

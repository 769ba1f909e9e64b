"""The engine version the probe reads from a version file: first line only, bounded, and never through a
symlink, a FIFO or a device (all made by the test in its own temp dir)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from knobfleet.module_utils import knob_observe


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"0.5.0-sim\n", "0.5.0-sim"),
        (b"  0.4.9  \nsecond line\n", "0.4.9"),
        (b"", None),
        (b"\n\n", None),
        (b"x" * 500, "x" * 128),  # bounded: a huge file is cut at 128 bytes
    ],
)
def test_first_line_of_a_regular_file(tmp_path: Path, content: bytes, expected: str | None) -> None:
    f = tmp_path / "VERSION"
    f.write_bytes(content)
    assert knob_observe.engine_version(str(f)) == expected


def test_missing_symlink_fifo_and_device_read_as_unknown(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.write_text("1.0\n")
    (tmp_path / "link").symlink_to(real)
    os.mkfifo(tmp_path / "fifo")  # a reader that opened it without O_NONBLOCK would block forever
    assert knob_observe.engine_version(str(tmp_path / "missing")) is None
    assert knob_observe.engine_version(str(tmp_path / "link")) is None
    assert knob_observe.engine_version(str(tmp_path / "fifo")) is None
    if os.geteuid() == 0:
        os.mknod(tmp_path / "null", 0o600 | 0o020000, os.makedev(1, 3))  # a character device, in the temp dir
        assert knob_observe.engine_version(str(tmp_path / "null")) is None


def test_the_document_has_the_version_only_when_asked(tmp_path: Path) -> None:
    f = tmp_path / "VERSION"
    f.write_text("0.5.0-sim\n")
    base = {
        "service": "nope-kf",
        "script_path": str(tmp_path / "s"),
        "unit_path": str(tmp_path / "u"),
        "state_dir": str(tmp_path / "st"),
    }
    assert "engine_version" not in knob_observe.observe(base)
    assert knob_observe.observe({**base, "version_file": str(f)})["engine_version"] == "0.5.0-sim"

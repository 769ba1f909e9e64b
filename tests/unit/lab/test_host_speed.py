"""A lab host made slower on purpose: the stand-in's host-level speed file (parsed, re-read once a second), and
`lab speed`, which sets it only on a running host of this lab."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from knobfleet.errors import LabError
from knobfleet.lab.nspawn import Lab
from knobfleet.lab.sim import model


@pytest.mark.parametrize(
    ("text", "speed"),
    [("0.92\n", 0.92), (" 1.5 ", 1.5), ("", 1.0), ("nan", 1.0), ("inf", 1.0), ("-1", 1.0), ("0.01", 1.0),
     ("fast", 1.0), ("1e400", 1.0), ("10", 10.0)],
)  # fmt: skip
def test_parse_speed(text: str, speed: float) -> None:
    assert model.parse_speed(text) == speed


@given(st.text(max_size=40))
def test_any_file_content_gives_a_usable_factor(text: str) -> None:
    lo, hi = model.HOST_SPEED_RANGE
    assert lo <= model.parse_speed(text) <= hi


def test_the_engine_rereads_the_file_at_most_once_a_second(tmp_path: Path) -> None:
    path = tmp_path / "speed"
    now = [0.0]
    hs = model.HostSpeed(str(path), clock=lambda: now[0])
    assert hs.factor() == 1.0  # absent: as fast as the others
    path.write_text("0.92")
    now[0] = 0.5
    assert hs.factor() == 1.0  # not yet re-read
    now[0] = 1.0
    assert hs.factor() == 0.92
    path.unlink()
    now[0] = 2.5
    assert hs.factor() == 1.0


def test_only_a_running_lab_host_can_be_slowed(tmp_path: Path) -> None:
    lab = Lab(tmp_path / "lab")
    for name in ("lab1", "web1", "lab1; rm -rf /", "../lab1"):
        with pytest.raises(LabError, match=r"is not a running host of this lab \(running: none\); it sets a lab"):
            lab.set_host_speed(name, 0.92)
    assert not any((tmp_path / "lab").rglob("host-speed"))

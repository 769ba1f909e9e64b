"""Adopting a host must not weaken its restart policy silently: the unit's Restart= is a host var
(``knob_serve_restart``, default always) and ``plan`` names every host-var-controlled unit setting an install
changes."""

from __future__ import annotations

import pydantic
import pytest

from knobfleet.fleet.hostvars import HostVars
from knobfleet.lab.hostfiles import serve_unit
from knobfleet.ops.plan import KnobChange, unit_changes, unit_settings
from knobfleet.profiles.model import Profile
from knobfleet.render import render_host

PROFILE = Profile(name="p", version=1, engine="sglang", env={}, args={})


def hand_unit(restart: str, restart_sec: str = "5") -> str:
    return (
        f"[Unit]\nDescription=x\n\n[Service]\nExecStart=/root/serve.sh\nRestart={restart}\nRestartSec={restart_sec}\n"
    )


@pytest.mark.parametrize(
    ("text", "settings"),
    [
        (hand_unit("always"), {"ExecStart": "/root/serve.sh", "Restart": "always", "RestartSec": "5"}),
        (
            "[Service]\nRestart=no\n# Restart=always\nRestart = on-abort\n[Install]\nRestart=x\n",
            {"Restart": "on-abort"},
        ),
        ("[Unit]\nRestart=always\n", {}),
        # a section header is a whole line in brackets: a value ending in "]" does not open one
        (
            "[Service]\nExecStart=/root/serve.sh --devices [0,1]\nRestart=always\n",
            {"ExecStart": "/root/serve.sh --devices [0,1]", "Restart": "always"},
        ),
    ],
)
def test_unit_settings(text: str, settings: dict[str, str]) -> None:
    assert unit_settings(text) == settings


@pytest.mark.parametrize(
    ("restart", "installed", "shown"),
    [
        (None, hand_unit("always"), []),  # the default keeps a hand-written Restart=always
        (None, hand_unit("on-failure"), ["unit Restart= on-failure → always (knob_serve_restart)"]),
        ("on-failure", hand_unit("always"), ["unit Restart= always → on-failure (knob_serve_restart)"]),
        (None, hand_unit("always", "3"), ["unit RestartSec= 3 → 5 (knob_serve_restart_sec)"]),
        (None, "", []),  # no unit on the host: nothing to compare
    ],
)
def test_plan_names_a_changed_restart_policy(restart: str | None, installed: str, shown: list[str]) -> None:
    hv = HostVars(host="h", **({"restart": restart} if restart else {}))
    rendered = render_host(PROFILE, hv)
    assert f"\nRestart={restart or 'always'}\n" in rendered.unit
    assert [str(c) for c in unit_changes(installed, rendered.unit) if c.name != "User"] == shown


def test_the_lab_seeds_unit_keeps_restart_always() -> None:
    """The lab's hand-written units say Restart=always: adopting them keeps it."""
    rendered = render_host(PROFILE, HostVars(host="h", restart_sec=3))
    assert [c for c in unit_changes(serve_unit(), rendered.unit) if c.name != "User"] == []
    assert KnobChange("unit", "User", None, "root").__str__() == "unit User= (unset) → root (knob_serve_user)"


def test_a_bad_restart_policy_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="restart"):
        HostVars(host="h", restart="sometimes")


@pytest.mark.parametrize(
    ("change", "shown"),
    [
        (KnobChange("unit", "Restart", "always", None), "unit Restart= always → (unset) (knob_serve_restart)"),
        (KnobChange("unit", "Restart", "", "no"), "unit Restart= (unset) → no (knob_serve_restart)"),
        (KnobChange("unit", "Nice", "1", "2"), "unit Nice= 1 → 2"),  # no host var sets it: none named
        (KnobChange("env", "A", None, ""), "A (unset) → "),
        (KnobChange("flag", "tp-size", "2", None), "--tp-size 2 → (unset)"),
    ],
)
def test_knob_change_text(change: KnobChange, shown: str) -> None:
    assert str(change) == shown

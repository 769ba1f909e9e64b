"""Host vars that YAML or Ansible would silently turn into another value are refused with one line naming the
host, the var and the fix (true is not port 1, null is not the text None, a flag the launch line sets is not
set twice)."""

from __future__ import annotations

import pytest

from knobfleet.errors import InventoryError, RenderError
from knobfleet.fleet.hostvars import HostVars, from_inventory_vars
from knobfleet.profiles.model import Profile
from knobfleet.render import check_conflicts

FIX = "; fix it in host_vars or group_vars"


@pytest.mark.parametrize(
    ("var", "value", "expected"),
    [
        ("knob_serve_port", True, "knob_serve_port: true is not an integer; write a whole number such as 30000"),
        ("knob_serve_port", None, "knob_serve_port: null is not an integer; write a whole number such as 30000"),
        ("knob_serve_port", 30000.5, "knob_serve_port: 30000.5 is not an integer; write a whole number such as 30000"),
        ("knob_serve_port", "30000x", "knob_serve_port: 30000x is not an integer; write a whole number"),
        ("knob_serve_port", "3\u00a0", "knob_serve_port: '3\\xa0' is not an integer; write a whole number"),
        (
            "knob_serve_readiness_timeout_s",
            False,
            "knob_serve_readiness_timeout_s: false is not an integer; write a whole number such as 30000",
        ),
        (
            "knob_serve_host_env",
            {"NCCL_DEBUG": None},
            "knob_serve_host_env.NCCL_DEBUG: null would become the text None; write '' for an empty value, or "
            "remove the key",
        ),
        (
            "knob_serve_host_env",
            {"NCCL_P2P_DISABLE": True},
            "knob_serve_host_env.NCCL_P2P_DISABLE: true would become the text True; write '1' or '0' (quoted)",
        ),
        (
            "knob_serve_host_env",
            {"CUDA_VISIBLE_DEVICES": [0, 1]},
            "knob_serve_host_env.CUDA_VISIBLE_DEVICES: a list is not a value; write a string, a number or true/false",
        ),
        (
            "knob_serve_host_env",
            {"X": float("nan")},
            "knob_serve_host_env.X: nan is not a finite number",
        ),
        (
            "knob_serve_host_env",
            {True: "1"},
            "knob_serve_host_env: True is a bool, not a name; quote it",
        ),
        (
            "knob_serve_host_args",
            {"enable-metrics": None},
            "knob_serve_host_args.enable-metrics: null would become the text None; write true for a bare flag, false "
            "to leave it out, or remove the key",
        ),
        (
            "knob_serve_host_args",
            {"x": {"a": 1}},
            "knob_serve_host_args.x: a dict is not a value; write a string, a number or true/false",
        ),
        (
            "knob_serve_host_env",
            {"X=1;touch /tmp/x": "1"},
            "knob_serve_host_env: Value error, 'X=1;touch /tmp/x' is not a valid env var name: must be an env var "
            "name: letters, digits and _, not starting with a digit",
        ),
        (
            "knob_serve_host_env",
            {"A\u200bB": "1"},
            "knob_serve_host_env: Value error, 'A\\u200bB' is not a valid env var name: contains U+200B ZERO WIDTH "
            "SPACE at position 1 (invisible); remove it",
        ),
    ],
)
def test_silent_coercions_are_refused(var: str, value: object, expected: str) -> None:
    with pytest.raises(InventoryError) as info:
        from_inventory_vars("h1", {var: value}, "inv")
    assert str(info.value) == f"inv: host h1: {expected}{FIX}"


@pytest.mark.parametrize(
    ("var", "value", "field", "kept"),
    [
        ("knob_serve_port", 30001, "port", 30001),
        ("knob_serve_port", "30001", "port", 30001),  # what a template renders
        ("knob_serve_host_env", {"CUDA_VISIBLE_DEVICES": 0}, "host_env", {"CUDA_VISIBLE_DEVICES": "0"}),
        ("knob_serve_host_env", {"X": 0.5}, "host_env", {"X": "0.5"}),
        ("knob_serve_host_env", {"X": ""}, "host_env", {"X": ""}),
        (
            "knob_serve_host_args",
            {"enable-metrics": True, "x": False},
            "host_args",
            {"enable-metrics": True, "x": False},
        ),
    ],
)
def test_values_that_mean_what_they_say_are_kept(var: str, value: object, field: str, kept: object) -> None:
    assert getattr(from_inventory_vars("h1", {var: value}, "inv"), field) == kept


def test_a_host_flag_the_launch_line_sets_is_refused() -> None:
    profile = Profile(name="p", version=1, engine="sglang", env={}, args={})
    with pytest.raises(RenderError) as info:
        check_conflicts(profile, HostVars(host="h", host_args={"port": "1"}))
    assert str(info.value) == (
        "flag --port is set by host h's knob_serve_host_args and by its knob_serve_port (the launch line carries "
        "it); remove it from knob_serve_host_args"
    )

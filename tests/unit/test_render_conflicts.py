"""The host-flag conflict guard (render.check_conflicts): a key set by both the host vars and the profile, or a
profile for another engine than the host runs, stops rendering with one line per problem naming both places."""

from __future__ import annotations

import pytest

from knobfleet.errors import RenderError
from knobfleet.fleet.hostvars import HostVars
from knobfleet.profiles.model import Profile
from knobfleet.render import check_conflicts, render_host


def profile(
    engine: str = "sglang", env: dict[str, str] | None = None, args: dict[str, str | bool] | None = None
) -> Profile:
    return Profile(name="p", version=1, engine=engine, env=env or {}, args=args or {})


def problems(p: Profile, hv: HostVars) -> list[str]:
    with pytest.raises(RenderError) as info:
        check_conflicts(p, hv)
    with pytest.raises(RenderError) as again:  # render_host runs the guard before anything is rendered
        render_host(p, hv)
    assert str(again.value) == str(info.value)
    return str(info.value).splitlines()


def test_disjoint_keys_pass() -> None:
    hv = HostVars(host="h", engine="sglang", host_env={"CUDA_HOME": "/cuda"}, host_args={"tp-size": "2"})
    p = profile(env={"SGLANG_X": "1"}, args={"mem-fraction-static": "0.8"})
    check_conflicts(p, hv)
    r = render_host(p, hv)
    assert r.env == {"CUDA_HOME": "/cuda", "SGLANG_X": "1"}
    assert "--tp-size=2" in r.argv and "--mem-fraction-static=0.8" in r.argv


def test_another_engine_is_refused_naming_the_inventory_var() -> None:
    assert problems(profile("vllm"), HostVars(host="h", engine="sglang")) == [
        "profile p is for engine vllm, but host h runs sglang (inventory var knob_engine); apply a profile of "
        "that engine, or change knob_engine"
    ]


def test_a_host_without_knob_engine_takes_any_engine() -> None:
    check_conflicts(profile("vllm"), HostVars(host="h"))
    check_conflicts(profile("sglang"), HostVars(host="h"))


def test_env_and_flag_conflicts_with_the_host_vars() -> None:
    hv = HostVars(host="h", host_env={"B": "1", "A": "1", "C": "1"}, host_args={"y": "1", "x": True, "z": "1"})
    p = profile(env={"A": "2", "B": "2"}, args={"x": False, "y": "2"})
    assert problems(p, hv) == [
        "env A is set by the profile p and by host h's knob_serve_host_env; remove it from one of them",
        "env B is set by the profile p and by host h's knob_serve_host_env; remove it from one of them",
        "flag --x is set by the profile p and by host h's knob_serve_host_args; remove it from one of them",
        "flag --y is set by the profile p and by host h's knob_serve_host_args; remove it from one of them",
    ]


@pytest.mark.parametrize(
    ("engine", "flag", "var"),
    [
        ("sglang", "port", "knob_serve_port"),
        ("sglang", "model-path", "knob_serve_model_path"),
        ("vllm", "port", "knob_serve_port"),
    ],
)
def test_flags_the_launch_line_sets_from_host_vars_are_reserved(engine: str, flag: str, var: str) -> None:
    assert problems(profile(engine, args={flag: "1"}), HostVars(host="h")) == [
        f"flag --{flag} is set by the profile p and by host h's {var}; remove it from one of them"
    ]


def test_a_reserved_host_flag_names_the_listen_host_var() -> None:
    assert problems(profile(args={"host": "0.0.0.0"}), HostVars(host="h")) == [
        "flag --host is set by the profile p and by host h's knob_serve_listen_host; remove it from one of them"
    ]


def test_a_host_arg_that_is_also_reserved_names_the_host_args() -> None:
    hv = HostVars(host="h", host_args={"port": "1"})
    assert problems(profile(args={"port": "2"}), hv) == [
        "flag --port is set by host h's knob_serve_host_args and by its knob_serve_port (the launch line carries "
        "it); remove it from knob_serve_host_args",
        "flag --port is set by the profile p and by host h's knob_serve_host_args; remove it from one of them",
    ]


def test_a_host_arg_the_launch_line_sets_is_refused_without_any_profile_arg() -> None:
    hv = HostVars(host="h", host_args={"port": "1"})
    assert problems(profile(), hv) == [
        "flag --port is set by host h's knob_serve_host_args and by its knob_serve_port (the launch line carries "
        "it); remove it from knob_serve_host_args"
    ]


def test_every_problem_is_reported_at_once() -> None:
    hv = HostVars(host="h", host_env={"A": "1"}, host_args={"x": "1"})
    assert len(problems(profile(env={"A": "2"}, args={"x": "2", "port": "3"}), hv)) == 3


@pytest.mark.parametrize(
    ("host_flag", "profile_flag", "source"),
    [
        ("tensor-parallel-size", "tp-size", "knob_serve_host_args (as --tensor-parallel-size)"),
        ("tp", "tp-size", "knob_serve_host_args (as --tp)"),
        ("tp-size", "tensor-parallel-size", "knob_serve_host_args (as --tp-size)"),
    ],
)
def test_one_flag_in_two_spellings_is_a_conflict(host_flag: str, profile_flag: str, source: str) -> None:
    """The engine reads --tp, --tensor-parallel-size and --tp-size as one flag (the argv reader's aliases and
    prefix abbreviations): set by both the host and the profile, the last one on the line would silently win."""
    hv = HostVars(host="h", engine="sglang", host_args={host_flag: "2"})
    assert problems(profile(args={profile_flag: "4"}), hv) == [
        f"flag --{profile_flag} is set by the profile p and by host h's {source}; remove it from one of them"
    ]


def test_a_profile_flag_spelling_a_reserved_flag_is_a_conflict() -> None:
    hv = HostVars(host="h", engine="sglang")
    (line,) = problems(profile(args={"model": "/other"}), hv)
    assert line.startswith(
        "flag --model is set by the profile p and by host h's knob_serve_model_path (as --model-path)"
    )

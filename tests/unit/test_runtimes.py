"""The runtime seam's contract (python/knobfleet/runtimes.py), run over every runtime of the registry: the script and
unit the role renders for a host of that runtime, read back by the on-host live rule (module_utils/knob_live), give
the engine the profile's env and command line; a container runtime's run line names the image by ID, passes every
knob by name, stops within the unit's grace and pulls nothing; the unit carries no profile data; what a runtime
refuses is one line naming the var and the fix. A new runtime is covered by adding it to ``RUNTIMES``."""

from __future__ import annotations

import hashlib

import pytest
from pydantic import ValidationError

from knobfleet.fleet.hostvars import HostVars
from knobfleet.module_utils.knob_live import expected_from_files
from knobfleet.profiles.model import Profile
from knobfleet.render import expected_env, render_host
from knobfleet.runtimes import OWN_OPTIONS, RUNTIMES

IMAGE = "sha256:" + "c6779c5e75914350bdc5d27e25f5ef89f23a9981ef0ead3873edcb901981a98d"
OPTIONS = ("--cgroups=disabled", "--volume=/usr:/usr:ro", "--init")
PROFILE = Profile.model_validate(
    {
        "name": "p",
        "version": 1,
        "engine": "sglang",
        "env": {"SGLANG_SM120_MMA_TARGET_CTAS": 512, "SGLANG_OPT_USE_MULTI_STREAM_OVERLAP": 0},
        "args": {"max-running-requests": 128, "trust-remote-code": True},
    }
)


def host(name: str, **kw: object) -> HostVars:
    container = RUNTIMES[name].container
    extra = {"image": IMAGE, "container_options": OPTIONS} if container else {}
    return HostVars(
        host="h1", runtime=name, host_env={"SGLANG_SIM_GPU": "rtx pro 6000 'q'"}, timeout_stop_s=75, **extra, **kw
    )  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(RUNTIMES))
def test_the_engine_gets_the_profiles_env_and_command_line_whatever_runs_it(name: str) -> None:
    hv = host(name)
    r = render_host(PROFILE, hv)
    seen = expected_from_files(hv.script_path, r.script, hv.unit_path, r.unit, hashlib.sha256)
    assert seen["env"] == expected_env(PROFILE, hv) == r.env
    assert seen["argv"] == r.argv  # the engine's own command: what its process's cmdline must be
    assert r.argv[-2:] == ["--max-running-requests=128", "--trust-remote-code"]
    run = seen.get("container")
    if not RUNTIMES[name].container:
        assert run is None and f"exec \\\n  {r.argv[0]}" in r.script
        assert "ExecStop=" not in r.unit and "ExecStartPre=-" not in r.unit  # only the compile cache's folder
        return
    assert run is not None
    assert run["runtime"] == name and run["image"] == IMAGE and run["name"] == hv.service
    assert run["env_names"] == sorted(r.env) and run["env_pairs"] == {}, "every knob by name, no value in argv"
    assert run["stop_timeout"] == hv.timeout_stop_s and run["pull"] == "never" and run["restart"] is None
    assert [o for o in OPTIONS if o in run["options"]] == list(OPTIONS)
    assert f"ExecStartPre=-/usr/bin/{name} rm --force {hv.service}\n" in r.unit
    assert f"ExecStop=/usr/bin/{name} stop --time=75 {hv.service}\n" in r.unit
    assert f"ExecStart={hv.script_path}\n" in r.unit


@pytest.mark.parametrize("name", sorted(RUNTIMES))
def test_the_unit_carries_no_profile_data(name: str) -> None:
    r = render_host(PROFILE, host(name))
    for value in ("512", "rtx pro 6000", "max-running-requests", IMAGE):
        assert value not in r.unit


@pytest.mark.parametrize(
    ("runtime", "kw", "message"),
    [
        ("docker", {"image": "vllm/vllm-openai:latest"}, "knob_serve_image must be the image's ID"),
        ("podman", {"image": ""}, "knob_serve_image must be the image's ID"),
        ("podman", {"image": IMAGE, "container_options": ("--restart=always",)}, "--restart is not yours to set"),
        ("docker", {"image": IMAGE, "container_options": ("-v", "/x:/x")}, "write each option as one --name=value"),
        ("docker", {"image": IMAGE, "container_options": ("--volume", "/x:/x")}, "write each option as one"),
        ("docker", {"image": IMAGE, "container_options": ("--env=A=1",)}, "--env is not yours to set"),
        ("systemd", {"image": IMAGE}, "knob_serve_image is set but knob_serve_runtime is systemd"),
        ("systemd", {"container_options": ("--init",)}, "knob_serve_container_options is set but"),
    ],
)
def test_what_a_runtime_refuses_is_one_line_naming_the_var_and_the_fix(
    runtime: str, kw: dict[str, object], message: str
) -> None:
    with pytest.raises(ValidationError) as exc:
        HostVars(host="h1", runtime=runtime, **kw)  # type: ignore[arg-type]
    line = exc.value.errors()[0]["msg"]
    assert message in line and "\n" not in line


@pytest.mark.parametrize("option", sorted(OWN_OPTIONS))
def test_every_option_knobfleet_owns_is_refused(option: str) -> None:
    word = option if option.startswith("--") else "--env"
    with pytest.raises(ValidationError, match="is not yours to set"):
        HostVars(host="h1", runtime="podman", image=IMAGE, container_options=(f"{word}=x",))


def test_an_unknown_runtime_is_refused() -> None:
    with pytest.raises(ValidationError, match="runtime"):
        HostVars(host="h1", runtime="containerd")  # type: ignore[arg-type]

"""One place decides the launcher (issue 58): roles/knob_serve/templates/launcher.json.j2, rendered by the controller
(render.launcher_of, so plan, render and the live check) and looked up by the role's preflight. A host that sets
both its default launcher and its installs launches the pinned version's install; the host default never wins."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from knobfleet.fleet.hostvars import HostVars
from knobfleet.profiles.model import Profile
from knobfleet.render import expected_argv, launcher_of, render_host
from tests.conftest import REPO

INSTALLS = {"0.5.22": ("/opt/sglang-0.5.22/bin/python", "-m", "sglang.launch_server"),
            "0.5.23": ("/opt/sglang-0.5.23/bin/python", "-m", "sglang.launch_server")}  # fmt: skip
DEFAULT = ("/usr/bin/python3", "-m", "sglang_sim.launch_server")  # the lab's group vars set one: its normal shape


def _profile(pin: str | None) -> Profile:
    doc = {"name": "p", "version": 1, "engine": "sglang", "env": {}, "args": {}}
    if pin:
        doc |= {"engine_version": pin, "validated_on": pin}
    return Profile.model_validate(doc)


@pytest.mark.parametrize(
    ("pin", "launcher", "launchers", "expected"),
    [
        ("0.5.22", DEFAULT, INSTALLS, INSTALLS["0.5.22"]),  # both set: the pinned install, never the default
        ("0.5.23", DEFAULT, INSTALLS, INSTALLS["0.5.23"]),
        ("0.5.22", (), INSTALLS, INSTALLS["0.5.22"]),
        (None, DEFAULT, INSTALLS, DEFAULT),  # no pin: the host's default
        ("0.5.22", DEFAULT, {}, DEFAULT),  # a host that names no installs runs its one launcher
        (None, (), {}, None),  # neither: the engine's own
    ],
)
def test_the_launcher_a_host_runs(
    pin: str | None, launcher: tuple[str, ...], launchers: dict[str, tuple[str, ...]], expected: tuple[str, ...] | None
) -> None:
    hv = HostVars(host="h", engine="sglang", launchers=launchers, **({"launcher": launcher} if launcher else {}))
    profile = _profile(pin)
    assert launcher_of(profile, hv) == expected
    if expected:
        assert expected_argv(profile, hv)[: len(expected)] == list(expected)
        script = render_host(profile, hv).script
        assert f"exec \\\n  {expected[0]} \\\n" in script and all(a not in script for a in set(DEFAULT) - set(expected))


def test_the_role_reads_the_same_template() -> None:
    tasks = yaml.safe_load((REPO / "roles" / "knob_serve" / "tasks" / "preflight.yml").read_text())
    setters = [t for t in tasks if "knob_serve_launcher" in (t.get("ansible.builtin.set_fact") or {})]
    assert len(setters) == 1 and "when" not in setters[0]
    assert setters[0]["ansible.builtin.set_fact"]["knob_serve_launcher"] == (
        "{{ lookup('ansible.builtin.template', 'launcher.json.j2') | from_json }}"
    )
    assert Path(REPO / "roles" / "knob_serve" / "templates" / "launcher.json.j2").is_file()

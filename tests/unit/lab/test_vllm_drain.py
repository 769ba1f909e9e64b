"""The lab's vLLM hosts drain on SIGTERM: their host vars render `--shutdown-timeout 20` into the serve script
and a TimeoutStopSec that covers it (rendered with the role's own templates)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from knobfleet.fleet.hostvars import from_inventory_vars
from knobfleet.fleet.router_kinds import stop_covers_drain
from knobfleet.lab.nspawn import Lab
from knobfleet.profiles.store import ProfileStore
from knobfleet.render import render_host


def test_vllm_lab_hosts_render_a_covered_shutdown_timeout(tmp_path: Path) -> None:
    data = yaml.safe_load(Lab(tmp_path).vllm_group_vars())
    hv = from_inventory_vars("lab3", {**data, "knob_serve_listen_host": "127.0.1.3"}, "inventory")
    profile = ProfileStore().resolve("vllm-tiny")
    rendered = render_host(profile, hv)
    assert "--shutdown-timeout=20" in rendered.argv and "--shutdown-timeout=20" in rendered.script
    assert "TimeoutStopSec=45\n" in rendered.unit
    assert stop_covers_drain(hv) is None


@pytest.mark.parametrize(
    ("stop", "reason"),
    [
        (45, None),
        (20, "host lab3: knob_serve_timeout_stop_s (20) must exceed --shutdown-timeout (20): systemd would kill "
             "an engine still draining"),
    ],
)  # fmt: skip
def test_stop_must_exceed_the_engines_shutdown_timeout(stop: int, reason: str | None) -> None:
    hv = from_inventory_vars(
        "lab3", {"knob_serve_host_args": {"shutdown-timeout": "20"}, "knob_serve_timeout_stop_s": stop}, "inv"
    )
    assert stop_covers_drain(hv) == reason

"""`tune` checks what its live stage needs before the first stage runs (issue 58): a SPACE whose live stage is a
canary, on hosts behind no router, is refused in one line naming the SPACE's field and the fix; with
``stages.live.skip`` (promoted through the rollout) or with every host behind a router it passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from knobfleet.cli.tune import _live_preconditions, load_space
from knobfleet.fleet.hostvars import HostVars
from knobfleet.tune.space import SpaceError
from tests.unit.tune.tune_fixtures import SEED_SPACE

ROUTED = "http://127.0.0.1:30080"


def _space(tmp_path: Path, text: str = SEED_SPACE):  # type: ignore[no-untyped-def]
    p = tmp_path / "space.yaml"
    p.write_text(text)
    return load_space(p)


def test_a_canary_stage_on_hosts_behind_no_router_is_refused_up_front(tmp_path: Path) -> None:
    sp = _space(tmp_path)
    assert sp.live.skip is None
    hosts = [HostVars(host=f"lab{i}") for i in (1, 2, 3)]
    with pytest.raises(SpaceError) as exc:
        _live_preconditions(sp, hosts)
    msg = str(exc.value)
    assert "stages.live:" in msg and "behind no router (knob_router_url)" in msg and "stages.live.skip" in msg
    assert msg.count("\n") == 0 and "space.yaml" in msg


def test_routed_hosts_or_a_skipped_live_stage_pass(tmp_path: Path) -> None:
    sp = _space(tmp_path)
    _live_preconditions(sp, [HostVars(host=f"lab{i}", router_url=ROUTED) for i in (1, 2, 3)])
    text = SEED_SPACE
    assert "live:" in text
    skipped = _space(tmp_path, _with_skip(text))
    assert skipped.live.skip
    _live_preconditions(skipped, [HostVars(host=f"lab{i}") for i in (1, 2, 3)])


def _with_skip(text: str) -> str:
    lines = text.splitlines()
    out = []
    for line in lines:
        if line.strip().startswith("live:"):
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f'{indent}live: {{skip: "no router in this lab"}}')
        else:
            out.append(line)
    return "\n".join(out) + "\n"

"""render gets the engine from its caller (apply resolves it once for every host), and its output is byte for byte
what it was when it resolved the engine through the host vars itself: the golden file was recorded from the code
before the change (every shipped and v1 profile, on every unit-inventory host and two bare ones), and re-recorded
once after the merge that changed render's output on purpose (Restart=always in the unit, the catalogs' secret
decisions in ``secret``); a later difference is a change of render's output to review."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from knobfleet.engines.adapter import engine
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.inventory import load_hosts
from knobfleet.profiles.store import ProfileStore
from knobfleet.render import render_host

REPO = Path(__file__).resolve().parents[2]
GOLDEN = json.loads((Path(__file__).parent / "data" / "render_golden" / "before.json").read_text())


def cases() -> list[tuple[str, Path, str, HostVars]]:
    hosts = load_hosts(REPO / "tests/unit/data/inventory_v1")
    hosts += [HostVars(host="h"), HostVars(host="v", engine="vllm", listen_host="127.0.0.9", port=8000)]
    out = []
    for d in (REPO / "profiles", REPO / "tests/unit/data/profiles_v1"):
        for name in ProfileStore(d).names():
            out += [(f"{d.name}/{name}@{hv.host}", d, name, hv) for hv in hosts]
    return out


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize(("key", "directory", "name", "hv"), cases(), ids=lambda v: v if isinstance(v, str) else "")
def test_render_with_the_callers_engine_is_byte_identical(key: str, directory: Path, name: str, hv: HostVars) -> None:
    p = ProfileStore(directory).resolve(name, check_lock=False)
    if hv.engine is not None and hv.engine != p.engine:
        assert key not in GOLDEN
        return
    for r in (render_host(p, hv, engine=engine(p.engine)), render_host(p, hv)):
        got = {
            "script": digest(r.script),
            "unit": digest(r.unit),
            "env": r.env,
            "argv": r.argv,
            "secret": list(r.secret),
        }
        assert got == GOLDEN[key]


def test_render_never_resolves_the_engine_through_the_host_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    p = ProfileStore(REPO / "profiles").resolve("ctas512", check_lock=False)

    def refuse(self, name=None):  # type: ignore[no-untyped-def]
        raise AssertionError("render asked the host vars for the engine")

    monkeypatch.setattr(HostVars, "adapter", refuse)
    assert render_host(p, HostVars(host="h"), engine=engine(p.engine)).argv[0]

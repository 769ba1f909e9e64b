"""The read path's cached plain view of the fleet: equal to the validated one, a miss whenever an input changes,
and the engine-rule choice of ``ops.drift.engine_rules``."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from knobfleet.fleet import inventory, readhost
from knobfleet.fleet.probe import probe_args
from knobfleet.ops.drift import engine_rules


@pytest.fixture
def inv(repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))
    target = tmp_path / "inv"
    shutil.copytree(repo / "inventories" / "lab", target, ignore=shutil.ignore_patterns("lab_ssh.yml"))
    return target


def test_the_cached_view_equals_the_validated_hosts(inv: Path) -> None:
    assert readhost.load(inv, None) is None  # nothing cached yet
    built = readhost.plan_for(inv, None)
    cached = readhost.load(inv, None)
    assert cached is not None and cached.cached and not built.cached
    assert cached.hosts == built.hosts
    hosts = inventory.load_hosts(inv)
    for hv, rh in zip(hosts, cached.hosts, strict=True):
        assert (rh.host, rh.address, rh.connection, rh.engine, rh.profile) == (
            hv.host,
            hv.address,
            hv.connection,
            hv.engine,
            hv.profile,
        )
        assert rh.probe == probe_args(hv)
    assert set(cached.engines) >= {"sglang", "vllm"} and cached.default_engine == "sglang"


def test_any_inventory_change_or_other_limit_is_a_miss(inv: Path) -> None:
    readhost.plan_for(inv, None)
    assert readhost.load(inv, "lab2") is None
    main = inv / "group_vars" / "all" / "main.yml"
    main.write_text(main.read_text().replace("knob_serve_port: 30000", "knob_serve_port: 30001"))
    assert readhost.load(inv, None) is None
    plan = readhost.plan_for(inv, None)
    assert plan.hosts[0].probe["health_url"].endswith(":30001/health_generate")


def test_a_catalog_change_is_a_miss(inv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    extra = tmp_path / "overlay.yaml"
    extra.write_text("a: 1\n")
    real = readhost._catalog_files
    monkeypatch.setattr(readhost, "_catalog_files", lambda: [*real(), extra])
    readhost.plan_for(inv, None)
    assert readhost.load(inv, None) is not None
    extra.write_text("a: 2\n")
    assert readhost.load(inv, None) is None


def test_a_role_default_change_is_a_miss(inv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = tmp_path / "main.yml"
    defaults.write_text("knob_serve_service: a\n")
    monkeypatch.setattr(readhost, "_role_defaults", lambda: [defaults])
    readhost.plan_for(inv, None)
    assert readhost.load(inv, None) is not None
    defaults.write_text("knob_serve_service: b\n")
    assert readhost.load(inv, None) is None


def test_uncacheable_inventories_are_never_cached(inv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KNOBFLEET_INVENTORY_CACHE", "0")
    readhost.plan_for(inv, None)
    assert not (Path(str(inv.parent / "state")) / "cache" / "readpath").exists()


def gen_doc(engine: str | None) -> dict[str, Any]:
    meta = {"engine": engine} if engine else {}
    return {"generations": {"current": 3, "list": [{"generation": 3, "meta": meta}]}}


@pytest.mark.parametrize("recorded", [None, "vllm", "sglang", "no-such-engine"])
def test_rules_are_chosen_as_drift_chooses_them(inv: Path, recorded: str | None) -> None:
    plan = readhost.plan_for(inv, None)
    cached = readhost.load(inv, None)
    assert cached is not None
    (hv,) = inventory.load_hosts(inv, "lab1")
    doc = gen_doc(recorded)
    expected = engine_rules(hv, doc)
    assert plan.rules_for(plan.hosts[0], doc) == expected
    assert cached.rules_for(cached.hosts[0], doc) == expected


def test_a_cached_drift_imports_neither_pydantic_nor_ansible(inv: Path, repo: Path, tmp_path: Path) -> None:
    """The read path's fixed cost: with its view cached, `drift` loads no validation or Ansible code, answers and
    verdicts included (the engine-version check once pulled in the catalog model, and with it pydantic)."""
    readhost.plan_for(inv, None)
    code = (
        "import sys, runpy\n"
        "sys.argv = ['knobfleet', 'drift', '--json', '-i', sys.argv[1], '--via', 'ssh']\n"
        "from knobfleet.fleet import readhost\n"
        "from knobfleet.ops import drift\n"
        "from knobfleet.fleet.transports.base import Outcome\n"
        "class Door:\n"
        "    def stream(self, hosts, on_event=None):\n"
        f"        return iter([Outcome(h.host, doc={gen_doc('sglang')!r}) for h in hosts])\n"
        "drift.door = lambda *a, **k: Door()  # every host answers, so each verdict is computed as for a real one\n"
        "from knobfleet.cli import main\n"
        "main()\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'yaml', 'ansible', 'jinja2', 'rich'))\n"
        "print(bad)\n"
    )
    env = {"KNOBFLEET_STATE_DIR": str(tmp_path / "state"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code, str(inv)], capture_output=True, text=True, env=env, cwd=repo)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr

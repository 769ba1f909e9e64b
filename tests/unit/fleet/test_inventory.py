"""The inventory cache: hits only when no file changed, never for dynamic or time-dependent inventories."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from knobfleet.errors import InventoryError
from knobfleet.fleet import inventory


@pytest.fixture
def inv(repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))
    target = tmp_path / "inv"
    shutil.copytree(repo / "inventories" / "lab", target, ignore=shutil.ignore_patterns("lab_ssh.yml"))
    return target


def count_loads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = inventory._load

    def counting(*a: object, **kw: object) -> object:
        calls.append(1)
        return real(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(inventory, "_load", counting)
    return calls


def test_second_read_is_a_cache_hit_with_equal_hosts(inv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = count_loads(monkeypatch)
    first = inventory.load_hosts(inv)
    second = inventory.load_hosts(inv)
    assert calls == [1] and first == second
    assert second[1].connection["ansible_host"] == "127.0.1.2" and second[1].listen_host == "127.0.1.2"
    inventory.load_hosts(inv, "lab2")
    assert calls == [1, 1]  # another --limit is another key


def test_any_file_change_is_a_miss(inv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = count_loads(monkeypatch)
    # (ansible's host_group_vars plugin remembers directory listings per process: the file exists from the start)
    (inv / "host_vars").mkdir()
    (inv / "host_vars" / "lab1.yml").write_text("# nothing yet\n")
    inventory.load_hosts(inv)
    main = inv / "group_vars" / "all" / "main.yml"
    main.write_text(main.read_text().replace("knob_serve_port: 30000", "knob_serve_port: 30001"))
    assert inventory.load_hosts(inv)[0].port == 30001 and calls == [1, 1]
    (inv / "host_vars" / "lab1.yml").write_text("knob_serve_port: 30002\n")
    assert inventory.load_hosts(inv)[0].port == 30002 and calls == [1, 1, 1]


@pytest.mark.parametrize(
    ("change", "cached"),
    [
        ("knob_serve_unit_dir: \"{{ lookup('env', 'UNITS') | default('/etc/systemd/system', true) }}\"\n", False),
        ("knob_serve_unit_dir: \"{{ '/etc/systemd/system' if now().year > 2000 else '/x' }}\"\n", False),
        ("knob_serve_unit_dir: \"{{ '/etc/systemd/' ~ inventory_hostname }}\"\n", True),
    ],
)
def test_time_or_environment_dependent_vars_are_never_cached(
    inv: Path, monkeypatch: pytest.MonkeyPatch, change: str, cached: bool
) -> None:
    (inv / "group_vars" / "all" / "extra.yml").write_text(change)
    calls = count_loads(monkeypatch)
    inventory.load_hosts(inv)
    inventory.load_hosts(inv)
    assert calls == ([1] if cached else [1, 1])


def test_dynamic_inventories_have_no_fingerprint(inv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert inventory.fingerprint(inv, None) is not None
    script = inv / "dyn.py"
    script.write_text("#!/usr/bin/env python3\n")
    script.chmod(0o755)
    assert inventory.fingerprint(inv, None) is None
    script.unlink()
    (inv / "cloud.yml").write_text("plugin: amazon.aws.aws_ec2\n")
    assert inventory.fingerprint(inv, None) is None
    monkeypatch.setenv("KNOBFLEET_INVENTORY_CACHE", "0")
    (inv / "cloud.yml").unlink()
    assert inventory.fingerprint(inv, None) is None


def test_errors_are_not_cached(inv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    main = inv / "group_vars" / "all" / "main.yml"
    main.write_text(main.read_text().replace("knob_serve_port: 30000", "knob_serve_port: 70000"))
    for _ in range(2):
        with pytest.raises(InventoryError, match="knob_serve_port: Input should be less than or equal to 65535"):
            inventory.load_hosts(inv)
    assert not list((inv.parent / "state").rglob("*.json"))


def test_a_running_lab_that_carries_more_than_inventories_lab_is_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`lab up -n 3 --router` wrote the router's vars: with lab1..lab3 up, inventories/lab (no router) would make a
    rollout restart every engine with requests in flight and no drain."""
    import os

    from knobfleet import paths
    from knobfleet.fleet import inventory as inv_mod

    for var in ("KNOBFLEET_INVENTORY", "ANSIBLE_INVENTORY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(paths, "project", lambda: None)
    monkeypatch.setattr(paths, "uses_collection", lambda: False)
    lab = paths.state_dir() / "lab"
    (lab / "run").mkdir(parents=True)
    for i in (1, 2, 3):
        (lab / "run" / f"lab{i}.pid").write_text(str(os.getpid()))
    written = lab / "inventory"
    (written / "group_vars" / "all").mkdir(parents=True)
    (written / "hosts.yml").write_text("all: {}\n")
    for name in ("main.yml", "lab_ssh.yml"):
        (written / "group_vars" / "all" / name).write_text("{}\n")
    assert inv_mod.default() == paths.default_inventory()  # a plain 3-host lab: the checkout's
    (written / "group_vars" / "all" / "router.yml").write_text("knob_router_url: http://127.0.0.1:30080\n")
    assert inv_mod.default() == written
    (written / "group_vars" / "all" / "router.yml").unlink()
    (written / "group_vars" / "vllm.yml").write_text("knob_engine: vllm\n")
    assert inv_mod.default() == written


def test_a_group_vars_file_removed_between_two_reads_in_one_process_is_no_error(inv: Path) -> None:
    """Ansible's host_group_vars plugin remembers the vars files it found per process; a file removed since (a lab's
    router.yml after `lab down`, an operator's edit between two `drift --watch` rounds) is looked for again."""
    extra = inv / "group_vars" / "all" / "zz_extra.yml"  # after main.yml: it wins
    extra.parent.mkdir(parents=True, exist_ok=True)
    extra.write_text("knob_serve_port: 30007\n")
    assert inventory.load_hosts(inv)[0].port == 30007
    extra.unlink()
    assert inventory.load_hosts(inv)[0].port != 30007

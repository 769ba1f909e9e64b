from __future__ import annotations

from pathlib import Path

import pytest

from knobfleet.errors import InventoryError
from knobfleet.fleet.hostvars import from_inventory_vars
from knobfleet.fleet.inventory import load_hosts


def test_lab_inventory_resolves_templated_vars(repo: Path) -> None:
    hosts = load_hosts(repo / "inventories" / "lab")
    assert [h.host for h in hosts] == ["lab1", "lab2", "lab3"]
    assert hosts[1].listen_host == "127.0.1.2" and hosts[1].health_url == "http://127.0.1.2:30000/health_generate"
    assert hosts[0].launcher == ("/usr/bin/python3", "-m", "sglang_sim.launch_server")


def test_example_inventory_declares_profiles(repo: Path) -> None:
    hosts = load_hosts(repo / "inventories" / "example")
    assert len(hosts) == 4 and {h.profile for h in hosts} == {"ctas512"}
    assert hosts[0].host_env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        (
            "knob_serve_script_path",
            "relative/serve.sh",
            "inv: host h1: knob_serve_script_path: Value error, must be an absolute path of letters, digits and "
            "._/@+- only, without . or .. segments; fix it in host_vars or group_vars",
        ),
        (
            "knob_serve_port",
            70000,
            "inv: host h1: knob_serve_port: Input should be less than or equal to 65535; "
            "fix it in host_vars or group_vars",
        ),
        (
            "knob_serve_service",
            "a b",
            "inv: host h1: knob_serve_service: Value error, must be a plain unit name "
            "without the .service suffix (letters, digits and _.@-); fix it in host_vars or group_vars",
        ),
    ],
)
def test_bad_host_vars_name_host_field_and_fix(var: str, value: object, message: str) -> None:
    with pytest.raises(InventoryError) as info:
        from_inventory_vars("h1", {var: value}, "inv")
    assert str(info.value) == message


def test_missing_inventory_and_empty_limit(tmp_path: Path, repo: Path) -> None:
    with pytest.raises(InventoryError, match="inventory not found; pass -i PATH"):
        load_hosts(tmp_path / "nope")
    with pytest.raises(InventoryError, match="no hosts matching --limit 'zz'"):
        load_hosts(repo / "inventories" / "lab", "zz")


def test_the_connection_vars_are_the_transports_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing central lists how a host is reached: the host view keeps the union of what the registered transports
    declare they read (a new transport brings its keys), never a password's value."""
    from knobfleet.fleet import hostvars as hv_mod
    from knobfleet.fleet import transports

    class Kubectl:
        reads = frozenset({"ansible_kubectl_context", "ansible_kubectl_password"})

    monkeypatch.setitem(transports.REGISTRY, "kubectl", Kubectl)  # type: ignore[arg-type]
    hv_mod.connection_vars.cache_clear()
    try:
        got = hv_mod.from_inventory_vars(
            "h1",
            {"ansible_host": "127.0.1.9", "ansible_kubectl_context": "prod", "ansible_kubectl_password": "x",
             "ansible_ssh_pass": "y", "ansible_unknown_thing": "z"},
            "inventory",
        )  # fmt: skip
        # a password var is never copied: a known one is marked as set (the fast path cannot type it)
        assert got.connection == {
            "ansible_host": "127.0.1.9",
            "ansible_kubectl_context": "prod",
            "ansible_ssh_pass": "<set>",
        }
    finally:
        monkeypatch.undo()
        hv_mod.connection_vars.cache_clear()
    assert "ansible_kubectl_context" not in hv_mod.connection_vars()

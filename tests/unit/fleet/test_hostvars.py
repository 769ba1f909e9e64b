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

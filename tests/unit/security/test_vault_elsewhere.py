"""The three HIGH secret leaks of the third audit (issue 40, causes 2 and 3), each through the whole inventory
reader with real Ansible: a YAML syntax error on a line that holds a token, a vault value in a host var that wants
a number, a vault value templated into a path host var. None of them may show the secret; each is one line naming
the file or the var and the fix. Every file is written in the test's temp dir."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from knobfleet.errors import InventoryError
from knobfleet.fleet.inventory import load_hosts
from knobfleet.fleet.vaultvars import scrub

TOKEN = "hf_abcdefghijklmnopqrstuvwxyz0123456789"
VAULTED = "s3cr3tvalue99"


def inventory(tmp_path: Path, host_vars: str) -> Path:
    inv = tmp_path / "inv"
    (inv / "host_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    lab1:\n      ansible_host: 127.0.1.1\n")
    (inv / "host_vars" / "lab1.yml").write_text(host_vars)
    return inv


def vault(value: str, indent: int = 2) -> str:
    from ansible.parsing.vault import VaultLib, VaultSecret

    secret = VaultSecret(b"pw")
    blob = VaultLib([("default", secret)]).encrypt(value, secret).decode()
    return "!vault |\n" + "".join(f"{' ' * indent}{line}\n" for line in blob.splitlines())


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("KNOBFLEET_INVENTORY_CACHE", "0")
    pw = tmp_path / "vault.pw"
    pw.write_text("pw\n")
    os.chmod(pw, 0o600)
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(pw))
    return tmp_path


def test_a_syntax_error_on_a_line_with_a_token_names_file_and_line_only(isolated: Path) -> None:
    inv = inventory(isolated, f'knob_serve_host_env:\n  HF_TOKEN: "{TOKEN}\n  OTHER: [1, 2\n')
    with pytest.raises(InventoryError) as exc:
        load_hosts(inv)
    text = str(exc.value)
    assert TOKEN not in text and "\n" not in text
    assert "host lab1: cannot parse" in text and "lab1.yml, near line" in text and "syntax error" in text


@pytest.mark.parametrize("var", ["knob_serve_port", "knob_serve_model_path", "knob_serve_listen_host"])
def test_a_vault_value_outside_env_and_flags_is_refused_by_name(isolated: Path, var: str) -> None:
    inv = inventory(isolated, f"{var}: {vault(VAULTED)}")
    with pytest.raises(InventoryError) as exc:
        load_hosts(inv)
    text = str(exc.value)
    assert VAULTED not in text and f"{var} comes from the vault" in text and "move the secret there" in text


def test_a_vault_value_templated_into_a_path_is_refused_too(isolated: Path) -> None:
    inv = inventory(
        isolated, f"model_secret: {vault(VAULTED)}knob_serve_model_path: '/models/{{{{ model_secret }}}}'\n"
    )
    with pytest.raises(InventoryError, match="knob_serve_model_path comes from the vault") as exc:
        load_hosts(inv)
    assert VAULTED not in str(exc.value)


def test_a_vault_value_in_the_env_stays_allowed(isolated: Path) -> None:
    (hv,) = load_hosts(inventory(isolated, f"knob_serve_host_env:\n  DB_URL: {vault(VAULTED, 4)}"))
    assert hv.host_env["DB_URL"] == VAULTED and "DB_URL" in hv.secrets()


@pytest.mark.parametrize(
    ("message", "vaulted", "hidden"),
    [
        (f"knob_router_url: {VAULTED} is not a URL", {VAULTED}, VAULTED),
        (f"port: {TOKEN} is not an integer", set(), TOKEN),
        ("x: postgres://app:hunter2hunter2@db/x is wrong", set(), "hunter2hunter2"),
    ],
)
def test_scrub_hides_vault_values_and_secret_shapes(message: str, vaulted: set[str], hidden: str) -> None:
    out = scrub(message, vaulted)
    assert hidden not in out and ("<a vault value>" in out or "<a secret>" in out)

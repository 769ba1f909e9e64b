"""Issue 56 (HIGH): the values of a vault-encrypted vars file, the usual Ansible layout (``ansible-vault encrypt
group_vars/all/vault.yml``), are from the vault though they decrypt to plain strings: a host env value from one is
secret (never printed by render, never in the inventory cache, never in a message), and one that reaches a var
knobfleet shows is refused by name. Every file is written in the test's temp dir; the inventory is read by real
Ansible."""

from __future__ import annotations

from pathlib import Path

import pytest

from knobfleet.errors import InventoryError
from knobfleet.fleet.inventory import load_hosts

SECRET = "sk-vaultfile-7f3e9a1c"


def encrypted(text: str) -> str:
    from ansible.parsing.vault import VaultLib, VaultSecret

    secret = VaultSecret(b"pw")
    return VaultLib([("default", secret)]).encrypt(text, secret).decode()


def inventory(tmp_path: Path, vault_text: str, plain: str = "") -> Path:
    inv = tmp_path / "inv"
    (inv / "group_vars" / "all").mkdir(parents=True)
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    lab1:\n      ansible_host: 127.0.1.1\n")
    (inv / "group_vars" / "all" / "vault.yml").write_text(encrypted(vault_text))
    if plain:
        (inv / "group_vars" / "all" / "main.yml").write_text(plain)
    return inv


@pytest.fixture
def isolated(vault_project: Path) -> Path:
    return vault_project


def _everything_written(root: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize(
    ("vault_text", "plain"),
    [
        (f"knob_serve_host_env:\n  SGLANG_API_SECRET: {SECRET}\n", ""),  # the env itself in the vault file
        (f"vault_api_secret: {SECRET}\n", "knob_serve_host_env:\n  SGLANG_API_SECRET: '{{ vault_api_secret }}'\n"),
    ],
    ids=["env in the vault file", "templated from a vault file var"],
)
def test_a_vault_file_value_is_secret_and_never_cached(isolated: Path, vault_text: str, plain: str) -> None:
    inv = inventory(isolated, vault_text, plain)
    for _ in range(2):  # the second read would come from the cache, were anything cached
        (hv,) = load_hosts(inv)
        assert hv.host_env["SGLANG_API_SECRET"] == SECRET  # the engine still gets it
        assert "SGLANG_API_SECRET" in hv.secret_env and hv.has_secrets()
    assert SECRET not in _everything_written(isolated / "state")


def test_render_shows_a_vault_file_value_as_a_marker(isolated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from knobfleet import cli

    inv = inventory(isolated, f"knob_serve_host_env:\n  SGLANG_API_SECRET: {SECRET}\n")
    code = cli.run(["render", "ctas512", "-i", str(inv), "--host", "lab1", "--what", "env"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "SGLANG_API_SECRET" in out and SECRET not in out + err
    assert SECRET not in _everything_written(isolated / "state")


def test_a_vault_file_value_in_a_shown_var_is_refused_by_name(isolated: Path) -> None:
    inv = inventory(isolated, "vault_model: /models/secret-name-42\n", "knob_serve_model_path: '{{ vault_model }}'\n")
    with pytest.raises(InventoryError) as exc:
        load_hosts(inv)
    text = str(exc.value)
    assert "knob_serve_model_path comes from the vault" in text and "secret-name-42" not in text

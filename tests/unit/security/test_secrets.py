"""Secrets are knobs too: never shown, stored or compared but as hashes; never in a profile; never cached;
vault-encrypted inventory vars decrypt with the user's vault password file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from knobfleet.errors import InventoryError, ProfileError
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.inventory import load_hosts
from knobfleet.module_utils import knob_live, knob_observe
from knobfleet.profiles.store import ProfileStore
from knobfleet.render import render_host

TOKEN = "hf_ThisIsTheSecretValue123"


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("HF_TOKEN", True),
        ("OPENAI_API_KEY", True),
        ("DB_PASSWORD", True),
        ("MY_SECRET", True),
        ("X", False),
        ("SGLANG_SM120_MMA_TARGET_CTAS", False),
        ("TOKENIZER_PATH", False),
    ],
)
def test_default_patterns(name: str, secret: bool) -> None:
    assert knob_live.is_secret(name) is secret


def test_redaction_is_a_stable_hash_and_never_the_value() -> None:
    shown = knob_live.redact_value(TOKEN)
    assert TOKEN not in shown and shown == knob_live.redact_value(TOKEN) and shown.startswith("<secret sha256:")
    assert knob_live.redact_value("other") != shown
    script = f"#!/bin/bash\nexport HF_TOKEN={TOKEN}\nexport A=1\nexec x\n"
    red = knob_live.redact_script(script)
    assert TOKEN not in red and "export A=1\n" in red
    assert knob_live.script_env_argv(red)[0]["HF_TOKEN"] == shown  # the hash survives the reader
    tree = knob_live.redact_tree({"server_args": {"api_key": "k1", "port": 1}, "list": [{"token": "t"}]})
    assert "k1" not in json.dumps(tree) and '"t"' not in json.dumps(tree) and tree["server_args"]["port"] == 1


def test_a_probe_document_leaves_the_host_redacted() -> None:
    doc = {
        "processes": [{"pid": 1, "env": {"HF_TOKEN": TOKEN, "PATH": "/bin"}}],
        "files": {"script": {"content": f"export HF_TOKEN={TOKEN}\n"}},
        "generations": {"current_files": {"serve.sh": {"content": f"export HF_TOKEN={TOKEN}\n"}}},
        "server_info": {"api_key": TOKEN},
    }
    assert TOKEN not in json.dumps(knob_observe.redact(doc, ()))


def test_render_shows_hashes_and_the_rule_compares_them(repo: Path) -> None:
    profile = ProfileStore(repo / "profiles").resolve("ctas512")
    hv = HostVars(host="h", host_env={"HF_TOKEN": TOKEN}, secret_env=("MY_*",))
    r = render_host(profile, hv)
    assert f"export HF_TOKEN={TOKEN}\n" in r.script  # what the engine needs
    assert TOKEN not in r.script_shown and TOKEN not in json.dumps(r.env_shown)
    expected = knob_live.expected_from_files("/s", r.script, "/u", r.unit, lambda b: "x", r.secret)
    assert TOKEN not in json.dumps(expected) and expected["env"]["HF_TOKEN"] == knob_live.redact_value(TOKEN)
    assert hv.secrets(profile.engine) == ["MY_*"] and hv.has_secrets()


def test_a_secret_in_a_profile_is_refused_with_the_fix(profiles_dir: Path) -> None:
    (profiles_dir / "tok.yaml").write_text(f"name: tok\nversion: 1\nextends: default\nenv:\n  HF_TOKEN: {TOKEN}\n")
    with pytest.raises(ProfileError) as info:
        ProfileStore(profiles_dir).resolve("tok")
    assert info.value.problems == [
        "profiles/tok.yaml: env.HF_TOKEN: a secret does not belong in a profile (it would be in git and in every "
        "report); set it in the host vars as knob_serve_host_env.HF_TOKEN, from Ansible Vault or "
        "lookup('env', 'HF_TOKEN')"
    ]


def _inventory(tmp_path: Path, value: str) -> Path:
    inv = tmp_path / "inv"
    (inv / "host_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    h1:\n      ansible_host: 127.0.1.9\n")
    (inv / "host_vars" / "h1.yml").write_text(f"knob_serve_host_env:\n  HF_TOKEN: {value}\n")
    return inv


def test_secret_host_vars_are_never_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))
    (hv,) = load_hosts(_inventory(tmp_path, TOKEN))
    assert hv.host_env["HF_TOKEN"] == TOKEN
    cache = tmp_path / "state" / "cache"
    assert not cache.exists() or TOKEN not in "".join(p.read_text() for p in cache.rglob("*") if p.is_file())


def test_vault_encrypted_vars_decrypt_with_the_users_password_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ansible.parsing.vault import VaultLib, VaultSecret

    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    secret = VaultSecret(b"correct horse")
    blob = VaultLib([("default", secret)]).encrypt(TOKEN, secret).decode()
    value = "!vault |\n" + "".join(f"      {line}\n" for line in blob.splitlines())
    inv = _inventory(tmp_path, value)
    with pytest.raises(InventoryError, match=r"vault-encrypted var cannot be decrypted.*ANSIBLE_VAULT_PASSWORD_FILE"):
        load_hosts(inv)
    pw = tmp_path / "vault.pw"
    pw.write_text("correct horse\n")
    os.chmod(pw, 0o600)
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(pw))
    (hv,) = load_hosts(inv)
    assert hv.host_env["HF_TOKEN"] == TOKEN

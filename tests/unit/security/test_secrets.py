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
from knobfleet.module_utils import knob_live, knob_observe, knob_redact, knob_shell
from knobfleet.profiles.store import ProfileStore
from knobfleet.render import render_host

TOKEN = "hf_ThisIsTheSecretValue123"
KEY = "0123456789abcdef" * 4


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
    assert knob_redact.is_secret(name) is secret


def test_redaction_is_a_keyed_marker_and_never_the_value() -> None:
    shown = knob_redact.redact_value(TOKEN, KEY)
    assert TOKEN not in shown and shown == knob_redact.redact_value(TOKEN, KEY) and shown.startswith("<secret hmac:")
    assert knob_redact.redact_value("other", KEY) != shown
    script = f"#!/bin/bash\nexport HF_TOKEN={TOKEN}\nexport A=1\nexec x\n"
    red = knob_redact.redact_script(script, (), KEY)
    assert TOKEN not in red and "export A=1\n" in red
    assert knob_shell.script_env_argv(red)[0]["HF_TOKEN"] == shown  # the marker survives the reader
    tree = knob_redact.redact_tree({"server_args": {"api_key": "k1", "port": 1}, "list": [{"token": "t"}]})
    assert "k1" not in json.dumps(tree) and '"t"' not in json.dumps(tree) and tree["server_args"]["port"] == 1


def test_a_probe_document_leaves_the_host_redacted() -> None:
    doc = {
        "processes": [{"pid": 1, "env": {"HF_TOKEN": TOKEN, "PATH": "/bin"}}],
        "files": {"script": {"content": f"export HF_TOKEN={TOKEN}\n"}},
        "generations": {"current_files": {"serve.sh": {"content": f"export HF_TOKEN={TOKEN}\n"}}},
        "server_info": {"api_key": TOKEN},
    }
    assert TOKEN not in json.dumps(knob_observe.redact(doc, ()))


def test_render_shows_markers_and_the_rule_compares_them(repo: Path) -> None:
    profile = ProfileStore(repo / "profiles").resolve("ctas512")
    hv = HostVars(host="h", host_env={"HF_TOKEN": TOKEN}, secret_env=("MY_*",))
    r = render_host(profile, hv, secret_key=KEY)
    assert f"export HF_TOKEN={TOKEN}\n" in r.script  # what the engine needs
    assert TOKEN not in r.script_shown and TOKEN not in json.dumps(r.env_shown)
    expected = knob_live.expected_from_files("/s", r.script, "/u", r.unit, lambda b: "x", r.secret, KEY)
    assert TOKEN not in json.dumps(expected) and expected["env"]["HF_TOKEN"] == knob_redact.redact_value(TOKEN, KEY)
    assert "MY_*" in hv.secrets(profile.engine) and hv.has_secrets()


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
    script = tmp_path / "vault-pass.sh"  # an executable password file: run by knobfleet, bounded, same result
    script.write_text("#!/bin/sh\necho 'correct horse'\n")
    os.chmod(script, 0o700)
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(script))
    (hv,) = load_hosts(inv)
    assert hv.host_env["HF_TOKEN"] == TOKEN


# --- secret flags, vault-sourced values, catalogs, history, the fleet key (issue 24) ---------------------------


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ("  api-key: sk-123", "api-key"),
        ("  --api-key: sk-123", "api-key"),
        ("  admin-api-key: sk-123", "admin-api-key"),
        ("  ssl-keyfile-password: pw", "ssl-keyfile-password"),
    ],
)
def test_a_secret_flag_in_a_profile_is_refused_like_a_secret_env_var(profiles_dir: Path, args: str, field: str) -> None:
    (profiles_dir / "key.yaml").write_text(f"name: key\nversion: 1\nextends: default\nargs:\n{args}\n")
    with pytest.raises(ProfileError) as info:
        ProfileStore(profiles_dir).resolve("key")
    (line,) = info.value.problems
    assert line.startswith(f"profiles/key.yaml: args.{field}: a secret does not belong in a profile")
    assert f"knob_serve_host_args.{field}, from Ansible Vault" in line and "sk-123" not in line and "pw" not in line


def test_a_bare_secret_flag_or_a_token_sized_knob_is_not_a_secret_value(profiles_dir: Path) -> None:
    (profiles_dir / "ok.yaml").write_text(
        "name: ok\nversion: 1\nextends: default\nargs:\n  max-total-tokens: 4096\n"
        "  tbo-token-distribution-threshold: 0.5\n"  # the catalog marks it secret: false
    )
    p = ProfileStore(profiles_dir).resolve("ok")
    assert p.args["max-total-tokens"] == 4096 and p.args["tbo-token-distribution-threshold"] == 0.5


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_every_catalog_knob_the_patterns_call_secret_is_decided(engine: str) -> None:
    """A knob whose name matches knobfleet's patterns is marked in the overlay: true (a credential) or false (a
    size or ratio named with the word TOKEN). A catalog sync that adds one fails here until it is decided."""
    from knobfleet.profiles.catalog import catalog_for

    cat = catalog_for(engine)
    undecided = [n for n, k in cat.knobs.items() if k.secret is None and knob_redact.is_secret(n)]
    assert undecided == []
    assert {"api-key"} <= {n for n, k in cat.knobs.items() if k.secret}
    for name in cat.secret_names():
        assert knob_redact.is_secret(name.lstrip("!"), cat.secret_names()) is (not name.startswith("!"))


def test_host_args_secrets_are_shown_as_markers_and_never_cached(repo: Path) -> None:
    profile = ProfileStore(repo / "profiles").resolve("ctas512")
    hv = HostVars(host="h", host_args={"api-key": TOKEN})
    assert hv.has_secrets()
    r = render_host(profile, hv, secret_key=KEY)
    assert f"--api-key={TOKEN}" in r.script
    for shown in (r.script_shown, "\n".join(r.argv_shown), json.dumps(r.env_shown)):
        assert TOKEN not in shown
    assert f"--api-key={knob_redact.redact_value(TOKEN, KEY)}" in r.argv_shown
    assert not HostVars(host="h", host_args={"api-key": True}).has_secrets()  # a bare flag holds no value


def test_a_vault_sourced_value_is_secret_whatever_its_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ansible.parsing.vault import VaultLib, VaultSecret

    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))
    secret = VaultSecret(b"correct horse")
    blob = VaultLib([("default", secret)]).encrypt("plainly-named-value", secret).decode()
    vaulted = "!vault |\n" + "".join(f"      {line}\n" for line in blob.splitlines())
    inv = tmp_path / "inv"
    (inv / "host_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    h1:\n      ansible_host: 127.0.1.9\n")
    (inv / "host_vars" / "h1.yml").write_text(
        f"vault_db: {vaulted}"
        'knob_serve_host_env:\n  DB_URL: "postgres://u:{{ vault_db }}@db"\n  PLAIN: x\n'
        f"knob_serve_host_args:\n  model-name: {vaulted.replace('      ', '        ')}"
    )
    pw = tmp_path / "vault.pw"
    pw.write_text("correct horse\n")
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(pw))
    (hv,) = load_hosts(inv)
    assert hv.host_env["DB_URL"] == "postgres://u:plainly-named-value@db"
    assert {"DB_URL", "model-name"} <= set(hv.secret_env) and "PLAIN" not in hv.secret_env
    assert hv.has_secrets()
    cache = tmp_path / "state" / "cache"
    assert not cache.exists() or "plainly-named-value" not in "".join(
        p.read_text() for p in cache.rglob("*") if p.is_file()
    )


@pytest.mark.parametrize(
    "reason",
    [
        f"verify: argv_mismatch: engine reports api_key=<secret sha256:1> but pid 9 was started with --api-key={TOKEN}",
        f"export HF_TOKEN={TOKEN}",
        f"--admin-api-key {TOKEN} rejected",
    ],
)
def test_history_hides_secrets_an_older_knobfleet_wrote(reason: str) -> None:
    from knobfleet.ops.history import from_probe

    doc = {
        "generations": {
            "current": 1,
            "list": [{"generation": 1, "files": [], "meta": {"status": "failed", "reason": reason}}],
            "ledger": [{"event": "mark", "reason": reason}, {"event": "unreadable", "raw": reason}],
        }
    }
    out = json.dumps(from_probe("h", doc, ["admin-api-key"], KEY).as_json())
    assert TOKEN not in out and "<secret hmac:" in out


def test_the_fleet_key_is_made_once_owner_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from knobfleet.errors import KnobfleetError
    from knobfleet.fleet import fleetkey

    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))
    fleetkey.fleet_key.cache_clear()
    key = fleetkey.fleet_key()
    path = tmp_path / "state" / "secret.key"
    assert len(key) == 64 and path.stat().st_mode & 0o777 == 0o600
    fleetkey.fleet_key.cache_clear()
    assert fleetkey.fleet_key() == key  # the same markers run after run
    os.chmod(path, 0o644)
    fleetkey.fleet_key.cache_clear()
    with pytest.raises(KnobfleetError, match=r"secret.key: .*readable by you only; fix it with chmod 600"):
        fleetkey.fleet_key()
    fleetkey.fleet_key.cache_clear()


def test_the_lab_engine_reports_a_key_as_sglang_does(tmp_path: Path) -> None:
    """The stand-in masks --api-key in its server info, as SGLang does: the live rule compares a secret flag on
    the command line (markers on both sides), never through the engine's report."""
    from knobfleet.lab.sim import launch_server

    assert {"api_key", "admin_api_key"} <= set(launch_server.SECRET_ARGS)
    engine = {"info_args": True}
    argv = ["e", f"--api-key={knob_redact.redact_value(TOKEN, KEY)}", "--tp-size=2"]
    doc = {
        "unit_props": {"ActiveState": "active", "MainPID": "5"},
        "health": 200,
        "processes": [{"pid": 5, "env": {}, "cmdline": list(argv)}],
        "server_info": knob_redact.redact_tree({"api_key": "sha256:abc123", "tp_size": 2}, (), KEY),
    }
    expected = {"files": {}, "env": {}, "argv": argv, "script_known": True, "generation": 1, "profile": {}}
    assert knob_live.evaluate(doc, expected, engine) == []

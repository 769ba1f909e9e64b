"""Secret redaction in the live-state rule's module (module_utils/knob_live.py): which names are secrets, and
how env, engine reports and serve scripts show them — a stable hash, never the value."""

from __future__ import annotations

import hashlib

import pytest

from knobfleet.module_utils.knob_live import (
    is_secret,
    redact_env,
    redact_script,
    redact_tree,
    redact_value,
    script_env_argv,
)


@pytest.mark.parametrize(
    "name", ["HF_TOKEN", "GITHUB_TOKEN", "OPENAI_API_KEY", "API_KEY", "DB_PASSWORD", "PASSWORD", "TOKEN", "X_SECRET"]
)
def test_default_secret_patterns(name: str) -> None:
    assert is_secret(name)


@pytest.mark.parametrize("name", ["SGLANG_SM120_MMA_TARGET_CTAS", "TOKENIZER_PATH", "hf_token", "SECRETS_DIR", "KEY"])
def test_not_secrets(name: str) -> None:
    assert not is_secret(name)


def test_extra_secret_names_and_patterns() -> None:
    assert is_secret("NCCL_IB_HCA_KEY", ["NCCL_*_KEY"]) and is_secret("MY_VAR", ("MY_VAR",))
    assert not is_secret("MY_VAR", ["OTHER"]) and not is_secret("MY_VAR", None)


def test_redacted_value_is_a_short_stable_hash() -> None:
    digest = hashlib.sha256(b"hunter2").hexdigest()[:16]
    assert redact_value("hunter2") == f"<secret sha256:{digest}>"
    assert redact_value("hunter2") == redact_value("hunter2") != redact_value("hunter3")
    assert "hunter2" not in redact_value("hunter2")
    assert redact_value("\udcff").startswith("<secret sha256:")  # surrogate-escaped bytes from /proc


def test_redact_env_hashes_only_secrets() -> None:
    env = {"HF_TOKEN": "abc", "SGLANG_X": "1", "MINE": "s"}
    assert redact_env(env, ["MINE"]) == {"HF_TOKEN": redact_value("abc"), "SGLANG_X": "1", "MINE": redact_value("s")}
    assert redact_env(env)["MINE"] == "s"


def test_redact_tree_hashes_secret_keys_at_any_depth() -> None:
    report = {
        "api_key": "k1",
        "tp_size": 2,
        "empty_token": "",
        "nested": [{"hf_token": "k2", "name": "x"}, "plain"],
        "env": {"MY_PASSWORD": "k3", "OTHER": "v"},
        "password": None,
    }
    assert redact_tree(report) == {
        "api_key": redact_value("k1"),
        "tp_size": 2,
        "empty_token": "",
        "nested": [{"hf_token": redact_value("k2"), "name": "x"}, "plain"],
        "env": {"MY_PASSWORD": redact_value("k3"), "OTHER": "v"},
        "password": None,
    }
    assert redact_tree({"special": "v"}, ["SPECIAL"]) == {"special": redact_value("v")}
    assert redact_tree(["a", 1, None]) == ["a", 1, None]


def test_redact_script_replaces_secret_exports_line_by_line() -> None:
    script = (
        "#!/bin/bash\n"
        "export HF_TOKEN='hf_abc def'\n"
        "export SGLANG_X=1\n"
        "export MINE=s\n"
        "echo export HF_TOKEN=visible\n"
        "exec engine --tp 2\n"
        "export API_KEY=last"
    )
    out = redact_script(script, ["MINE"])
    assert out.splitlines() == [
        "#!/bin/bash",
        f"export HF_TOKEN='{redact_value('hf_abc def')}'",
        "export SGLANG_X=1",
        f"export MINE='{redact_value('s')}'",
        "echo export HF_TOKEN=visible",
        "exec engine --tp 2",
        f"export API_KEY='{redact_value('last')}'",
    ]
    assert not out.endswith("\n") and out.count("\n") == script.count("\n")
    env, argv = script_env_argv(out)
    assert env["HF_TOKEN"] == redact_value("hf_abc def") and argv == ["engine", "--tp", "2"]


def test_a_secret_exported_beside_another_name_is_redacted() -> None:
    assert "hf_secretvalue" not in redact_script("#!/bin/bash\nexport CUDA_HOME=/cuda HF_TOKEN=hf_secretvalue\n")

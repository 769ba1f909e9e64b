"""More of the live-state rule where a slip would go unnoticed: a renamed worker does not end the check of
the processes after it, a process without a name, the did-you-mean threshold, the safe defaults of
actions/refusal, and host-declared secret names at any depth of an engine's report."""

from __future__ import annotations

from typing import Any

import pytest

from knobfleet.module_utils.knob_live import evaluate
from knobfleet.module_utils.knob_redact import redact_script, redact_tree, redact_value
from knobfleet.module_utils.knob_rules import actions, refusal
from knobfleet.module_utils.knob_shell import script_env_argv
from tests.unit.probedocs import probe_doc

ENGINE = {"env_prefixes": ["SGLANG_"], "known_env": ["SGLANG_TARGET_CTAS", "SGLANG_BLOCK_H"]}
MAIN = {"pid": 10, "comm": "python3", "cmdline": ["/bin/e"], "env": {"K": "1"}, "start_epoch": 100.0}
RENAMED = {"pid": 11, "comm": "W", "cmdline": ["W"], "env": {}}
EXPECTED = {"generation": 1, "files": {}, "env": {"K": "1"}, "argv": ["/bin/e"], "script_known": True}


def doc(*procs: dict[str, Any]) -> dict[str, Any]:
    return probe_doc(*procs, files={})


def test_processes_after_a_renamed_worker_are_still_checked() -> None:
    late = {"pid": 12, "comm": "late", "cmdline": ["/bin/e"], "env": {"K": "2"}}
    found = evaluate(doc(MAIN, RENAMED, late), EXPECTED, ENGINE)
    assert [(f["kind"], f["pid"]) for f in found] == [("env_mismatch", 12)]


def test_a_process_without_a_name_is_shown_with_an_empty_one() -> None:
    nameless = {"pid": 12, "cmdline": ["/bin/e", "--x=1"], "env": {}}
    (f,) = evaluate(doc(MAIN, nameless), EXPECTED, ENGINE)
    assert f["message"] == "pid 12 (): K is not set"


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("SGLANG_TARGET_XYZW", "; did you mean SGLANG_TARGET_CTAS?"),  # 0.78 alike
        ("SGLANG_TAR", "; not a knob the engine's catalog knows"),  # 0.71 alike: too far to suggest
    ],
)
def test_a_suggestion_needs_three_quarters_likeness(name: str, hint: str) -> None:
    (f,) = evaluate(doc({**MAIN, "env": {"K": "1", name: "1"}}), EXPECTED, ENGINE)
    assert f["message"].endswith(hint)


def test_without_a_policy_or_break_lock_a_host_is_refused() -> None:
    lock = {"kind": "interrupted_apply", "message": "lock held by x"}
    dropin = {"kind": "dropin_present", "path": "/etc/e.d/a.conf"}
    assert actions([lock]) == ["refuse"] and actions([dropin]) == ["refuse"]
    assert refusal([lock]) == "lock held by x"
    assert refusal([dropin]) is not None


def test_host_declared_secrets_are_hashed_at_any_depth() -> None:
    report = {"top": {"my_cred": "a"}, "list": [{"my_cred": "b"}, [{"MY_CRED": "c"}]], "my_cred": "d"}
    assert redact_tree(report, ["MY_CRED"]) == {
        "top": {"my_cred": redact_value("a")},
        "list": [{"my_cred": redact_value("b")}, [{"MY_CRED": redact_value("c")}]],
        "my_cred": redact_value("d"),
    }


def test_an_export_line_with_a_secret_keeps_its_other_values_exactly() -> None:
    line = '  export CUDA_HOME=/cuda HF_TOKEN=hf_x NOTE="it\'s"\n'  # indented, three names, a quote in a value
    out = redact_script("#!/bin/bash\n" + line + "exec e\n")
    # only the secret word changes: the rest of the line is kept byte for byte
    assert out == f"#!/bin/bash\n  export CUDA_HOME=/cuda HF_TOKEN='{redact_value('hf_x')}' NOTE=\"it's\"\nexec e\n"
    env, _ = script_env_argv(out)
    assert env == {"CUDA_HOME": "/cuda", "HF_TOKEN": redact_value("hf_x"), "NOTE": "it's"}


def test_a_file_skipped_by_the_expectation_does_not_end_the_file_checks() -> None:
    d = doc(MAIN)
    d["files"] = {"unit": {"exists": False, "path": "/u"}}
    expected = {**EXPECTED, "files": {"script": None, "unit": {"path": "/u", "sha256": "u"}}}
    assert [f["kind"] for f in evaluate(d, expected, ENGINE)] == ["file_missing"]


@pytest.mark.parametrize(
    ("want", "have", "diff"), [("", "x\n", "@@ -0,0 +1 @@\n+x\n"), ("x\n", "", "@@ -1 +0,0 @@\n-x\n")]
)
def test_an_empty_file_diffs_as_empty(want: str, have: str, diff: str) -> None:
    d = doc(MAIN)
    d["files"] = {"unit": {"exists": True, "sha256": "u2", "path": "/u", "content": have}}
    expected = {**EXPECTED, "files": {"unit": {"path": "/u", "sha256": "u", "content": want}}}
    (f,) = evaluate(d, expected, ENGINE)
    assert f["diff"] == "--- /u (expected)\n+++ /u (on host)\n" + diff


def test_an_unmanaged_host_locked_by_the_applier_itself_is_not_interrupted() -> None:
    d = {**doc(MAIN), "generations": {"lock": {"run_id": "r1"}, "list": []}}
    assert [f["kind"] for f in evaluate(d, None, ENGINE, run_id="r1")] == ["unmanaged"]
    assert [f["kind"] for f in evaluate(d, None, ENGINE, run_id="r2")] == ["unmanaged", "interrupted_apply"]

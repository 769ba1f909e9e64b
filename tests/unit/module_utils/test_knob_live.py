"""The live-state rule itself (module_utils/knob_live.py), on small hand-made documents: one row per case."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from knobfleet.module_utils import knob_live, knob_running
from knobfleet.module_utils.knob_live import evaluate
from knobfleet.module_utils.knob_rules import RULES, Action, Kind, actions
from tests.unit.probedocs import probe_doc

SGLANG = {"env_prefixes": ["SGLANG_", "SGL_"], "known_env": ["SGLANG_SM120_MMA_TARGET_CTAS"], "info_env": None}
MAIN = {
    "pid": 10,
    "comm": "python3",
    "cmdline": ["/x", "--a=1"],
    "env": {"K": "1", "PATH": "/bin"},
    "start_epoch": 100.0,
}
WORKER = {"pid": 11, "comm": "sglang::schedul", "cmdline": ["/x", "--a=1"], "env": {"K": "1"}, "start_epoch": 101.0}
RENAMED = {"pid": 12, "comm": "VLLM::Worker", "cmdline": ["VLLM::Worker"], "env": {}, "start_epoch": 101.0}


def doc(*procs: dict[str, Any], **props: str) -> dict[str, Any]:
    return probe_doc(*procs, props=props, processes=list(procs))


EXPECTED = {
    "generation": 1,
    "profile": {"name": "p", "version": 1, "hash": "h"},
    "files": {"script": {"path": "/s", "sha256": "s"}, "unit": {"path": "/u", "sha256": "u"}},
    "env": {"K": "1"},
    "argv": ["/x", "--a=1"],
    "script_known": True,
}


def kinds(d: dict[str, Any], expected: dict[str, Any] | None = EXPECTED) -> list[tuple[str, Any]]:
    return [(f["kind"], f.get("pid") or f.get("name") or f.get("path")) for f in evaluate(d, expected, SGLANG)]


@pytest.mark.parametrize(
    ("case", "document", "found"),
    [
        ("in sync", doc(MAIN, WORKER), []),
        ("renamed worker (setproctitle blanked environ) is checked through the main process", doc(MAIN, RENAMED), []),
        ("worker with a stale value", doc(MAIN, {**WORKER, "env": {"K": "0"}}), [("env_mismatch", 11)]),
        ("worker lost the variable but kept argv", doc(MAIN, {**WORKER, "env": {}}), [("env_missing", 11)]),
        ("argv differs", doc({**MAIN, "cmdline": ["/x", "--a=2"]}), [("argv_mismatch", 10)]),
        (
            "engine knob injected",
            doc(MAIN, {**WORKER, "env": {"K": "1", "SGLANG_X": "4"}}),
            [("env_unexpected", 11)],
        ),
        ("stopped", doc(ActiveState="inactive"), [("service_inactive", None)]),
        ("reload pending", doc(MAIN, NeedDaemonReload="yes"), [("daemon_reload_needed", None)]),
        ("drop-in loaded", doc(MAIN, DropInPaths="/etc/x.d/a.conf"), [("dropin_present", "/etc/x.d/a.conf")]),
        (
            "stale process",
            {
                **doc(MAIN),
                "files": {
                    "script": {"exists": True, "sha256": "s", "mtime": 200.0, "path": "/s"},
                    "unit": {"exists": True, "sha256": "u"},
                },
            },
            [("stale_process", 10)],
        ),
    ],
)
def test_rule(case: str, document: dict[str, Any], found: list[tuple[str, Any]]) -> None:
    assert kinds(document) == found, case


def test_an_ignored_engine_variable_is_not_a_finding() -> None:
    d = doc(MAIN, {**WORKER, "env": {"K": "1", "SGLANG_SET_BY_ENGINE": "1"}})
    assert [f["kind"] for f in evaluate(d, EXPECTED, {**SGLANG, "ignore_env": ["SGLANG_SET_BY_ENGINE"]})] == []


def test_a_dropin_on_disk_not_yet_loaded_is_found() -> None:
    d = {**doc(MAIN), "dropins": [{"path": "/etc/x.d/b.conf", "exists": True}]}
    assert kinds(d) == [("dropin_present", "/etc/x.d/b.conf")]


def test_own_run_is_not_an_interrupted_apply() -> None:
    d = doc(MAIN)
    d["generations"]["lock"] = {"run_id": "r1"}
    assert kinds(d) == [("interrupted_apply", "lock")]
    assert [f["kind"] for f in evaluate(d, EXPECTED, SGLANG, run_id="r1")] == []


@pytest.mark.parametrize(
    ("found", "policy", "break_lock", "expected"),
    [
        ([], "fail", False, []),
        (["env_mismatch"], "fail", False, ["restart"]),
        (["file_changed", "env_mismatch"], "fail", False, ["install", "daemon-reload", "restart"]),
        (["service_inactive"], "fail", False, ["start"]),
        (["service_inactive", "file_missing"], "fail", False, ["install", "daemon-reload", "start"]),
        (["daemon_reload_needed"], "fail", False, ["daemon-reload", "restart"]),
        (["dropin_present", "env_unexpected"], "fail", False, ["refuse"]),
        (["dropin_present", "env_unexpected"], "remove", False, ["remove-dropin", "daemon-reload", "restart"]),
        (["interrupted_apply"], "fail", False, ["refuse"]),
        (["interrupted_apply"], "fail", True, ["break-lock"]),
        (["profile_mismatch"], "fail", False, ["install", "daemon-reload", "restart"]),
        (["unmanaged", "file_changed"], "fail", False, ["install", "daemon-reload", "restart"]),
        (["not_ready"], "fail", False, ["restart"]),
    ],
)
def test_actions(found: list[str], policy: str, break_lock: bool, expected: list[str]) -> None:
    assert actions([{"kind": k} for k in found], policy, break_lock) == expected


def test_every_kind_has_a_rule_with_a_repair() -> None:
    assert set(RULES) == set(Kind)
    assert all(r.severity in ("error", "warning") and isinstance(r.action, Action) for r in RULES.values())


def test_the_lexer_exists_once() -> None:
    """The on-host modules import the rule and the readers instead of carrying copies."""
    roles = Path(__file__).parents[3] / "roles"
    for module in roles.glob("*/library/*.py"):
        text = module.read_text()
        assert "def shell_statements" not in text and "def cgroup_pids" not in text, module
    # knob_generation runs the host transaction (module_utils/knob_txn and knob_commit), which imports the rule
    assert "from ansible.module_utils.knob_txn import" in (roles / "knob_serve/library/knob_generation.py").read_text()
    utils = Path(knob_live.__file__).parent
    for txn in ("knob_txn.py", "knob_commit.py"):
        assert "from .knob_live import" in (utils / txn).read_text(), txn
    assert knob_live.script_env_argv("export A=1\nexec a b\n") == ({"A": "1"}, ["a", "b"])


REPORTED = {"server_args": {"tp_size": 2, "disable_overlap_schedule": True}, "sched": {"max_num_seqs": 8}}


@pytest.mark.parametrize(
    ("argv", "report", "mismatched"),
    [
        (["/x", "--tp-size=2", "--disable-overlap-schedule"], REPORTED, []),
        (["/x", "--tp-size=4"], REPORTED, ["tp-size"]),
        (["/x", "--max-num-seqs=8", "--not-reported=1"], REPORTED, []),
        (["/x", "--max-num-seqs=16"], REPORTED, ["max-num-seqs"]),
        (["/x", "--dtype=float32"], {"model_config": {"dtype": "torch.float32"}}, []),  # ignored spelling
    ],
)
def test_the_engines_resolved_arguments_are_checked(argv: list[str], report: Any, mismatched: list[str]) -> None:
    d = doc({**MAIN, "cmdline": argv})
    d["server_info"] = report
    expected = {**EXPECTED, "env": {"K": "1"}, "argv": argv}
    engine = {**SGLANG, "info_args": True, "info_args_ignore": ["dtype"]}
    found = [f for f in evaluate(d, expected, engine) if f.get("source") == "engine"]
    assert [f["name"] for f in found] == mismatched
    assert all(f["kind"] == "argv_mismatch" for f in found)


@pytest.mark.parametrize(
    ("cmdline", "same"),
    [
        (["/v/bin/vllm", "serve", "m"], True),
        (["/v/bin/python", "/v/bin/vllm", "serve", "m"], True),  # #!/v/bin/python
        (["/usr/bin/python3", "-s", "/v/bin/vllm", "serve", "m"], True),  # #!/usr/bin/python3 -s
        (["/v/bin/python", "/v/bin/vllm", "serve", "other"], False),
        (["/v/bin/vllm", "serve"], False),
        (["a", "b", "c", "/v/bin/vllm", "serve", "m"], False),
    ],
)
def test_a_script_launcher_runs_through_its_interpreter(cmdline: list[str], same: bool) -> None:
    assert knob_running.same_command(cmdline, ["/v/bin/vllm", "serve", "m"]) is same


def test_a_large_script_is_still_read_whole(tmp_path: Path) -> None:
    """A serve script far over the old 64 KiB content limit keeps its text in the probe, so env and argv are
    still checked; past the 1 MiB read bound it is truncated and has no hash: a file_changed, never in sync."""
    from knobfleet.module_utils import knob_observe

    big = tmp_path / "serve.sh"
    big.write_text("#!/bin/bash\n" + "# padding\n" * 20_000 + "export A=1\nexec x\n")
    info = knob_observe.file_info(str(big))
    assert knob_live.script_env_argv(info["content"]) == ({"A": "1"}, ["x"])
    huge = tmp_path / "huge.sh"
    huge.write_bytes(b"#" * (2 * 1024 * 1024))
    cut = knob_observe.file_info(str(huge))
    assert cut["truncated"] and cut["sha256"] is None and "content" not in cut

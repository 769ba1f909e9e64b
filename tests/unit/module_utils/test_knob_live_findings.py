"""Every finding of the live-state rule (module_utils/knob_live.evaluate) with the exact text and fields a user
reads in `drift`, `verify` and `plan`: service state, files, stale processes, env (with its hints), the
engine's own reports, locks and half-done generations, the declared profile; and the actions, refusals and
restore verdicts that follow from them."""

from __future__ import annotations

from typing import Any

import pytest

from knobfleet.module_utils import knob_running
from knobfleet.module_utils.knob_live import evaluate
from knobfleet.module_utils.knob_rules import Action, Kind, actions, finding, refusal, restore_ok
from tests.unit.probedocs import probe_doc

ENGINE = {"env_prefixes": ["SGLANG_"], "known_env": ["SGLANG_TARGET_CTAS", "SGLANG_BLOCK_H"], "info_env": None}
ARGV = ["/bin/e", "--tp=2", "--flag"]
MAIN = {"pid": 10, "comm": "python3", "cmdline": ARGV, "env": {"K": "1"}, "start_epoch": 100.0}


def doc(*procs: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return probe_doc(*(procs or [MAIN]), **extra)


def expected(**kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "generation": 1,
        "profile": {"name": "p", "version": 1, "hash": "h"},
        "files": {
            "script": {"path": "/s", "sha256": "s", "content": "a\n"},
            "unit": {"path": "/u", "sha256": "u", "content": "u\n"},
        },
        "env": {"K": "1"},
        "argv": ARGV,
        "script_known": True,
    }
    out.update(kw)
    return out


def test_in_sync_finds_nothing() -> None:
    assert evaluate(doc(), expected(), ENGINE) == []


def test_finding_carries_the_rule_and_drops_empty_fields() -> None:
    assert finding(Kind.ENV_MISMATCH, "m", pid=1, name=None, actual=0) == {
        "kind": "env_mismatch",
        "severity": "error",
        "action": "restart",
        "message": "m",
        "pid": 1,
        "actual": 0,
    }
    assert finding(Kind.DROPIN_PRESENT, "d")["severity"] == "warning"


# --- the service ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("props", "health", "found"),
    [
        (
            {"ActiveState": "inactive", "SubState": "dead"},
            200,
            [
                {
                    "kind": "service_inactive",
                    "message": "e.service is inactive/dead",
                    "expected": "active",
                    "actual": "inactive",
                }
            ],
        ),
        (
            {"ActiveState": "failed", "SubState": "failed"},
            None,
            [
                {
                    "kind": "service_inactive",
                    "message": "e.service is failed/failed",
                    "expected": "active",
                    "actual": "failed",
                }
            ],
        ),
        (
            {},
            503,
            [
                {
                    "kind": "not_ready",
                    "message": "http://127.0.0.1:1/health answered 503",
                    "expected": 200,
                    "actual": 503,
                }
            ],
        ),
        ({}, None, [{"kind": "not_ready", "message": "http://127.0.0.1:1/health answered nothing", "expected": 200}]),
        (
            {"NeedDaemonReload": "yes", "FragmentPath": "/u"},
            200,
            [
                {
                    "kind": "daemon_reload_needed",
                    "message": "unit file changed on disk but systemd was not reloaded",
                    "path": "/u",
                }
            ],
        ),
    ],
)
def test_service_findings(props: dict[str, str], health: int | None, found: list[dict[str, Any]]) -> None:
    got = evaluate(doc(props=props, health=health), expected(), ENGINE)
    assert [{k: v for k, v in f.items() if k not in ("severity", "action")} for f in got] == found


def test_dropins_loaded_and_on_disk_each_once() -> None:
    d = doc(
        props={"DropInPaths": "/etc/e.d/a.conf /etc/e.d/b.conf"},
        dropins=[
            {"path": "/etc/e.d/a.conf", "exists": True},  # loaded: reported once, as loaded
            {"path": "/etc/e.d/c.conf", "exists": True},
            {"path": "/etc/e.d/gone.conf", "exists": False},
        ],
    )
    got = [(f["kind"], f["path"], f["message"]) for f in evaluate(d, expected(), ENGINE)]
    assert got == [
        ("dropin_present", "/etc/e.d/a.conf", "drop-in /etc/e.d/a.conf changes the unit"),
        ("dropin_present", "/etc/e.d/b.conf", "drop-in /etc/e.d/b.conf changes the unit"),
        ("dropin_present", "/etc/e.d/c.conf", "drop-in /etc/e.d/c.conf changes the unit once loaded"),
    ]


@pytest.mark.parametrize(("main_pid", "pid"), [("10", 10), ("", 0), (None, 0), ("x", 0), ("0", 0)])
def test_main_pid(main_pid: str | None, pid: int) -> None:
    assert knob_running.main_pid({"unit_props": {"MainPID": main_pid}}) == pid
    assert knob_running.main_pid({}) == 0


# --- files ----------------------------------------------------------------------------------------------------


def test_a_changed_file_shows_its_diff_against_the_generation() -> None:
    d = doc()
    d["files"]["script"] = {**d["files"]["script"], "sha256": "s2", "content": "b\n"}
    (f,) = evaluate(d, expected(), ENGINE)
    assert f == {
        "kind": "file_changed",
        "severity": "error",
        "action": "install",
        "message": "/s differs from generation 0001",
        "path": "/s",
        "expected": "s",
        "actual": "s2",
        "diff": "--- /s (expected)\n+++ /s (on host)\n@@ -1 +1 @@\n-a\n+b\n",
    }


def test_a_changed_file_against_the_profile_without_content_has_no_diff() -> None:
    d = doc()
    d["files"]["unit"] = {"exists": True, "sha256": "u2", "path": "/u"}
    (f,) = evaluate(d, expected(generation=None), ENGINE)
    assert f["message"] == "/u differs from the profile" and "diff" not in f
    d["files"]["unit"] = {"exists": True, "sha256": "u", "path": "/u", "error": "is a symlink", "content": "u\n"}
    (f,) = evaluate(d, expected(), ENGINE)
    assert f["kind"] == "file_changed" and f["message"] == "/u differs from generation 0001 (is a symlink)"
    assert f["diff"] == ""  # same text: the error, not the content, is the difference


def test_a_missing_file_and_a_file_not_expected() -> None:
    d = doc()
    d["files"]["unit"] = {"exists": False, "path": "/u"}
    (f,) = evaluate(d, expected(), ENGINE)
    assert (f["kind"], f["message"], f["path"]) == ("file_missing", "/u is missing", "/u")
    del d["files"]["unit"]
    (f,) = evaluate(d, expected(), ENGINE)
    assert f["kind"] == "file_missing"
    only_script = expected(files={"script": expected()["files"]["script"], "unit": None})
    assert evaluate(d, only_script, ENGINE) == []


@pytest.mark.parametrize(
    ("mtime", "stale"),
    [(101.0, False), (100.0 + knob_running.STALE_TOLERANCE_S, False), (101.01, True), (5000.0, True)],
)
def test_a_process_older_than_its_files_by_more_than_a_second_is_stale(mtime: float, stale: bool) -> None:
    d = doc()
    d["files"]["unit"]["mtime"] = mtime
    got = evaluate(d, expected(), ENGINE)
    if stale:
        (f,) = got
        assert f == {
            "kind": "stale_process",
            "severity": "error",
            "action": "restart",
            "message": "pid 10 started before /u was last changed; it runs the old contents until restarted",
            "path": "/u",
            "pid": 10,
        }
    else:
        assert got == []


def test_a_missing_file_is_never_stale() -> None:
    d = doc()
    d["files"]["script"] = {"exists": False, "mtime": 9999.0, "path": "/s"}
    assert [f["kind"] for f in evaluate(d, expected(), ENGINE)] == ["file_missing"]


# --- env ------------------------------------------------------------------------------------------------------


def test_env_findings_name_the_process_and_the_values() -> None:
    worker = {"pid": 11, "comm": "sched", "cmdline": ARGV, "env": {"K": "2", "SGLANG_TARGET_CTAS": "5"}}
    lost = {"pid": 12, "comm": "w", "cmdline": ARGV, "env": {"OTHER": "1"}}
    got = evaluate(doc(MAIN, worker, lost), expected(), ENGINE)
    assert [(f["kind"], f["message"]) for f in got] == [
        ("env_mismatch", "pid 11 (sched): K=2, expected 1"),
        (
            "env_unexpected",
            "pid 11 (sched): SGLANG_TARGET_CTAS=5 is set but not in the profile; a known knob the profile does not set",
        ),
        ("env_missing", "pid 12 (w): K is not set"),
    ]
    assert {k: got[0][k] for k in ("pid", "name", "expected", "actual", "source")} == {
        "pid": 11,
        "name": "K",
        "expected": "1",
        "actual": "2",
        "source": "proc",
    }
    assert {k: got[1][k] for k in ("pid", "name", "actual")} == {"pid": 11, "name": "SGLANG_TARGET_CTAS", "actual": "5"}
    assert "expected" not in got[1]
    assert {k: got[2][k] for k in ("pid", "name", "expected")} == {"pid": 12, "name": "K", "expected": "1"}


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("SGLANG_TARGET_CTAZ", "; did you mean SGLANG_TARGET_CTAS?"),
        ("SGLANG_ZZZ", "; not a knob the engine's catalog knows"),
        ("SGLANG_BLOCK_H", "; a known knob the profile does not set"),
    ],
)
def test_an_unexpected_engine_variable_gets_a_hint(name: str, hint: str) -> None:
    main = {**MAIN, "env": {"K": "1", name: "7"}}
    (f,) = evaluate(doc(main), expected(), ENGINE)
    assert f["message"] == f"pid 10 (python3): {name}=7 is set but not in the profile{hint}"


def test_only_the_engines_prefixes_outside_the_profile_and_ignore_list_are_unexpected() -> None:
    main = {**MAIN, "env": {"K": "1", "SGLANG_SET": "1", "NCCL_X": "1", "SGLANG_OWN": "1", "PATH": "/bin"}}
    got = evaluate(doc(main), expected(env={"K": "1", "SGLANG_OWN": "1"}), {**ENGINE, "ignore_env": ["SGLANG_SET"]})
    assert got == []
    assert evaluate(doc(main), expected(), {**ENGINE, "env_prefixes": []}) == []  # no prefixes: nothing to judge
    got = evaluate(doc(main), expected(), {**ENGINE, "env_prefixes": ["SGLANG_", "NCCL_"]})
    assert [f["name"] for f in got] == ["NCCL_X", "SGLANG_OWN", "SGLANG_SET"]


def test_a_renamed_worker_is_skipped_only_when_it_shows_nothing_of_the_profile() -> None:
    renamed = {"pid": 12, "comm": "W", "cmdline": ["W", "", ""], "env": {}}
    assert evaluate(doc(MAIN, renamed), expected(), ENGINE) == []
    # two words left on its command line: not a title, a process that lost the env
    two = {**renamed, "cmdline": ["W", "x"]}
    assert [f["kind"] for f in evaluate(doc(MAIN, two), expected(), ENGINE)] == ["env_missing"]
    # one of the profile's variables still there: checked
    partial = {**renamed, "env": {"K": "9"}}
    assert [f["kind"] for f in evaluate(doc(MAIN, partial), expected(), ENGINE)] == ["env_mismatch"]
    # the main process is never skipped, whatever its title
    main_renamed = {**MAIN, "cmdline": ["W"], "env": {}}
    kinds = [f["kind"] for f in evaluate(doc(main_renamed), expected(), ENGINE)]
    assert kinds == ["env_missing", "argv_mismatch"]
    # a profile without env has no variables to look for: every process is checked
    assert evaluate(doc(MAIN, renamed), expected(env={}), ENGINE) == []
    assert knob_running._renamed(renamed, 10, {}) is False


def test_an_unknown_script_checks_no_env_and_no_argv() -> None:
    main = {**MAIN, "env": {}, "cmdline": ["/other"]}
    assert evaluate(doc(main), expected(script_known=False), ENGINE) == []
    assert evaluate(doc(main, processes=[]), expected(), ENGINE) == []  # no processes: nothing to compare


def test_argv_mismatch_names_the_generation_or_the_profile() -> None:
    main = {**MAIN, "cmdline": ["/bin/e", "--tp=4"]}
    (f,) = evaluate(doc(main), expected(), ENGINE)
    assert f == {
        "kind": "argv_mismatch",
        "severity": "error",
        "action": "restart",
        "message": "pid 10: command line differs from the generation 0001's exec line",
        "pid": 10,
        "expected": ARGV,
        "actual": ["/bin/e", "--tp=4"],
    }
    (f,) = evaluate(doc(main), expected(generation=None), ENGINE)
    assert f["message"] == "pid 10: command line differs from the profile's exec line"
    assert evaluate(doc(main), expected(argv=[]), ENGINE) == []  # no exec line known: nothing to compare


# --- the engine's own reports ---------------------------------------------------------------------------------

INFO_ENGINE = {**ENGINE, "info_env": ["internal_states", 0, "env_vars"]}


@pytest.mark.parametrize(
    ("info", "mismatched"),
    [
        ({"internal_states": [{"env_vars": {"K": "1"}}]}, []),
        ({"internal_states": [{"env_vars": {"K": "2", "A": "x"}}]}, ["A", "K"]),
        ({"internal_states": [{"env_vars": "not a mapping"}]}, []),
        ({"internal_states": []}, []),
        ({"internal_states": {"0": {}}}, []),
        ({"other": 1}, []),
        (["not", "a", "dict"], []),
    ],
)
def test_the_engines_env_report_against_proc(info: Any, mismatched: list[str]) -> None:
    got = evaluate(doc(server_info=info), expected(), INFO_ENGINE)
    assert [f["name"] for f in got] == mismatched
    assert all(f["kind"] == "env_mismatch" and f["source"] == "engine" for f in got)


def test_an_engine_env_mismatch_reads_both_sides() -> None:
    (f,) = evaluate(doc(server_info={"internal_states": [{"env_vars": {"K": "2"}}]}), expected(), INFO_ENGINE)
    assert f["message"] == "engine reports K=2 but /proc/10/environ has '1'"
    assert (f["pid"], f["expected"], f["actual"]) == (10, "1", "2")
    (f,) = evaluate(doc(server_info={"internal_states": [{"env_vars": {"Q": "2"}}]}), expected(), INFO_ENGINE)
    assert f["message"] == "engine reports Q=2 but /proc/10/environ has None" and "expected" not in f


@pytest.mark.parametrize("path", [["e", -1], ["e", 1], ["e", -2]])
def test_list_steps_of_the_info_path_count_from_either_end(path: list[str | int]) -> None:
    info = {"e": [{"K": "0"}, {"K": "2"}]}
    got = evaluate(doc(server_info=info), expected(), {**ENGINE, "info_env": path})
    assert [f["actual"] for f in got] == (["0"] if path[1] == -2 else ["2"])


@pytest.mark.parametrize("path", [["e", 2], ["e", -3], ["e", "0"], ["e", 0, 0], [], None])
def test_an_info_path_that_does_not_fit_the_report_checks_nothing(path: list[str | int] | None) -> None:
    info = {"e": [{"K": "0"}, {"K": "2"}]}
    assert evaluate(doc(server_info=info), expected(), {**ENGINE, "info_env": path}) == []


ARGS_ENGINE = {**ENGINE, "info_args": True, "info_args_ignore": ["dtype"]}


@pytest.mark.parametrize(
    ("flag", "reported", "same"),
    [
        ("--tp=2", 2, True),
        ("--tp=2", 2.0, True),
        ("--tp=2", "2", True),
        ("--tp=2", 3, False),
        ("--tp=two", 2, False),
        ("--tp=2.50", 2.5, True),
        ("--flag", True, True),
        ("--flag=1", True, True),
        ("--flag=TRUE", True, True),
        ("--flag", False, False),
        ("--flag=false", False, True),
        ("--flag=0", False, True),
        ("--flag=no", False, False),
        ("--tp=x", "x", True),
        ("--tp=x", "y", False),
    ],
)
def test_an_engine_argument_report_compares_as_the_engine_typed_it(flag: str, reported: Any, same: bool) -> None:
    argv = ["/bin/e", flag]
    name = flag[2:].partition("=")[0]
    d = doc({**MAIN, "cmdline": argv}, server_info={"args": {name: reported}})
    got = evaluate(d, expected(argv=argv), ARGS_ENGINE)
    assert [f["kind"] for f in got] == ([] if same else ["argv_mismatch"])


def test_an_engine_argument_mismatch_reads_both_sides() -> None:
    argv = ["/bin/e", "--max-num-seqs=8", "--dtype=half"]
    info = {"config": {"max_num_seqs": 16, "dtype": "torch.float16"}}
    (f,) = evaluate(doc({**MAIN, "cmdline": argv}, server_info=info), expected(argv=argv), ARGS_ENGINE)
    assert f == {
        "kind": "argv_mismatch",
        "severity": "error",
        "action": "restart",
        "message": "engine reports max_num_seqs=16 but pid 10 was started with --max-num-seqs 8",
        "pid": 10,
        "name": "max-num-seqs",
        "expected": "8",
        "actual": 16,
        "source": "engine",
    }


def test_engine_argument_reports_are_read_only_where_they_can_be_trusted() -> None:
    argv = ["/bin/e", "--tp=2"]
    bad = {"args": {"tp": 4}}
    assert evaluate(doc({**MAIN, "cmdline": argv}, server_info=bad), expected(argv=argv), ENGINE) == []  # no info_args
    no_info = doc({**MAIN, "cmdline": argv}, server_info=None)
    assert evaluate(no_info, expected(argv=argv), ARGS_ENGINE) == []
    for value in ({"nested": 4}, [4], None):  # not a scalar: not comparable
        d = doc({**MAIN, "cmdline": argv}, server_info={"args": {"tp": value}})
        assert evaluate(d, expected(argv=argv), ARGS_ENGINE) == []
    # started with other arguments: that is the argv mismatch, the engine's report is not read
    d = doc({**MAIN, "cmdline": ["/bin/e", "--tp=3"]}, server_info=bad)
    assert [f.get("source") for f in evaluate(d, expected(argv=argv), ARGS_ENGINE)] == [None]


def test_the_shallowest_report_of_an_argument_wins() -> None:
    tree = {"a": {"b": {"tp": 1}}, "c": {"tp": 2}, "tp_other": 3}
    assert knob_running._find_key(tree, "tp") == (True, 2)
    assert knob_running._find_key({"x": {"tp": 1}, "tp": 0}, "tp") == (True, 0)
    assert knob_running._find_key([[{"tp": 5}]], "tp") == (True, 5)
    deep: Any = {"tp": 6}
    for _ in range(5):
        deep = {"d": deep}
    assert knob_running._find_key(deep, "tp") == (True, 6)  # six levels down
    assert knob_running._find_key({"d": deep}, "tp") == (False, None)  # seven: too deep to be the engine's
    assert knob_running._find_key({"a": "tp", "b": ["tp"]}, "tp") == (False, None)


@pytest.mark.parametrize(
    ("argv", "flags"),
    [
        (  # without the engine's flag table: "--" ends the options, as argparse reads it; -e is a word
            ["/bin/e", "--a=1", "--b", "--c=x=y", "--d=", "-e", "--", "f", "--A=2"],
            {"a": "1", "b": "true", "c": "x=y", "d": ""},
        ),
        (["/bin/e", "--b", "-e", "--n", "-1"], {"b": "-e", "n": "-1"}),
        (
            ["/bin/e", "--host", "127.0.1.2", "--port", "30000", "--tp", "2"],
            {"host": "127.0.1.2", "port": "30000", "tp": "2"},
        ),
        (["--a=1", "--a=2"], {"a": "2"}),
        ([], {}),
    ],
)
def test_flags_of(argv: list[str], flags: dict[str, str]) -> None:
    assert knob_running.flags_of(argv) == flags


# --- locks and half-done generations --------------------------------------------------------------------------


def test_a_lock_held_by_another_run() -> None:
    d = doc()
    d["generations"]["lock"] = {"run_id": "r9", "operator": "ann", "since": "12:00", "controller": "ctl"}
    (f,) = evaluate(d, expected(), ENGINE, run_id="r1")
    assert f == {
        "kind": "interrupted_apply",
        "severity": "error",
        "action": "refuse",
        "message": "lock held by ann (run r9) since 12:00 from ctl: an apply is running, or was killed; if it is "
        "gone, re-run apply with --break-lock",
        "name": "lock",
        "actual": "r9",
    }


def test_an_unreadable_lock() -> None:
    """Reported to every reader: drift, verify and plan have no run of their own, and a lock nobody can read
    is nobody's."""
    d = doc()
    d["generations"]["lock"] = {"corrupt": "not JSON"}
    (f,) = evaluate(d, expected(), ENGINE)
    assert f["message"].startswith("the host lock is unreadable (not JSON): an apply is running")
    assert f["actual"] == "not JSON"
    d["generations"]["lock"] = "garbage"  # not even a mapping: held by nobody we can name
    (f,) = evaluate(d, expected(), ENGINE, run_id="r1")
    assert f["message"].startswith("lock held by None (run None) since None from None:") and "actual" not in f


def test_a_generation_left_installing_by_another_run() -> None:
    d = doc()
    d["generations"]["list"] = [
        {"generation": 4, "meta": {"status": "installing", "run_id": "r9"}},
        {"generation": 5, "meta": {"status": "installing", "run_id": "r1"}},  # the applier's own
        {"generation": 6, "meta": {"status": "good", "run_id": "r8"}},
        {"generation": 7, "meta": None},
        "junk",
    ]
    (f,) = evaluate(d, expected(), ENGINE, run_id="r1")
    assert f["message"] == (
        "generation 0004 was left 'installing' by run r9; the next apply with --break-lock marks it interrupted"
    )
    assert (f["name"], f["actual"]) == ("generation", 4)


# --- unmanaged hosts and the declared profile -----------------------------------------------------------------


def test_an_unmanaged_host_with_and_without_files() -> None:
    (f,) = evaluate(doc(), None, ENGINE)
    assert f["kind"] == "unmanaged" and f["path"] == "/s"
    assert f["message"] == "files present but never applied by knobfleet: /s, /u"
    d = doc()
    d["files"] = {"script": {"exists": False}, "unit": {"exists": False}}
    (f,) = evaluate(d, None, ENGINE)
    assert f["message"] == "no knobfleet generation and no serve files on this host" and "path" not in f
    d["generations"]["lock"] = {"run_id": "r9"}
    assert [f["kind"] for f in evaluate(d, None, ENGINE)] == ["unmanaged", "interrupted_apply"]


def test_adopted_files_are_unmanaged_but_still_checked() -> None:
    d = doc({**MAIN, "env": {}})
    got = evaluate(d, expected(managed=False), ENGINE)
    assert [f["kind"] for f in got] == ["unmanaged", "env_missing"]


@pytest.mark.parametrize(
    ("declared", "mismatch"),
    [
        ({"name": "p", "version": 1, "hash": "h"}, False),
        ({"name": "p", "version": 1, "hash": "h2"}, True),
        ({"name": "p", "version": 2, "hash": "h"}, True),
        ({"name": "q", "version": 1, "hash": "h"}, True),
        (None, False),
    ],
)
def test_the_declared_profile(declared: dict[str, Any] | None, mismatch: bool) -> None:
    got = evaluate(doc(), expected(), ENGINE, declared=declared)
    if not mismatch:
        assert got == []
        return
    assert declared is not None
    (f,) = got
    assert f == {
        "kind": "profile_mismatch",
        "severity": "warning",
        "action": "install",
        "message": f"runs p@1, inventory declares {declared['name']}@{declared['version']}",
        "name": "knob_profile",
        "expected": f"{declared['name']}@{declared['version']} {declared['hash']}",
        "actual": "p@1 h",
    }


def test_a_generation_without_a_profile_is_never_a_mismatch() -> None:
    assert evaluate(doc(), expected(profile=None), ENGINE, declared={"name": "q", "version": 1, "hash": "x"}) == []


# --- what apply does about them -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("found", "policy", "break_lock", "expected_actions"),
    [
        (["env_unexpected", "stale_process"], "fail", False, ["restart"]),
        (["daemon_reload_needed", "service_inactive"], "fail", False, ["daemon-reload", "start"]),
        (["not_ready", "service_inactive"], "fail", False, ["start"]),
        (["interrupted_apply", "env_mismatch"], "fail", True, ["break-lock", "restart"]),
        (["interrupted_apply", "file_changed"], "remove", True, ["break-lock", "install", "daemon-reload", "restart"]),
        (["dropin_present"], "remove", False, ["remove-dropin", "daemon-reload", "restart"]),
        (["dropin_present", "service_inactive"], "remove", False, ["remove-dropin", "daemon-reload", "start"]),
        (["dropin_present"], "FAIL", False, ["refuse"]),
        (["env_mismatch", "interrupted_apply"], "remove", False, ["refuse"]),
        (["unmanaged"], "fail", False, ["install", "daemon-reload", "restart"]),
    ],
)
def test_more_actions(found: list[str], policy: str, break_lock: bool, expected_actions: list[str]) -> None:
    assert actions([{"kind": k} for k in found], policy, break_lock) == expected_actions


def test_refusal_says_why() -> None:
    dropin = {"kind": "dropin_present", "path": "/etc/e.d/a.conf"}
    lock = {"kind": "interrupted_apply", "message": "lock held by x"}
    assert refusal([dropin]) == (
        "foreign drop-in /etc/e.d/a.conf changes the unit; remove it, or set knob_serve_foreign_dropins: remove "
        "(--foreign-dropins remove) to move it into the new generation's backup"
    )
    assert refusal([dropin], "remove") is None
    assert refusal([{"kind": "env_mismatch"}, lock]) == "lock held by x"
    assert refusal([lock], break_lock=True) is None
    assert refusal([dropin, lock], "remove") == "lock held by x"
    assert refusal([]) is None


def test_restore_ok_keeps_only_what_a_restored_generation_must_not_show() -> None:
    found = [{"kind": k.value} for k in Kind]
    assert [f["kind"] for f in restore_ok(found)] == [
        k.value
        for k in Kind
        if k not in (Kind.DROPIN_PRESENT, Kind.ENV_UNEXPECTED, Kind.PROFILE_MISMATCH, Kind.RESTART_POLICY)
    ]
    assert restore_ok([]) == []


@pytest.mark.parametrize("member", [*Kind, *Action])
def test_kinds_and_actions_print_as_their_values(member: Kind | Action) -> None:
    assert str(member) == member.value
    assert f"{member}" == member.value and "{}".format(member) == member.value  # noqa: UP032
    assert f"{member:>20}" == f"{member.value:>20}" and f"{member:<20}|" == f"{member.value:<20}|"

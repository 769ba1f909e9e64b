"""knob_generation's composite actions, in-process: ``install`` (begin + stage + commit in one module call) and
``finish`` (mark good + release), which the knob_serve role uses to save SSH round trips per host."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from knobfleet.module_utils import knob_commit, knob_txn
from tests.unit.roles.test_knob_generation import Failed, FakeModule, Host, profile, script, unit


@pytest.fixture(autouse=True)
def no_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(knob_commit, "validate_staged", lambda module, kind, path, script_path: None)


@pytest.fixture
def host(tmp_path: Path) -> Host:
    h = Host(tmp_path)
    h.hand_written()
    return h


def install(h: Host, n: int, module: FakeModule | None = None, **kw: Any) -> dict[str, Any]:
    p = h.params("install", script_content=script(n), unit_content=unit(n), profile=profile(n), **kw)
    result: dict[str, Any] = knob_txn.HANDLERS["install"](module or FakeModule(), h.store, p)
    return result


def finish(h: Host, generation: int | None, **kw: Any) -> dict[str, Any]:
    p = h.params("finish", generation=generation, status="good", **kw)
    result: dict[str, Any] = knob_txn.HANDLERS["finish"](FakeModule(), h.store, p)
    return result


def test_install_takes_the_lock_adopts_stages_and_commits_in_one_call(host: Host) -> None:
    res = install(host, 5)
    assert list(res["steps"]) == ["begin", "stage", "commit"] and res["changed"]
    assert res["steps"]["begin"]["adopted"] and res["steps"]["begin"]["locked"]
    assert res["steps"]["stage"]["staged"] == ["script", "unit"]
    commit = res["steps"]["commit"]
    assert (commit["previous"], commit["generation"]) == (0, 1)
    assert host.script.read_text() == script(5) and host.current() == "generations/0001"
    assert host.meta(1)["status"] == "installing"
    assert host.store.lock and Path(host.store.lock).exists()  # held until finish


def test_finish_marks_good_and_releases(host: Host) -> None:
    install(host, 5)
    res = finish(host, 1)
    assert list(res["steps"]) == ["mark", "release"] and res["steps"]["release"]["released"]
    assert host.meta(1)["status"] == "good" and not Path(host.store.lock).exists()


def test_finish_without_a_new_generation_only_releases(host: Host) -> None:
    install(host, 5)
    finish(host, 1)
    again = install(host, 5, run_id="run-2")
    assert again["steps"]["commit"]["changed"] is False  # same files, same profile: nothing to install
    res = finish(host, None, run_id="run-2")
    assert list(res["steps"]) == ["release"] and not Path(host.store.lock).exists()
    assert host.meta(1)["status"] == "good"


def test_install_in_check_mode_stages_a_diff_and_commits_nothing(host: Host) -> None:
    install(host, 5)
    finish(host, 1)
    res = install(host, 6, FakeModule(check_mode=True, diff=True), run_id="run-2")
    assert list(res["steps"]) == ["begin", "stage"]  # no commit in check mode
    (script_diff,) = [d for d in res["diff"] if d["before_header"] == str(host.script)]
    assert "CTAS=5" in script_diff["before"] and "CTAS=6" in script_diff["after"]
    assert host.script.read_text() == script(5) and host.current() == "generations/0001"
    assert not Path(host.store.lock).exists()  # check mode takes no lock


def test_a_held_lock_fails_install_in_begin_with_nothing_after_it(host: Host) -> None:
    install(host, 5)  # run-1 holds the lock
    with pytest.raises(Failed) as err:
        install(host, 6, run_id="run-2")
    r = err.value.result
    assert r["failed_step"] == "begin" and r["lock_held"] and r["steps"] == {}
    assert "locked by alice (run run-1)" in r["msg"]
    assert host.script.read_text() == script(5)


def test_a_failing_stage_reports_begin_so_the_role_releases_the_lock(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    def reject(module: Any, kind: str, path: str, script_path: str) -> None:
        module.fail_json(msg="bash -n rejected the staged script: line 1")

    monkeypatch.setattr(knob_commit, "validate_staged", reject)
    with pytest.raises(Failed) as err:
        install(host, 5)
    r = err.value.result
    assert r["failed_step"] == "stage" and list(r["steps"]) == ["begin"] and r["steps"]["begin"]["locked"]
    assert host.script.read_text().startswith("#!/bin/bash\nexport CTAS=256")  # the hand-written one
    assert host.current() == "generations/0000"


def test_install_and_finish_through_main_as_the_role_calls_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The role's two calls through main() with Ansible's real AnsibleModule: the argument spec accepts them,
    the result names the step, each step's result is under steps, and a failure names the step that failed."""
    from tests.unit.roles import test_knob_generation_module as tm

    monkeypatch.setattr(knob_commit, "validate_staged", lambda module, kind, path, script_path: None)
    h = tm.Host(tmp_path, capsys)
    rc, res = h.run("install", script_content=tm.SCRIPT, unit_content=tm.UNIT, profile=tm.PROFILE)
    assert rc == 0 and res["step"] == "install" and list(res["steps"]) == ["begin", "stage", "commit"]
    assert res["steps"]["commit"]["generation"] == 1 and res["changed"]
    rc, other = h.run("install", script_content=tm.SCRIPT, unit_content=tm.UNIT, profile=tm.PROFILE, run_id="r2")
    assert rc == 1 and other["step"] == "install" and other["failed_step"] == "begin" and other["lock_held"]
    rc, res = h.run("finish", generation=1, status="good")
    assert rc == 0 and res["step"] == "finish" and res["steps"]["release"]["released"]
    assert h.meta(1)["status"] == "good"
    rc, res = h.run("install", script_content=tm.SCRIPT, unit_content=tm.UNIT)  # no profile: the spec says so
    assert rc == 1 and "profile" in res["msg"]

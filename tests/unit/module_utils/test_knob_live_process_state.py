"""A hung engine is a finding: a process of the unit stopped (T, t) or a zombie (Z), and verify's liveness
witness (a one-token completion) that did not finish though the health check answers; plus the engine's own
report of its arguments read with the engine's argv rules (a hand-written ``--host 127.0.1.2`` is a value)."""

from __future__ import annotations

from typing import Any

import pytest

from knobfleet.engines.adapter import engine
from knobfleet.module_utils.knob_live import evaluate
from knobfleet.module_utils.knob_rules import actions, restore_ok
from tests.unit.module_utils.test_knob_live_findings import ENGINE, MAIN, doc, expected

WORKER = {"pid": 11, "comm": "VLLM::Worker", "cmdline": ["VLLM::Worker", ""], "env": {}, "start_epoch": 100.0}


@pytest.mark.parametrize(
    ("state", "shown"),
    [("T", "stopped"), ("t", "stopped by a tracer"), ("Z", "a zombie")],
)
def test_a_stopped_or_zombie_process_is_a_finding(state: str, shown: str) -> None:
    d = doc(dict(MAIN, state="S"), dict(WORKER, state=state))
    (f,) = evaluate(d, expected(), ENGINE)
    assert f == {
        "kind": "process_stopped",
        "severity": "error",
        "action": "restart",
        "message": f"pid 11 (VLLM::Worker) is {shown} (state {state}): the engine hangs until it is restarted",
        "pid": 11,
        "name": "VLLM::Worker",
        "expected": "running",
        "actual": state,
    }
    assert actions([f]) == ["restart"]
    assert restore_ok([f]) == [f]  # a restored generation with a hung engine does not verify


@pytest.mark.parametrize("state", ["R", "S", "D", "I", None])
def test_running_sleeping_or_unknown_states_are_fine(state: str | None) -> None:
    assert evaluate(doc(dict(MAIN, state=state), dict(WORKER, state=state)), expected(), ENGINE) == []


def test_an_unmanaged_hung_engine_is_named_too() -> None:
    kinds = [f["kind"] for f in evaluate(doc(dict(MAIN, state="T")), None, ENGINE)]
    assert kinds == ["process_stopped", "unmanaged"]


@pytest.mark.parametrize(
    ("liveness", "message"),
    [
        (
            {"url": "http://h:8000/v1/completions", "status": None, "timeout_s": 10.0},
            "e.service answers its health check, but a one-token completion at http://h:8000/v1/completions "
            "did not finish within 10.0 s",
        ),
        (
            {"url": "http://h:8000/v1/completions", "status": 500, "timeout_s": 10.0},
            "e.service answers its health check, but a one-token completion at http://h:8000/v1/completions "
            "answered 500",
        ),
    ],
)
def test_a_completion_that_does_not_finish_is_not_ready(liveness: dict[str, Any], message: str) -> None:
    (f,) = evaluate(doc(liveness=liveness), expected(), ENGINE)
    assert (f["kind"], f["message"], f["source"], f["action"]) == ("not_ready", message, "liveness", "restart")


def test_a_finished_completion_or_none_is_no_finding() -> None:
    assert evaluate(doc(liveness={"url": "u", "status": 200, "timeout_s": 1.0}), expected(), ENGINE) == []
    # a health check that already fails is one not_ready, not two
    kinds = [f["kind"] for f in evaluate(doc(health=503, liveness={"status": None}), expected(), ENGINE)]
    assert kinds == ["not_ready"]


HAND = ["/usr/bin/python3", "-m", "sglang_sim.launch_server", "--model-path", "/models/m", "--host", "127.0.1.2"]
HAND += ["--port", "30000", "--tp", "2", "--trust-remote-code"]


@pytest.mark.parametrize(
    ("report", "mismatched"),
    [
        ({"model_path": "/models/m", "host": "127.0.1.2", "port": 30000, "tp_size": 2, "trust_remote_code": True}, []),
        (
            {"host": "127.0.1.2", "port": 30000, "tp_size": 4},
            ["engine reports tp_size=4 but pid 10 was started with --tp 2"],
        ),
        (
            {"trust_remote_code": False},
            ["engine reports trust_remote_code=False but pid 10 was started with --trust-remote-code"],
        ),
    ],
)
def test_a_hand_written_space_separated_script_reads_as_the_engine_reads_it(
    report: dict[str, Any], mismatched: list[str]
) -> None:
    """Rollback to an adopted hand-written script (issue: "engine reports host=127.0.1.2 but pid 844 was started
    with --host=true"): its flags are read with the engine's arity, so only a real difference is a finding."""
    d = doc(dict(MAIN, cmdline=HAND), server_info=report)
    rules = {**engine("sglang").rules(), "info_env": None}
    found = evaluate(d, expected(argv=HAND, env={"K": "1"}), rules)
    assert [f["message"] for f in found if f.get("source") == "engine"] == mismatched

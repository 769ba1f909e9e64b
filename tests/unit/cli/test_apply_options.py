"""``apply`` / ``apply-profile`` / ``plan`` on the command line: the Options that reach the apply use case
(ops/apply.py ``apply``, faked at its module) for each option and its default, the confirmation rule, and the
gate's verdict in the exit code."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from knobfleet import cli
from knobfleet.errors import EXIT_OK, EXIT_USAGE
from knobfleet.fleet import probe
from knobfleet.ops import apply as apply_use_case

REPO = Path(__file__).resolve().parents[3]
INV = str(REPO / "inventories" / "lab")


@dataclass
class FakeReport:
    exit_code: int = 0
    hosts: list[str] = field(default_factory=list)
    gates: list[Any] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        gate = {"gate": [g.as_json() for g in self.gates]} if self.gates else {}
        return {"hosts": self.hosts, "exit_code": self.exit_code, **gate}


@pytest.fixture
def applied(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    def apply(profile: Any, hosts: list[Any], inventory: Path, opts: Any, on_event: Any = None) -> FakeReport:
        calls.append({"profile": profile.name, "hosts": [h.host for h in hosts], "inventory": inventory, "opts": opts})
        return FakeReport(0, [h.host for h in hosts])

    monkeypatch.setattr(apply_use_case, "apply", apply)
    monkeypatch.setattr(probe, "warm_up", lambda *a, **kw: None)  # no speculative probes of a lab
    return calls


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.run(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


DEFAULTS: dict[str, Any] = {
    "check": False,
    "serial": None,
    "canary": False,
    "max_fail_percent": 0.0,
    "break_lock": False,
    "rollback_fleet": False,
    "via": "auto",
    "foreign_dropins": None,
    "overrides": {},
}


@pytest.mark.parametrize("command", ["apply", "apply-profile"])
def test_apply_defaults(
    capsys: pytest.CaptureFixture[str], applied: list[dict[str, Any]], command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KNOBFLEET_VIA", raising=False)
    code, out, _ = run(capsys, command, "ctas512", "-i", INV, "--limit", "lab1", "--yes", "--json")
    assert code == EXIT_OK and json.loads(out) == {"hosts": ["lab1"], "exit_code": 0}
    (c,) = applied
    assert (c["profile"], c["hosts"], c["inventory"].inventory) == ("ctas512", ["lab1"], Path(INV))  # a Hosts door
    assert {k: getattr(c["opts"], k) for k in DEFAULTS} == DEFAULTS


@pytest.mark.parametrize(
    ("argv", "changed"),
    [
        (["--serial", "25%"], {"serial": "25%"}),
        (["--canary"], {"canary": True}),
        (["--max-fail-percent", "10"], {"max_fail_percent": 10.0}),
        (["--break-lock"], {"break_lock": True}),
        (["--rollback-fleet"], {"rollback_fleet": True}),
        (["--via", "ansible"], {"via": "ansible"}),
        (["--foreign-dropins", "remove"], {"foreign_dropins": "remove"}),
        (["--foreign-dropins", "fail"], {"foreign_dropins": "fail"}),
        (["--readiness-timeout", "90"], {"overrides": {"knob_serve_readiness_timeout_s": 90}}),
        (["--grace", "5"], {"overrides": {"knob_serve_readiness_grace_s": 5}}),
        (
            ["--grace", "0", "--readiness-timeout", "1"],  # a 0 grace still reaches the role (0 timeouts are refused)
            {"overrides": {"knob_serve_readiness_grace_s": 0, "knob_serve_readiness_timeout_s": 1}},
        ),
        (["--check"], {"check": True}),
    ],
)
def test_each_apply_option_reaches_the_use_case(
    capsys: pytest.CaptureFixture[str],
    applied: list[dict[str, Any]],
    argv: list[str],
    changed: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KNOBFLEET_VIA", raising=False)
    code, _, _ = run(capsys, "apply", "ctas512", "-i", INV, "--limit", "lab1", "--yes", "--json", *argv)
    assert code == EXIT_OK
    assert {k: getattr(applied[0]["opts"], k) for k in DEFAULTS} == {**DEFAULTS, **changed}


def test_plan_is_a_check_that_needs_no_confirmation(
    capsys: pytest.CaptureFixture[str], applied: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KNOBFLEET_VIA", raising=False)
    code, _, _ = run(capsys, "plan", "ctas512", "-i", INV, "--limit", "lab2", "--json")
    assert code == EXIT_OK
    assert {k: getattr(applied[0]["opts"], k) for k in DEFAULTS} == {**DEFAULTS, "check": True}
    assert applied[0]["hosts"] == ["lab2"]


def test_apply_without_yes_and_without_a_terminal_changes_nothing(
    capsys: pytest.CaptureFixture[str], applied: list[dict[str, Any]]
) -> None:
    code, _, err = run(capsys, "apply", "ctas512", "-i", INV, "--limit", "all", "--json")
    assert code == EXIT_USAGE
    assert "apply: refusing to change 3 host(s) without confirmation; pass --yes" in err
    assert applied == []
    code, _, _ = run(capsys, "apply", "ctas512", "-i", INV, "--limit", "all", "--json", "--check")
    assert code == EXIT_OK and len(applied) == 1  # a check changes nothing: no confirmation needed


@dataclass
class Gate:
    host: str
    passed: bool
    reason: str

    def as_json(self) -> dict[str, Any]:
        return {"host": self.host, "passed": self.passed, "reason": self.reason}


@pytest.mark.parametrize(("passed", "code"), [(True, 0), (False, 1)])
def test_the_gate_is_handed_to_the_rollout_built_from_the_options(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, passed: bool, code: int
) -> None:
    """--gate builds the judge the rollout runs as a step of each batch (ops/apply_gate.py); the command's exit code
    and its JSON are the rollout's report, which carries the verdicts."""
    from knobfleet.experiment import gate

    seen: list[dict[str, Any]] = []

    def gate_judge(profile: Any, base: Any, inventory: Any, spec: Any, repeats: int, progress: bool) -> Any:
        seen.append(
            {"base": base.name, "conc": spec.conc, "n_mult": spec.n_mult, "tokens": spec.max_tokens, "r": repeats}
        )
        return lambda hv: Gate(hv.host, passed, "throughput -9.0%" if not passed else "ok")

    def apply(profile: Any, hosts: list[Any], inventory: Path, opts: Any, on_event: Any = None) -> FakeReport:
        verdicts = [opts.gate(hv) for hv in hosts]
        return FakeReport(0 if all(g.passed for g in verdicts) else 1, [h.host for h in hosts], verdicts)

    monkeypatch.setattr(gate, "gate_judge", gate_judge)
    monkeypatch.setattr(apply_use_case, "apply", apply)
    monkeypatch.setattr(probe, "warm_up", lambda *a, **kw: None)
    argv = ["apply", "ctas768", "-i", INV, "--limit", "lab1", "--yes", "--gate", "--baseline", "ctas512"]
    got, out, _ = run(capsys, *argv, "--json")
    assert got == code
    doc = json.loads(out)
    assert doc["gate"] == [{"host": "lab1", "passed": passed, "reason": "throughput -9.0%" if not passed else "ok"}]
    assert doc["exit_code"] == code
    assert seen[0]["base"] == "ctas512" and (seen[0]["n_mult"], seen[0]["tokens"], seen[0]["r"]) == (4, 256, 2)
    got, _, _ = run(capsys, *argv, "--gate-conc", "8,16", "--gate-repeats", "3", "--json")
    assert seen[1]["conc"] == (8, 16) and seen[1]["r"] == 3


def test_the_gate_does_not_run_after_a_check(
    capsys: pytest.CaptureFixture[str], applied: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from knobfleet.experiment import gate

    monkeypatch.setattr(gate, "gate_judge", lambda *a, **k: pytest.fail("gate built for --check"))
    code, out, _ = run(capsys, "apply", "ctas768", "-i", INV, "--limit", "lab1", "--check", "--gate", "--json")
    assert code == EXIT_OK and "gate" not in json.loads(out)
    assert applied[-1]["opts"].gate is None

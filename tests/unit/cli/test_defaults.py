"""The command line's defaults reach the use cases unchanged: ``ab`` and ``bench`` run with a fake use case
(experiment/ab.py's ``ab`` / ``bench``), so what the parser would pass to a real experiment is read back.

The A/B rule's published guarantees (docs/TESTING.md, "Statistical guarantees") hold at the guardrail of 3%
and the promotion floor of 1%: a default that drifts from them changes every user's verdicts silently.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import pytest

from knobfleet import cli
from knobfleet.experiment import ab as ab_use_case
from knobfleet.experiment.design import Settings

REPO = Path(__file__).resolve().parents[3]
INVENTORY = REPO / "inventories" / "lab"


class Captured:
    """What the fake use case was called with."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []


def fake_ab(seen: Captured, tmp_path: Path) -> Any:
    def ab(a: Any, b: Any, hv: Any, inventory: Path, settings: Settings, spec: Any, report_dir: Path, **kw: Any):  # type: ignore[no-untyped-def]
        seen.calls.append({"a": a, "b": b, "host": hv.host, "settings": settings, "spec": spec, **kw})
        return {
            "verdict": "keep",
            "reason": "fake",
            "buckets": [],
            "consistency": {"A": "skipped", "B": "skipped"},
            "winner": a.name,
        }

    return ab


def run_ab(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> dict[str, Any]:
    seen = Captured()
    monkeypatch.setattr(ab_use_case, "ab", fake_ab(seen, tmp_path))
    argv = ["ab", "ctas512", "ctas768", "-i", str(INVENTORY), "--limit", "lab1", "--yes"]
    argv += ["--report", str(tmp_path / "report"), *extra]
    code = cli.run(argv)
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.startswith("verdict: keep ctas512 — fake")
    (call,) = seen.calls
    return call


def test_ab_runs_at_the_published_guardrail_and_floor(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    call = run_ab(monkeypatch, tmp_path, capsys)
    s: Settings = call["settings"]
    assert (call["a"].name, call["b"].name, call["host"]) == ("ctas512", "ctas768", "lab1")
    assert s.max_regression == 0.03
    assert s.min_effect == 0.01
    assert s.max_rounds == Settings(weights={}).max_rounds
    assert s.min_rounds == min(3, s.max_rounds)
    assert s.alpha == Settings(weights={}).alpha
    assert s.weights == {48: 0.3, 64: 0.3, 80: 0.3, 96: 0.1}
    assert call["check_consistency"] is True
    # The same values the rule itself defaults to: the command line and design.Settings never disagree.
    default = Settings(weights=s.weights)
    assert (s.max_regression, s.min_effect) == (default.max_regression, default.min_effect)


@pytest.mark.parametrize(
    ("option", "value", "field", "expected"),
    [
        ("--max-regression", "0.06", "max_regression", 0.06),
        ("--min-effect", "0.02", "min_effect", 0.02),
        ("--max-rounds", "2", "max_rounds", 2),
        ("--weights", "48=1,64=0,80=0,96=0", "weights", {48: 1.0, 64: 0.0, 80: 0.0, 96: 0.0}),
    ],
)
def test_ab_options_override_the_defaults(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    option: str,
    value: str,
    field: str,
    expected: object,
) -> None:
    call = run_ab(monkeypatch, tmp_path, capsys, option, value)
    assert getattr(call["settings"], field) == expected
    if field == "max_rounds":
        assert call["settings"].min_rounds == 2  # never more looks required than allowed


def test_ab_no_consistency_skips_the_check(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_ab(monkeypatch, tmp_path, capsys, "--no-consistency")["check_consistency"] is False


def test_the_bench_spec_defaults(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = run_ab(monkeypatch, tmp_path, capsys)["spec"]
    assert (spec.conc, spec.n_mult, spec.max_tokens, spec.timeout_s, spec.tool, spec.input_len) == (
        (48, 64, 80, 96),
        4,
        256,
        1800,
        "builtin",
        128,
    )


# The help text states each default in parentheses ("(0.03 = 3%)", "(15)"): what --help promises is what runs.
HELP_DEFAULT = re.compile(r"\(([0-9.]+)(?: = \d+%+)?\)")


def _actions(command: str) -> dict[str, Any]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sp = sub.choices[command]
    return {a.dest: a for a in sp._actions}


@pytest.mark.parametrize(
    ("command", "dest", "expected"),
    [
        ("ab", "max_regression", 0.03),
        ("ab", "min_effect", 0.01),
        ("ab", "max_rounds", 15),
        ("ab", "n_mult", 4),
        ("ab", "max_tokens", 256),
        ("ab", "input_len", 128),
        ("bench", "n_mult", 4),
        ("bench", "max_tokens", 256),
        ("bench", "input_len", 128),
        ("bench", "repeats", 1),
    ],
)
def test_help_states_the_default_that_runs(command: str, dest: str, expected: object) -> None:
    action = _actions(command)[dest]
    assert action.default == expected
    m = HELP_DEFAULT.search(action.help or "")
    if m is not None:  # a help text that names a default names this one
        assert float(m.group(1)) == float(action.default), action.help
    elif dest != "repeats":
        pytest.fail(f"{command} --{dest.replace('_', '-')}: help does not state its default: {action.help!r}")


def test_the_guardrail_help_names_3_percent() -> None:
    assert "(0.03 = 3%)" in (_actions("ab")["max_regression"].help or "").replace("%%", "%")

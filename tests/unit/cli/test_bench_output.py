"""``bench`` and ``ab`` as a user reads them: the text printed and the exit code for each kind of result, with
the use cases (experiment/ab.py ``bench``, ``consistency``, ``activate``, ``ab``) faked at their module."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from knobfleet import cli
from knobfleet.cli.bench import _settings_shown
from knobfleet.errors import EXIT_DRIFT, EXIT_ERROR, EXIT_OK, EXIT_USAGE
from knobfleet.experiment import ab as use_case

REPO = Path(__file__).resolve().parents[3]
INV = str(REPO / "inventories" / "lab")


def call(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.run(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def bench_doc(errors: int = 0, tool: str = "knobfleet", repeats: int = 2) -> dict[str, Any]:
    return {
        "host": "lab1",
        "profile": None,
        "repeats": repeats,
        "buckets": [
            {"concurrency": 48, "mean": 2789.04, "low": 2701.5, "high": 2876.55, "runs": [2750.0, 2828.08]},
            {"concurrency": 64, "mean": 3010.0, "low": None, "high": None, "runs": [3010.0]},
        ],
        "errors": errors,
        "runs": [["C48 2750.0 tok/s", "C64 3010.0 tok/s"], ["C48 2828.1 tok/s"]],
        "tool": tool,
        "engine_version": "0.11.0" if tool != "knobfleet" else None,
        "settings": {"engine": {"max_num_seqs": 128, "nested": {"dtype": "bfloat16"}}} if tool != "knobfleet" else None,
        "time_scale": None,  # a real engine (the lab stand-in reports its SGLANG_SIM_TIME_SCALE here)
    }


@pytest.fixture
def fake_bench(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    docs: dict[str, dict[str, Any]] = {"doc": bench_doc()}

    def bench(
        profile: Any, hv: Any, inventory: Path, spec: Any, repeats: int, on_event: Any = None, **_: Any
    ) -> dict[str, Any]:
        calls.append({"profile": profile, "host": hv.host, "spec": spec, "repeats": repeats})
        return docs["doc"]

    monkeypatch.setattr(use_case, "bench", bench)
    calls.append({"docs": docs})
    return calls


def test_bench_prints_each_run_and_the_interval_table(
    capsys: pytest.CaptureFixture[str], fake_bench: list[dict[str, Any]]
) -> None:
    code, out, _ = call(capsys, "bench", "-i", INV, "--limit", "lab1", "--repeats", "2")
    assert code == EXIT_OK
    lines = out.splitlines()
    assert lines[:4] == ["run 1:", "  C48 2750.0 tok/s", "  C64 3010.0 tok/s", "run 2:"]
    row48 = next(line for line in lines if line.strip().startswith("48"))
    assert "2789.0" in row48 and "2701.5 … 2876.6" in row48 and row48.rstrip().endswith("2")
    row64 = next(line for line in lines if line.strip().startswith("64"))
    assert "3010.0" in row64 and " - " in f" {row64} " and row64.rstrip().endswith("1")
    assert lines[-1] == "lab1: current profile; request errors: 0"
    assert fake_bench[1]["repeats"] == 2 and fake_bench[1]["profile"] is None


def test_bench_with_request_errors_exits_1(
    capsys: pytest.CaptureFixture[str], fake_bench: list[dict[str, Any]]
) -> None:
    fake_bench[0]["docs"]["doc"] = bench_doc(errors=3)
    code, out, _ = call(capsys, "bench", "-i", INV, "--limit", "lab1")
    assert code == EXIT_ERROR and out.splitlines()[-1] == "lab1: current profile; request errors: 3"


def test_bench_with_the_engines_tool_names_it_and_its_settings(
    capsys: pytest.CaptureFixture[str], fake_bench: list[dict[str, Any]]
) -> None:
    fake_bench[0]["docs"]["doc"] = bench_doc(tool="vllm bench serve")
    code, out, _ = call(capsys, "bench", "-i", INV, "--limit", "lab1", "--tool", "engine")
    assert code == EXIT_OK
    tail = out.splitlines()[-3:]
    assert tail == [
        "measured with vllm bench serve against engine version 0.11.0",
        "  max_num_seqs = 128",
        "  dtype = bfloat16",
    ]
    assert fake_bench[1]["spec"].tool == "engine"


def test_bench_json_is_the_document(capsys: pytest.CaptureFixture[str], fake_bench: list[dict[str, Any]]) -> None:
    code, out, _ = call(capsys, "bench", "-i", INV, "--limit", "lab1", "--json")
    assert code == EXIT_OK and json.loads(out) == bench_doc()


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["--consistency", "--tool", "engine"], EXIT_USAGE, "--consistency runs knobfleet's own check"),
        (["--limit", "all"], EXIT_ERROR, "bench: --limit must select exactly one host (selected 3: lab1, lab2, lab3…)"),
    ],
)
def test_bench_refusals(
    capsys: pytest.CaptureFixture[str], fake_bench: list[dict[str, Any]], argv: list[str], code: int, message: str
) -> None:
    args = ["bench", "-i", INV, *(["--limit", "lab1"] if "--limit" not in argv else []), *argv]
    got, _, err = call(capsys, *args)
    assert got == code and message in err
    assert len(fake_bench) == 1  # the use case never ran


@pytest.mark.parametrize(("passed", "code", "word"), [(True, EXIT_OK, "PASS"), (False, EXIT_ERROR, "FAIL")])
def test_bench_consistency(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, passed: bool, code: int, word: str
) -> None:
    result = {
        "passed": passed,
        "compared": 16,
        "concurrency": 12,
        "diverged": 0 if passed else 2,
        "loops": 0,
        "errors": 0,
        "finish_reasons": {"length": 16},
        "divergences": [] if passed else [{"prompt": 3, "first_divergent_token": 17, "loop_period": 4}],
    }
    monkeypatch.setattr(use_case, "consistency", lambda hv, inventory, spec, progress: result)
    got, out, _ = call(capsys, "bench", "-i", INV, "--limit", "lab1", "--consistency")
    assert got == code
    lines = out.splitlines()
    assert lines[0] == (
        f"consistency on lab1 (current profile): {word} — 16 outputs at concurrency 12 compared with serial, "
        f"{result['diverged']} diverged, 0 loops, 0 errors, finish reasons {{'length': 16}}"
    )
    if not passed:
        assert lines[1] == "  prompt 3: first divergent token 17, loops with period 4"


def ab_doc(verdict: str) -> dict[str, Any]:
    return {
        "verdict": verdict,
        "reason": "because",
        "winner": "ctas768" if verdict == "promote" else "ctas512",
        "buckets": [
            {
                "concurrency": 48,
                "a_mean": 2789.04,
                "b_mean": 2850.0,
                "ratio": 0.02186,
                "low": -0.0051,
                "high": 0.049,
                "class": "better",
            }
        ],
        "consistency": {"A": "pass", "B": "skipped"},
    }


@pytest.mark.parametrize(
    ("verdict", "first", "code"),
    [
        ("promote", "verdict: promote ctas768 — because", EXIT_OK),
        ("keep", "verdict: keep ctas512 — because", EXIT_OK),
        ("inconclusive", "verdict: inconclusive — because", EXIT_DRIFT),
    ],
)
def test_ab_text_and_exit_code_per_verdict(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    verdict: str,
    first: str,
    code: int,
) -> None:
    monkeypatch.setattr(use_case, "ab", lambda *a, **kw: ab_doc(verdict))
    got, out, _ = call(
        capsys, "ab", "ctas512", "ctas768", "-i", INV, "--limit", "lab1", "--yes", "--report", str(tmp_path / "r")
    )
    assert got == code
    lines = out.splitlines()
    assert lines[0] == first
    row = next(line for line in lines if line.strip().startswith("48"))
    assert row.split() == ["48", "2789.0", "2850.0", "+2.2%", "-0.5%", "…", "+4.9%", "better"]
    winner = ab_doc(verdict)["winner"]
    assert any(line.startswith(f"consistency: A pass, B skipped; live now: {winner}; reports in ") for line in lines)


def test_ab_needs_a_weight_for_every_bucket(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(use_case, "ab", lambda *a, **kw: pytest.fail("ran without weights"))
    code, _, err = call(
        capsys, "ab", "ctas512", "ctas768", "-i", INV, "--limit", "lab1", "--yes", "--weights", "48=1,64=0"
    )
    assert code == EXIT_ERROR
    assert "--weights '48=1,64=0': no weight for concurrency [80, 96]; give every --conc bucket a weight" in err


def test_settings_shown_walks_nested_settings_in_a_fixed_order() -> None:
    settings = {"a": {"dtype": "float16", "b": [{"max_num_seqs": 1}]}, "max_model_len": 512, "tp_size": {"x": 1}}
    assert _settings_shown(settings) == [("max_model_len", 512), ("dtype", "float16")]
    assert _settings_shown({"dtype": "a", "z": {"dtype": "b"}}) == [("dtype", "a")]
    assert _settings_shown(None) == []


def test_bench_refuses_zero_repeats_while_parsing(
    capsys: pytest.CaptureFixture[str], fake_bench: list[dict[str, Any]]
) -> None:
    with pytest.raises(SystemExit) as exc:
        call(capsys, "bench", "-i", INV, "--limit", "lab1", "--repeats", "0")
    assert exc.value.code == EXIT_USAGE and "argument --repeats: 0: must be >= 1" in capsys.readouterr().err
    assert len(fake_bench) == 1  # the use case never ran

"""The engine adapter's bench tool: argv rendered from the catalog's serve.bench, per concurrency bucket."""

from __future__ import annotations

import itertools

import pytest
from pydantic import ValidationError

from knobfleet.engines.adapter import engine
from knobfleet.profiles.model import BenchTool
from tests.unit.probedocs import probe_doc


def test_vllm_bench_runs_fill_every_placeholder_from_the_host() -> None:
    vllm = engine("vllm")
    assert vllm.bench is not None and vllm.bench.name == "vllm bench serve"
    runs = vllm.bench_runs(
        ("/opt/venv/bin/vllm",),
        "/models/tiny",
        "127.0.1.1",
        8000,
        conc=(2, 4),
        n_mult=3,
        input_len=64,
        output_len=16,
        seed=7,
        result_dir="{result_dir}",
        run_id="r1",
    )
    assert [(r["concurrency"], r["num_prompts"]) for r in runs] == [(2, 6), (4, 12)]
    argv = runs[1]["argv"]
    assert argv[:3] == ["/opt/venv/bin/vllm", "bench", "serve"]  # the host's launcher, not the catalog's
    pairs = dict(itertools.pairwise(argv))
    assert pairs["--base-url"] == "http://127.0.1.1:8000"
    assert pairs["--model"] == "/models/tiny"
    assert (pairs["--num-prompts"], pairs["--max-concurrency"]) == ("12", "4")
    assert (pairs["--random-input-len"], pairs["--random-output-len"], pairs["--seed"]) == ("64", "16", "7")
    # The result folder is the host's knob_bench_dir: left for the module to fill in.
    assert (pairs["--result-dir"], pairs["--result-filename"]) == ("{result_dir}", "r1-c4.json")
    assert runs[1]["result_path"] == "{result_dir}/r1-c4.json"
    assert not any("{" in a for a in argv if a != "{result_dir}")


def test_the_catalog_launcher_is_used_when_the_host_names_none() -> None:
    sglang = engine("sglang")
    assert sglang.bench is not None and sglang.bench.result == "jsonl"
    (run,) = sglang.bench_runs(
        None,
        "/m",
        "127.0.0.1",
        30000,
        conc=(8,),
        n_mult=0,
        input_len=1,
        output_len=1,
        seed=0,
        result_dir="/d",
        run_id="x",
    )
    assert run["argv"][:3] == [sglang.launcher[0], "-m", "sglang.bench_serving"]
    assert run["num_prompts"] == 1  # never zero prompts
    assert "/d/x-c8.json" in run["argv"]


def test_a_catalog_placeholder_knobfleet_does_not_fill_is_refused_when_the_catalog_loads() -> None:
    with pytest.raises(ValidationError, match=r"unknown placeholder \{modle\}"):
        BenchTool(name="t", argv=("tool", "--model", "{modle}"))
    with pytest.raises(ValidationError):
        BenchTool(name="t", argv=())


def test_an_engine_without_a_bench_tool_says_so() -> None:
    from dataclasses import replace

    bare = replace(engine("vllm"), bench=None)
    with pytest.raises(ValueError, match=r"no bench tool in its catalog \(serve.bench\)"):
        bare.bench_runs(
            None, "m", "h", 1, conc=(1,), n_mult=1, input_len=1, output_len=1, seed=0, result_dir="d", run_id="r"
        )


def test_vllm_variables_vllm_sets_in_its_own_children_are_no_drift() -> None:
    """Measured on the lab's vLLM 0.32 (docs/VLLM.md): a random shm buffer name vLLM writes into its environ when
    first read reached two children after a rollback in CI, an env_unexpected on an engine in sync."""
    from knobfleet.module_utils.knob_live import evaluate

    rules = engine("vllm").rules()
    assert {"VLLM_OBJECT_STORAGE_SHM_BUFFER_NAME", "VLLM_WORKER_MULTIPROC_METHOD"} <= set(rules["ignore_env"])
    env = {
        "VLLM_OBJECT_STORAGE_SHM_BUFFER_NAME": "vllm_mm_lcuwmmT8Tfe1bEVe_qRNTw",
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
    }
    doc = probe_doc(
        {"pid": 10, "comm": "vllm", "env": {}, "cmdline": ["vllm", "serve", "m"], "start_epoch": 1e10},
        {"pid": 11, "comm": "python3", "env": env, "cmdline": ["python3", "-c", "x"], "start_epoch": 1e10},
        files={},
    )
    expected = {"generation": 1, "files": {}, "script_known": True, "env": {}, "argv": ["vllm", "serve", "m"]}
    assert evaluate(doc, expected, rules) == []
    # the same variable set by hand in the main process's environment is still named
    doc["processes"][1]["env"] = {**env, "VLLM_OTHER_KNOB": "1"}
    assert [f["kind"] for f in evaluate(doc, expected, rules)] == ["env_unexpected"]

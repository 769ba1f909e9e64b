"""The stand-in's launch flags: exactly SGLang's, from flags.json (generated from the SGLang catalog)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from knobfleet import paths
from knobfleet.lab import hostfiles
from knobfleet.lab.sim import flags, launch_server

MODEL = ["--model-path=/m"]


def catalog_flags() -> dict[str, dict[str, Any]]:
    data = yaml.safe_load((paths.catalogs_dir() / "generated" / "sglang.yaml").read_text(encoding="utf-8"))
    return {n: k for n, k in data["knobs"].items() if k["kind"] == "flag"}


def value_args(option: str, knob: dict[str, Any]) -> list[str]:
    if knob["type"] == "bool":
        return [option]
    choices = knob.get("choices")
    value = str(choices[0]) if choices else {"int": "3", "float": "0.5", "str": "x"}[knob["type"]]
    return [option, value, value] if knob.get("nargs") in ("+", "*") else [option, value]


def parse(*argv: str) -> argparse.Namespace:
    return flags.parse([*MODEL, *argv])


def refused(*argv: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        flags.parse([*MODEL, *argv])
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_flags_json_is_generated_from_the_catalog() -> None:
    text = hostfiles.sim_flags_from_catalogs()
    assert flags.FLAGS_FILE.read_text(encoding="utf-8") == text, (
        "sim/flags.json is stale: run .venv/bin/python -c "
        "'from knobfleet.lab import hostfiles; hostfiles.write_sim_flags()'"
    )
    spec = flags.load()
    assert spec["engine"] == "sglang" and spec["version"] == "0.5.23"
    assert set(spec["flags"]) == set(catalog_flags())


def test_flags_json_is_deterministic() -> None:
    assert hostfiles.sim_flags_from_catalogs() == hostfiles.sim_flags_from_catalogs()


def test_every_catalog_flag_and_alias_is_accepted() -> None:
    parser = launch_server.build_parser()
    for name, knob in catalog_flags().items():
        dest = name.replace("-", "_")
        for option in [name, *knob.get("aliases", [])]:
            args = parser.parse_args([*MODEL, *value_args(f"--{option}", knob)])
            assert getattr(args, dest) is not None, option


def test_a_made_up_flag_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert "unrecognized arguments: --no-such-flag" in refused("--no-such-flag", capsys=capsys)


def test_tp_and_dp_work_as_prefix_abbreviations_like_in_sglang() -> None:
    assert parse("--tp", "2").tp_size == 2
    assert parse("--tp=4").tp_size == 4
    assert parse("--dp", "2").dp_size == 2
    assert parse("--tensor-parallel-size", "8").tp_size == 8
    assert parse("--model=/x").model_path == "/x"


def test_cuda_graph_max_bs_is_an_ambiguous_prefix_in_0_5_23(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused("--cuda-graph-max-bs", "128", capsys=capsys)
    assert "ambiguous option: --cuda-graph-max-bs could match" in err
    assert parse("--cuda-graph-max-bs-decode", "128").cuda_graph_max_bs_decode == 128


def test_values_are_checked_like_argparse(capsys: pytest.CaptureFixture[str]) -> None:
    assert "invalid int value" in refused("--tp-size", "two", capsys=capsys)
    assert "invalid choice" in refused("--attention-backend", "nope", capsys=capsys)
    assert "expected one argument" in refused("--port", capsys=capsys)
    with pytest.raises(SystemExit) as exc:
        flags.parse(["--tp", "2"])
    assert exc.value.code == 2
    assert "required: --model-path/--model" in capsys.readouterr().err


def test_defaults_come_from_the_catalog() -> None:
    args = parse()
    assert (args.tp_size, args.port, args.host) == (1, 30000, "127.0.0.1")
    assert args.trust_remote_code is False


def test_a_catalog_negation_becomes_a_no_flag() -> None:
    spec = {"required": [], "flags": {"enable-x": {"type": "bool", "negation": "no-enable-x"}}}
    assert flags.parse(["--no-enable-x"], spec).enable_x is False
    assert flags.parse(["--enable-x"], spec).enable_x is True


def test_sim_flags_adds_patch_flags_from_the_overlay_but_not_overlay_aliases() -> None:
    gen = {
        "engine": "sglang",
        "version": "1",
        "model": {"style": "flag", "flag": "model-path"},
        "knobs": {
            "model-path": {"kind": "flag", "type": "str", "restart": True},
            "tp-size": {"kind": "flag", "type": "int", "default": 1, "aliases": ["tensor-parallel-size"]},
            "SGLANG_X": {"kind": "env", "type": "int"},
        },
    }
    overlay = {
        "knobs": {
            "tp-size": {"aliases": ["tensor-parallel-size", "tp"]},
            "patched-flag": {"kind": "flag", "type": "int", "origin": "a patch"},
        }
    }
    spec = json.loads(hostfiles.sim_flags(gen, overlay))
    assert spec["required"] == ["model-path"]
    assert spec["flags"] == {
        "model-path": {"type": "str"},
        "patched-flag": {"type": "int"},
        "tp-size": {"type": "int", "aliases": ["tensor-parallel-size"], "default": 1},
    }


def test_sim_flags_from_catalogs_reads_the_overlay_next_to_generated(tmp_path: Path) -> None:
    (tmp_path / "generated").mkdir()
    gen = {"engine": "sglang", "version": "9", "knobs": {"a": {"kind": "flag", "type": "int"}}}
    (tmp_path / "generated" / "sglang.yaml").write_text(yaml.safe_dump(gen), encoding="utf-8")
    overlay = {"engine": "sglang", "knobs": {"b": {"kind": "flag", "type": "str", "origin": "patch"}}}
    (tmp_path / "sglang.overlay.yaml").write_text(yaml.safe_dump(overlay), encoding="utf-8")
    assert set(json.loads(hostfiles.sim_flags_from_catalogs(tmp_path))["flags"]) == {"a", "b"}

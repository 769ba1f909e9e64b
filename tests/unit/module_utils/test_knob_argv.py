"""The one argv reader (module_utils/knob_argv.py): recorded cases on the committed catalogs' flag tables, and
the reader against Python's own argparse (the parser both engines use) on generated command lines."""

from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from knobfleet.engines.adapter import engine
from knobfleet.module_utils import knob_argv
from knobfleet.module_utils.knob_shell import shell_statements

CASES = yaml.safe_load((Path(__file__).parent / "data" / "argv_cases.yaml").read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_recorded_case(case: dict[str, Any]) -> None:
    (argv,) = shell_statements(case["argv"])
    got = knob_argv.read(argv, engine(case["engine"]).argv_spec)
    assert got.flags == case["flags"]
    want = case.get("errors") or []
    assert len(got.errors) == len(want), got.errors
    for fragment, error in zip(want, got.errors, strict=True):
        assert fragment in error


@pytest.mark.parametrize(
    ("hand", "rendered"),
    [
        ("--host 127.0.1.2 --port 30000 --tp 2", "--host=127.0.1.2 --port=30000 --tp-size=2"),
        ("--tensor-parallel-size 2 --trust-remote", "--tp-size=2 --trust-remote-code"),
        ("--chunked-prefill-size -1", "--chunked-prefill-size=-1"),
    ],
)
def test_both_spellings_read_the_same(hand: str, rendered: str) -> None:
    spec = engine("sglang").argv_spec
    a = knob_argv.read(["python3", "-m", "sglang.launch_server", *hand.split()], spec)
    b = knob_argv.read(["python3", "-m", "sglang.launch_server", *rendered.split()], spec)
    assert a.flags == b.flags and not a.errors and not b.errors


@pytest.mark.parametrize(
    ("name", "flag"),
    [
        ("tp", "tp-size"),
        ("tensor-parallel-size", "tp-size"),
        ("tp-size", "tp-size"),
        ("mem-fraction", "mem-fraction-static"),
        ("cuda-graph-max-bs", None),  # ambiguous
        ("no-such-flag", None),
    ],
)
def test_canonical(name: str, flag: str | None) -> None:
    assert knob_argv.canonical(name, engine("sglang").argv_spec) == flag
    assert knob_argv.canonical(name, None) == name


def test_vllm_underscores_and_sglang_does_not_fold_them() -> None:
    assert knob_argv.canonical("max_model_len", engine("vllm").argv_spec) == "max-model-len"
    assert knob_argv.canonical("tp_size", engine("sglang").argv_spec) is None


@pytest.mark.parametrize(
    ("knob", "arity"),
    [
        ({"type": "bool"}, "0"),
        ({"type": "int"}, "1"),
        ({"type": "str", "nargs": "?"}, "?"),
        ({"type": "str", "nargs": 0}, "0"),
        ({"type": "int", "nargs": "+"}, "+"),
        ({"type": "int", "nargs": 2}, "2"),
        ({"type": "int", "nargs": "weird"}, "1"),
    ],
)
def test_arity_of(knob: dict[str, Any], arity: str) -> None:
    assert knob_argv.arity_of(knob) == arity


def test_every_catalog_flag_has_an_arity_and_every_alias_a_flag() -> None:
    for name in ("sglang", "vllm"):
        spec = engine(name).argv_spec
        assert spec is not None
        assert spec["flags"] and set(spec["flags"].values()) <= {"0", "1", "?", "+", "*"}
        assert set(spec["aliases"].values()) <= set(spec["flags"])
        assert set(spec["negations"].values()) <= set(spec["flags"])
    assert engine("vllm").argv_spec["positional"] == "model"  # type: ignore[index]
    assert engine("vllm").argv_spec["subcommand"] == "serve"  # type: ignore[index]


@pytest.mark.parametrize(
    ("argv", "head"),
    [
        (["/v/bin/vllm", "serve", "m"], 2),
        (["/usr/bin/python3", "-m", "sglang.launch_server", "--tp", "2"], 3),
        (["/usr/bin/python3", "-u", "-m", "x", "--a"], 4),
        (["/opt/bin/engine", "--a", "-m", "x"], 1),
        ([], 0),
    ],
)
def test_head_length(argv: list[str], head: int) -> None:
    spec = {"subcommand": "serve"}
    assert knob_argv.head_length(argv, spec) == head


# --- the reader against argparse -----------------------------------------------------------------------------

SPEC = knob_argv.build_spec(
    {
        "tp-size": {"type": "int", "aliases": ["tensor-parallel-size", "-tp"]},
        "tp-attn": {"type": "int"},
        "enable-x": {"type": "bool", "negation": "no-enable-x"},
        "enable-xy": {"type": "str"},
        "mem": {"type": "float"},
        "lists": {"type": "int", "nargs": "+"},
        "star": {"type": "str", "nargs": "*"},
        "maybe": {"type": "str", "nargs": "?"},
        "quant": {"type": "str", "aliases": ["-q"]},
        "switch": {"type": "bool"},
    }
)


def argparse_parser(spec: dict[str, Any]) -> argparse.ArgumentParser:
    """A plain argparse parser registering exactly the options in ``spec`` (nothing given: nothing set)."""
    p = argparse.ArgumentParser(prog="engine", add_help=False, exit_on_error=False)
    aliases: dict[str, list[str]] = {}
    for alias, name in spec["aliases"].items():
        aliases.setdefault(name, []).append(alias)
    negated = {name: neg for neg, name in spec["negations"].items()}
    for name, arity in spec["flags"].items():
        options = [knob_argv._option(n) for n in (name, *aliases.get(name, []))]
        kw: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS}
        if arity == "0":
            kw["action"] = argparse.BooleanOptionalAction if name in negated else "store_true"
        elif arity == "?":
            kw.update(nargs="?", const=True)
        elif arity in ("+", "*"):
            kw["nargs"] = arity
        p.add_argument(*options, **kw)
    return p


def argparse_read(spec: dict[str, Any], words: list[str]) -> dict[str, str] | None:
    """What argparse sets from ``words`` (None: argparse refuses the line)."""
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            ns = argparse_parser(spec).parse_args(words)
        except (argparse.ArgumentError, SystemExit):
            return None
    out = {}
    for name, value in vars(ns).items():
        if isinstance(value, bool):
            out[name] = "true" if value else "false"
        elif isinstance(value, list):
            out[name] = " ".join(value)
        else:
            out[name] = str(value)
    return out


OPTIONS = sorted(knob_argv.options_of(SPEC))
WORD = st.one_of(
    st.sampled_from(OPTIONS),
    st.sampled_from(OPTIONS).flatmap(lambda o: st.integers(2, len(o)).map(lambda n: o[:n])),  # prefixes
    st.sampled_from(["1", "-1", "-0.5", "x", "a b", "-x", "-x y", "--", "-", "", "--nope"]),
)
TOKEN = st.one_of(
    WORD, st.tuples(st.sampled_from(OPTIONS), st.sampled_from(["1", "-1", "", "a=b", "-x"])).map("=".join)
)


@settings(max_examples=400, deadline=None)
@given(words=st.lists(TOKEN, max_size=8))
def test_the_reader_agrees_with_argparse(words: list[str]) -> None:
    got = knob_argv.read(["engine", *words], SPEC)
    want = argparse_read(SPEC, words)
    if want is None:
        assert got.errors, (words, got)
    else:
        assert not got.errors and got.flags == want, (words, got, want)


@settings(max_examples=200, deadline=None)
@given(
    flags=st.dictionaries(
        st.sampled_from(sorted(SPEC["flags"])),
        st.one_of(st.sampled_from(["1", "-1", "-x", "a b", "x=y", ""]), st.booleans()),
        max_size=6,
    )
)
def test_what_render_writes_reads_back(flags: dict[str, str | bool]) -> None:
    """``--flag=value`` (render's spelling, profiles/model.arg_tokens) reads back as exactly those flags."""
    from knobfleet.profiles.model import arg_tokens

    flags = {k: v for k, v in flags.items() if SPEC["flags"][k] == "0" or not isinstance(v, bool)}
    flags = {k: (True if SPEC["flags"][k] == "0" else v) for k, v in flags.items()}
    argv = ["engine"] + [t for k, v in sorted(flags.items()) for t in arg_tokens(k, v)]
    got = knob_argv.read(argv, SPEC)
    assert got.flags == {k: "true" if v is True else str(v) for k, v in flags.items()} and not got.errors


def test_the_flag_table_travels_to_the_hosts_in_the_engine_rule() -> None:
    """The on-host modules (the restore check after `rollback`) read argv with the same table: it is part of the
    engine rule the controller hands the role (``knob_serve_engine``) and the read path."""
    for name in ("sglang", "vllm"):
        e = engine(name)
        assert e.role_vars()["argv"] == e.rules()["argv"] == e.argv_spec
    assert engine("sglang").role_vars()["argv"]["aliases"]["tensor-parallel-size"] == "tp-size"

"""engines/adapter.py to the letter: the launch line's head, the reserved flags, the live rule's engine part and
the role's engine vars, for a hand-built engine and for the shipped catalogs."""

from __future__ import annotations

import pytest

from knobfleet.engines.adapter import Engine, engine, names

TOY = Engine(
    name="toy",
    launcher=("/usr/bin/python3", "-m", "toy.serve"),
    fixed_args=("--model={model}", "--host={host}", "--port={port}", "--served={model}@{host}", "plain", "--flag"),
    readiness_path="/health",
    info_path="/info",
    info_env=("env", 0),
    env_prefixes=("TOY_",),
    ignore_env=("TOY_LOG",),
    show={"TOY_LONG_NAME": "long"},
    known_env=("TOY_A", "TOY_B"),
    secret_env=("TOY_TOKEN",),
    info_args=True,
    info_args_ignore=("--port",),
    startup_phases=(("weights", r"weights loaded\."),),
)


def test_head_argv_fills_every_placeholder_of_every_token() -> None:
    assert TOY.head_argv(None, "/m", "127.0.1.2", 30000) == [
        "/usr/bin/python3",
        "-m",
        "toy.serve",
        "--model=/m",
        "--host=127.0.1.2",
        "--port=30000",
        "--served=/m@127.0.1.2",
        "plain",
        "--flag",
    ]
    assert TOY.head_argv(("/opt/venv/bin/toy",), "/m", "h", 1)[:2] == ["/opt/venv/bin/toy", "--model=/m"]
    assert TOY.head_argv((), "/m", "h", 1)[0] == "/usr/bin/python3"  # an empty launcher is no launcher


def test_reserved_flags_are_the_fixed_flags_without_values() -> None:
    assert TOY.reserved_flags == ("model", "host", "port", "served", "flag")


def test_rules_and_role_vars_exactly() -> None:
    rules = {
        "name": "toy",
        "env_prefixes": ["TOY_"],
        "ignore_env": ["TOY_LOG"],
        "info_env": ["env", 0],
        "info_args": True,
        "info_args_ignore": ["--port"],
        "info_version": ["version"],
        "argv": None,  # the flag table for the argv reader: the toy catalog declares no flags
    }
    assert TOY.rules() == {**rules, "known_env": ["TOY_A", "TOY_B"]}
    assert TOY.rules(with_known=False) == rules
    assert TOY.role_vars() == {
        **rules,
        "launcher": ["/usr/bin/python3", "-m", "toy.serve"],
        "fixed_args": list(TOY.fixed_args),
        "reserved_flags": ["model", "host", "port", "served", "flag"],
        "readiness_path": "/health",
        "info_path": "/info",
        "secret_env": ["TOY_TOKEN"],
        "compile_caches": {},
        "startup_phases": [{"name": "weights", "pattern": r"weights loaded\."}],
    }


def test_an_engine_without_info_says_so_with_empty_values() -> None:
    bare = Engine("bare", ("x",), (), "/h", None, None, (), (), {}, ())
    assert bare.rules()["info_env"] is None and bare.rules()["info_args"] is False
    assert bare.role_vars()["info_path"] == "" and bare.role_vars()["secret_env"] == []
    assert bare.reserved_flags == ()


def test_short_names() -> None:
    assert TOY.short("TOY_LONG_NAME") == "long"
    assert TOY.short("TOY_OTHER") == "TOY_OTHER"


@pytest.mark.parametrize("name", ["sglang", "vllm"])
def test_the_shipped_engines_come_from_their_catalogs(name: str) -> None:
    from knobfleet.profiles.catalog import catalog_for

    e, cat = engine(name), catalog_for(name)
    assert e.name == name == cat.engine
    assert e.launcher == cat.serve.launcher and e.fixed_args == cat.serve.fixed_args
    assert (e.readiness_path, e.info_path, e.info_env) == (
        cat.serve.readiness_path,
        cat.serve.info_path,
        cat.serve.info_env,
    )
    assert e.env_prefixes == cat.env_prefixes and e.ignore_env == cat.serve.ignore_env
    assert e.show == dict(cat.serve.show)
    assert e.known_env == tuple(sorted(cat.env_knobs())) and e.known_env
    assert e.secret_env == cat.secret_names()
    assert (e.info_args, e.info_args_ignore, e.bench, e.info_version) == (
        cat.serve.info_args,
        cat.serve.info_args_ignore,
        cat.serve.bench,
        cat.serve.info_version,
    )


def test_the_default_engine_and_the_names() -> None:
    from knobfleet.profiles.catalog import default_engine

    assert engine() == engine(default_engine())
    assert {"sglang", "vllm"} <= set(names())

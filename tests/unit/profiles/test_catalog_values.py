"""A knob's value against its catalog entry (catalog.check_value / check_env / check_flag): what a profile
author sees for every kind, type, choice list and range, and the catalogs a project adds (engine_names)."""

from __future__ import annotations

from pathlib import Path

import pytest

from knobfleet import paths
from knobfleet.errors import ProfileError
from knobfleet.profiles import catalog
from knobfleet.profiles.model import Catalog, Knob, Scalar, Serve

SERVE = Serve(launcher=("toy",), fixed_args=("--port={port}",), readiness_path="/health")
TOY = Catalog(
    engine="toy",
    env_prefixes=("TOY_",),
    serve=SERVE,
    knobs={
        "TOY_FLAG": Knob(kind="env", type="bool"),
        "TOY_N": Knob(kind="env", type="int", min=1, max=8),
        "TOY_MODE": Knob(kind="env", type="str", choices=("fast", "slow")),
        "TOY_RATIO": Knob(kind="env", type="float", min=0.5),
        "tp-size": Knob(kind="flag", type="int", aliases=("tp",)),
        "eager": Knob(kind="flag", type="bool"),
        "TOY_ALSO_A_FLAG": Knob(kind="flag", type="int"),
    },
)


@pytest.mark.parametrize(
    ("knob", "value", "why"),
    [
        # an env bool is 1/0 in the environment: true/false or 0/1, nothing else
        (Knob(kind="env", type="bool"), True, None),
        (Knob(kind="env", type="bool"), False, None),
        (Knob(kind="env", type="bool"), 1, None),
        (Knob(kind="env", type="bool"), 0, None),
        (Knob(kind="env", type="bool"), 2, "expected true/false or 0/1, got 2"),
        (Knob(kind="env", type="bool"), "yes", "expected true/false or 0/1, got 'yes'"),
        # a flag bool is a bare flag (true) or no flag (false)
        (Knob(kind="flag", type="bool"), True, None),
        (Knob(kind="flag", type="bool"), False, None),
        (Knob(kind="flag", type="bool"), 1, "expected true (bare flag) or false (omit), got 1"),
        (Knob(kind="flag", type="bool"), "true", "expected true (bare flag) or false (omit), got 'true'"),
        # YAML's true is never a number or a string
        (Knob(kind="env", type="int"), True, "expected an integer, got true"),
        (Knob(kind="env", type="float"), False, "expected a float, got false"),
        (Knob(kind="flag", type="str"), True, "expected a str, got true"),
        (Knob(kind="env", type="int"), 3, None),
        (Knob(kind="env", type="int"), 3.0, "expected an integer, got 3.0"),
        (Knob(kind="env", type="int"), "3", "expected an integer, got '3'"),
        (Knob(kind="env", type="float"), 3, None),
        (Knob(kind="env", type="float"), 0.25, None),
        (Knob(kind="env", type="float"), "0.25", "expected a number, got '0.25'"),
        (Knob(kind="env", type="float"), float("nan"), "expected a number, got nan"),
        (Knob(kind="env", type="float"), float("inf"), "expected a number, got inf"),
        (Knob(kind="env", type="str"), "x", None),
        (Knob(kind="env", type="str"), 5, "expected a string, got 5; quote it"),
        # choices, then ranges (inclusive at both ends, either end open)
        (Knob(kind="env", type="str", choices=("a", "b")), "b", None),
        (Knob(kind="env", type="str", choices=("a", "b")), "c", "'c' is not one of 'a', 'b'"),
        (Knob(kind="env", type="int", choices=(16, 32)), 32, None),
        (Knob(kind="env", type="int", choices=(16, 32)), 64, "64 is not one of 16, 32"),
        (Knob(kind="env", type="int", min=1, max=8), 1, None),
        (Knob(kind="env", type="int", min=1, max=8), 8, None),
        (Knob(kind="env", type="int", min=1, max=8), 0, "0 is out of range; allowed 1..8"),
        (Knob(kind="env", type="int", min=1, max=8), 9, "9 is out of range; allowed 1..8"),
        (Knob(kind="env", type="int", min=1), 10**6, None),
        (Knob(kind="env", type="int", min=1), -1, "-1 is out of range; allowed 1.."),
        (Knob(kind="env", type="float", max=0.99), 1.5, "1.5 is out of range; allowed ..0.99"),
        (Knob(kind="env", type="float", max=0.99), -1e9, None),
        (Knob(kind="flag", type="float", min=0.05, max=0.99), 0.05, None),
        (Knob(kind="flag", type="float", min=0.05, max=0.99), 0.049, "0.049 is out of range; allowed 0.05..0.99"),
        (Knob(kind="env", type="str", min=1, max=2), "long text", None),  # a range does not apply to text
    ],
)
def test_check_value(knob: Knob, value: Scalar, why: str | None) -> None:
    assert catalog.check_value(knob, value) == why


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("TOY_FLAG", True, None),
        ("TOY_FLAG", 1, None),
        ("TOY_FLAG", "on", "expected true/false or 0/1, got 'on'"),
        ("TOY_N", 9, "9 is out of range; allowed 1..8"),
        ("TOY_MODE", "slow", None),
        ("TOY_RATIO", 0.4, "0.4 is out of range; allowed 0.5.."),
        ("TOY_MOD", "fast", "unknown knob; did you mean TOY_MODE?"),
        ("TOY_ZZZZZZZ", 1, "unknown knob; add it to allow_unknown if toy really reads it"),
        ("TOY_ALLOWED", 1, None),  # in allow_unknown
        ("NCCL_DEBUG", "INFO", None),  # not the engine's prefix: not the catalog's to judge
        ("TOY_ALSO_A_FLAG", "x", "unknown knob; add it to allow_unknown if toy really reads it"),  # a flag, not env
        ("1TOY", 1, "invalid env var name; use letters, digits and _ and do not start with a digit"),
        ("TOY-N", 1, "invalid env var name; use letters, digits and _ and do not start with a digit"),
        ("TOY_N", 2**63, "is a number too large for any engine; use a value within ±9.2e18"),
        ("TOY_N", -(2**63), "is a number too large for any engine; use a value within ±9.2e18"),
        ("NCCL_X", 2**63 - 1, None),
        ("NCCL_X", -(2**63) + 1, None),
        ("NCCL_X", float("inf"), "inf is not a finite number"),
        ("NCCL_X", float("-inf"), "-inf is not a finite number"),
        ("NCCL_X", "a\x00b", "contains a NUL byte; remove it"),
        ("NCCL_X", "\udc80", "is not valid UTF-8 text"),
        ("NCCL_X", "é ok", None),
    ],
)
def test_check_env(name: str, value: Scalar, why: str | None) -> None:
    assert catalog.check_env(TOY, name, value, ("TOY_ALLOWED",)) == why


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("tp-size", 2, None),
        ("tp", 2, None),  # an alias is checked as the knob it names
        ("tp", "two", "expected an integer, got 'two'"),
        ("eager", True, None),
        ("eager", "yes", "expected true (bare flag) or false (omit), got 'yes'"),
        ("tp-sise", 2, "unknown flag; did you mean tp-size?"),
        ("zzzz", 2, "unknown flag; add it to allow_unknown if the engine really accepts it"),
        ("new-flag", 2, None),  # in allow_unknown
        ("TOY_N", 2, "unknown flag; add it to allow_unknown if the engine really accepts it"),  # an env knob
        ("-tp", 2, "invalid flag name; use letters, digits, - and _ without leading dashes"),
        ("t p", 2, "invalid flag name; use letters, digits, - and _ without leading dashes"),
        ("tp-size", 2**64, "is a number too large for any engine; use a value within ±9.2e18"),
        ("tp-size", float("nan"), "nan is not a finite number"),
        ("new-flag", "x\x00", "contains a NUL byte; remove it"),
    ],
)
def test_check_flag(name: str, value: Scalar, why: str | None) -> None:
    assert catalog.check_flag(TOY, name, value, ("new-flag",)) == why


def test_a_projects_own_catalogs_add_engines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shipped, own = tmp_path / "shipped", tmp_path / "project" / "catalogs"
    shipped.mkdir()
    own.mkdir(parents=True)
    (shipped / "a.yaml").write_text("engine: a\n")
    (shipped / "b.overlay.yaml").write_text("engine: b\n")
    (own / "c.yaml").write_text("engine: c\n")  # the project's own engine
    (own / "b.overlay.yaml").write_text("engine: b\n")  # the project's overlay of a shipped one: no new engine
    (own / "d.e.yaml").write_text("engine: d\n")  # not a catalog name
    (own / "notes.txt").write_text("engine: n\n")
    monkeypatch.setattr(paths, "catalog_overlay_dirs", lambda: [own])
    assert catalog.engine_names(shipped) == ["a", "b", "c"]
    assert catalog.catalog_files("c", shipped) == [own / "c.yaml"]
    assert catalog.catalog_files("b", shipped) == [shipped / "b.overlay.yaml", own / "b.overlay.yaml"]


def test_load_catalog_reads_and_validates_one_file(tmp_path: Path) -> None:
    path = tmp_path / "toy.yaml"
    path.write_text(
        "engine: toy\nenv_prefixes: [TOY_]\n"
        "serve: {launcher: [toy], fixed_args: ['--port={port}'], readiness_path: /health}\n"
        "knobs:\n  TOY_N: {kind: env, type: int, min: 1}\n"
    )
    cat = catalog.load_catalog(path)
    assert cat.engine == "toy" and cat.knobs["TOY_N"].min == 1 and cat.serve.readiness_path == "/health"
    path.write_text("engine: toy\nenv_prefixes: [TOY_]\nknobs: {}\n")
    with pytest.raises(ProfileError) as info:
        catalog.load_catalog(path)
    assert info.value.problems == [f"{path}: serve: required field is missing"]

"""The SPACE file: every bad input is one line naming the file and the key, and nothing runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from knobfleet.cli.tune import load_space
from knobfleet.ops import profiles as app
from knobfleet.profiles import catalog as catalogs
from knobfleet.tune import bounds, space
from knobfleet.tune.space import SpaceError
from tests.unit.tune.tune_fixtures import SEED_SPACE


def parsed(tmp_path: Path, **changes: object) -> space.Space:
    doc = yaml.safe_load(SEED_SPACE)
    for dotted, value in changes.items():
        keys = dotted.split("__")
        target = doc
        for k in keys[:-1]:
            target = target.setdefault(k, {})
        if value is None:
            target.pop(keys[-1], None)
        else:
            target[keys[-1]] = value
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(doc))
    sp = load_space(p)
    st = app.store()
    base = st.resolve(sp.base)
    space.check_against(sp, catalogs.catalog_for(base.engine, st.catalog_dir, base.validated_on))
    return sp


def test_the_seed_space_parses_into_its_grid(tmp_path: Path) -> None:
    sp = parsed(tmp_path)
    assert (sp.name, sp.base, sp.result) == ("seed", "ctas512", "seed-best")
    assert len(space.grid(sp.knobs)) == 15 and sp.kernel_knobs == list(sp.knobs)
    assert sp.traffic == {48: 0.3, 64: 0.3, 80: 0.3, 96: 0.1} and sp.engine.conc == (48, 64, 80, 96)
    assert (sp.budget.wall_s, sp.budget.host_s, sp.budget.gpu_s) == (7200, 3600, 0)
    assert sp.sha256.startswith("sha256:") and len(sp.sha256) == 71


def test_a_range_expands_and_live_traffic_is_kept_for_load_profile(tmp_path: Path) -> None:
    sp = parsed(tmp_path, knobs__SGLANG_SM120_MMA_TARGET_CTAS={"min": 256, "max": 768, "step": 128}, traffic="live")
    assert sp.knobs["SGLANG_SM120_MMA_TARGET_CTAS"] == (256, 384, 512, 640, 768)
    assert sp.traffic is None


BAD = [
    # (change, the key named, a word of the fix)
    ({"knobs__SGLANG_SM120_MMA_TARGET_CTAZ": [1]}, "knobs.SGLANG_SM120_MMA_TARGET_CTAZ", "did you mean"),
    ({"knobs__SGLANG_SM120_MMA_BLOCK_H": [16, 48]}, "knobs.SGLANG_SM120_MMA_BLOCK_H", "not one of"),
    ({"knobs__SGLANG_SM120_MMA_TARGET_CTAS": {"min": 0, "max": 512, "step": 256}}, "TARGET_CTAS", "out of range"),
    ({"knobs__SGLANG_SM120_MMA_TARGET_CTAS": [512, 100000]}, "TARGET_CTAS", "out of range"),
    ({"knobs": {}}, "knobs", "empty"),
    ({"knobs__SGLANG_SM120_MMA_TARGET_CTAS": []}, "TARGET_CTAS", "no values"),
    ({"knobs__SGLANG_SM120_MMA_TARGET_CTAS": {"min": 512, "max": 256}}, "TARGET_CTAS", "min <= max"),
    ({"budget__host_minutes": 1}, "budget.host_minutes", "cannot cover one candidate"),
    ({"budget__wall": "soon"}, "budget.wall", "duration"),
    ({"budget": None}, "budget", "missing"),
    ({"stages__kernel": {}}, "stages.kernel", "names no GPU host"),
    ({"stages__kernel": {"host": "gpu1", "skip": "x"}}, "stages.kernel", "give one of"),
    ({"stages__engine__host": None}, "stages.engine.host", "name the host"),
    ({"stages__engine__conc": [48, 64]}, "stages.engine.conc", "traffic's buckets"),
    ({"stages__model__gpu": "h300"}, "stages.model.gpu", "unknown GPU"),
    ({"stages__live__advisory": "yes"}, "stages.live.advisory", "true or false"),
    ({"stages__warp": {}}, "stages.warp", "unknown stage"),
    ({"traffic": {48: -1}}, "traffic.48", "weight >= 0"),
    ({"traffic": {48: 0}}, "traffic", "add up to 0"),
    ({"name": "Seed Space"}, "name", "lower-case"),
    ({"schema_version": 2}, "schema_version", "expected 1"),
    ({"colour": "blue"}, "colour", "unknown key"),
    # issue 56: a token-shaped value would reach the record, the page and the winner's profile
    (
        {"knobs__SGLANG_API_KEY": ["sk-proj-abcdefghijklmnopqrstuvwx", "x"]},
        "knobs.SGLANG_API_KEY",
        "looks like a secret",
    ),
    ({"knobs__SGLANG_UPSTREAM": ["postgres://u:pa/ss@db/x"]}, "knobs.SGLANG_UPSTREAM", "a URL with a password"),
]


@pytest.mark.parametrize(("change", "key", "fix"), BAD, ids=[b[1] + "-" + b[2].split()[0] for b in BAD])
def test_a_bad_space_is_one_line_naming_the_file_and_the_key(
    tmp_path: Path, change: dict[str, object], key: str, fix: str
) -> None:
    with pytest.raises(SpaceError) as err:
        parsed(tmp_path, **change)
    lines = err.value.problems
    assert len(lines) == 1, lines
    assert "s.yaml: " in lines[0]
    assert key in lines[0] and fix in lines[0], lines[0]


def test_no_kernel_knob_needs_no_gpu_host(tmp_path: Path) -> None:
    sp = parsed(tmp_path, knobs={"SGLANG_OPT_USE_MULTI_STREAM_OVERLAP": [0, 1]}, stages__kernel=None)
    assert sp.kernel_knobs == [] and sp.kernel.host is None


@pytest.mark.parametrize("kind", ["fifo", "device", "symlink-to-fifo", "dir", "missing"])
def test_a_space_path_that_is_not_a_regular_file_is_refused_unread(tmp_path: Path, kind: str) -> None:
    """Only nodes this test makes in its temp dir: a FIFO (a read would block), a character device like
    /dev/zero (a read would never end), a symlink to a FIFO, a folder, nothing."""
    import os
    import stat

    p = tmp_path / "s.yaml"
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "device":
        if os.geteuid() != 0:
            pytest.skip("making a device node needs root (CI runs as root)")
        os.mknod(p, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # the zero device's numbers, here in tmp_path
    elif kind == "symlink-to-fifo":
        os.mkfifo(tmp_path / "pipe")
        p.symlink_to(tmp_path / "pipe")
    elif kind == "dir":
        p.mkdir()
    with pytest.raises(SpaceError) as err:
        load_space(p)
    assert "s.yaml" in str(err.value) and "\n" not in str(err.value)


def test_the_shipped_seed_space_parses_and_checks_against_the_catalog() -> None:
    from tests.conftest import REPO

    sp = load_space(REPO / "profiles" / "spaces" / "seed.yaml")
    st = app.store()
    base = st.resolve(sp.base)
    space.check_against(sp, catalogs.catalog_for(base.engine, st.catalog_dir, base.validated_on))
    assert (sp.name, sp.result, sp.live.advisory, len(space.grid(sp.knobs))) == ("seed", "seed-tuned", True, 15)


MORE_BAD = [
    ({"budget__host_minutes": "lots"}, "budget.host_minutes: 'lots': expected a number of minutes >= 0"),
    ({"stages__engine__min_effect": 2}, "stages.engine.min_effect: 2: expected a fraction in [0, 1)"),
    ({"stages__engine__max_regression": -1}, "stages.engine.max_regression: -1: expected a fraction in [0, 1)"),
    ({"knobs__SGLANG_SM120_MMA_BLOCK_H": 32}, "knobs.SGLANG_SM120_MMA_BLOCK_H: expected a list of values or a range"),
    ({"base": None}, "s.yaml: base: missing: name the current profile"),
    ({"stages__kernel": {"host": "gpu1"}}, "budget.gpu_minutes: 0: the kernel stage runs on a GPU host"),
]

EVEN_MORE_BAD = [
    ({"stages__engine__round": "soon"}, "stages.engine.round: 'soon': expected a duration such as 60s"),
    ({"stages__kernel": {"host": 7}}, "stages.kernel.host: 7: expected an inventory host name"),
    ({"knobs__SGLANG_SM120_MMA_TARGET_CTAS": {"min": 1.5, "max": 4}}, "TARGET_CTAS: a range takes integers"),
    ({"budget__wall": -5}, "budget.wall: -5: expected a duration"),
    ({"budget__wall": float("inf")}, "budget.wall: inf: expected a duration"),
]


@pytest.mark.parametrize(
    ("change", "line"), MORE_BAD + EVEN_MORE_BAD, ids=[b[1].split(":")[0] for b in MORE_BAD + EVEN_MORE_BAD]
)
def test_more_bad_spaces_say_exactly_what(tmp_path: Path, change: dict[str, object], line: str) -> None:
    with pytest.raises(SpaceError) as err:
        parsed(tmp_path, **change)
    assert len(err.value.problems) == 1 and line in err.value.problems[0], err.value.problems


def test_every_setting_reaches_its_stage(tmp_path: Path) -> None:
    sp = parsed(
        tmp_path,
        description="why we tune",
        stages__engine={"host": "lab1", "min_effect": 0.02, "max_regression": 0.05, "n_mult": 2, "max_tokens": 64},
        stages__kernel={"sweep": "sweep.json", "keep": 5, "budget": "2m"},
        budget={"wall": "90m", "host_minutes": 30, "gpu_minutes": 2.5},
    )
    assert sp.description == "why we tune"
    e = sp.engine
    assert (e.min_effect, e.max_regression, e.n_mult, e.max_tokens) == (0.02, 0.05, 2, 64)
    assert (sp.kernel.sweep, sp.kernel.keep, sp.kernel.budget_s) == ("sweep.json", 5, 120.0)
    assert (sp.budget.wall_s, sp.budget.host_s, sp.budget.gpu_s) == (5400.0, 1800.0, 150.0)


def test_the_round_cost_and_durations_are_read(tmp_path: Path) -> None:
    sp = parsed(tmp_path, stages__engine={"host": "lab1", "round": "45s"}, budget={"wall": 600, "host_minutes": 10})
    assert sp.engine.round_s == 45.0 and sp.budget.wall_s == 600.0
    from knobfleet.tune import space_fields

    assert (
        space_fields.duration("2h") == 7200 and space_fields.duration(0) is None and space_fields.duration(True) is None
    )


@pytest.mark.parametrize(
    ("sizes", "buckets", "found"),
    [
        ((4000, 6), 4, "knobs: 24000 candidates: more than 20000"),  # the record would pass the reader's 8 MiB
        ((2000, 5), 200, "traffic: 10000 candidates at 200 traffic buckets: more than 1,000,000 model scores"),
        ((2000, 5), 100, None),
    ],
)
def test_the_model_stages_work_and_the_records_size_are_bounded(
    tmp_path: Path, sizes: tuple[int, ...], buckets: int, found: str | None
) -> None:
    """Issue 56: bounded by work, not by the file's size (a 4 KB SPACE of many buckets ran for minutes)."""
    problems: list[str] = []
    knobs = {f"K{i}": tuple(range(n)) for i, n in enumerate(sizes)}
    traffic = {c: 1.0 for c in range(1, buckets + 1)}
    engine = space.EngineStage(host="")
    space._across(knobs, {"skip": "x"}, space.Budget(3600.0, 3600.0, 0.0), True, space.KernelStage(skip="x"), engine,
                  lambda key, what: problems.append(f"{key}: {what}"))  # fmt: skip
    bounds.model_work(knobs, traffic, engine.conc, lambda key, what: problems.append(f"{key}: {what}"))
    assert [p for p in problems if found and p.startswith(found)] == ([problems[0]] if found else [])
    assert len(problems) == (1 if found else 0), problems

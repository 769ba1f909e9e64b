"""Issue 56, item 5: the generated attack harness (``tests/unit/security/attack``). The CLI's argparse tree is walked
(every command, nested ones included, every option and positional, classified by the tables of ``attack.tree``) and
the documented file kinds found in a project (``attack.plan.PLACES``); the standard hostile set of each class
(``attack.values.VALUES``: FIFOs, devices, links out, dangling and looping, folders, 2 GiB sparse files, 100,000
levels of nesting, 5,000 digits, NaN and Infinity, bidi controls, ANSI escapes, NUL, blank letters, 100 KB strings,
secret-shaped values and a vault value, and URLs of servers on 127.0.0.1 that close at once, trickle a byte a second
or redirect off the machine) is sampled with a seed, two values or more per option, every (class, value) pair
somewhere, and each case is run as the real command line and held to the bounds (``attack.runner``). One test per
case; a case that fails on a bug not fixed here is marked with the bug (``KNOWN``)."""

from __future__ import annotations

import argparse
import re
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.unit.security.attack import plan as attack_plan
from tests.unit.security.attack import tree
from tests.unit.security.attack.plan import PER_OPTION, Case, Place, plan
from tests.unit.security.attack.runner import Harness, Result
from tests.unit.security.attack.values import VALUES

PLAN = plan(tree.build())

# Cases that fail on a bug in a module this change does not touch: (fields each matched by a regex, the bug).
# Fields: command (its words), dest, cls, value.
KNOWN: tuple[tuple[dict[str, str], str], ...] = ()


def known(case: Case) -> str | None:
    if isinstance(case.option, Place) or case.command is None:
        return None
    fields = {"command": " ".join(case.command.path), "dest": case.option.dest, "cls": case.option.cls,
              "value": case.value}  # fmt: skip
    return next((why for want, why in KNOWN if all(re.search(rx, fields[k]) for k, rx in want.items())), None)


def params() -> list[object]:
    out = []
    for c in PLAN.cases:
        why = known(c)
        marks = [pytest.mark.xfail(reason=why, strict=False)] if why else []
        out.append(pytest.param(c, id=f"{c.no}:{c.id}", marks=marks))
    return out


@pytest.fixture(scope="module")
def results(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Result]:
    """Every selected case, run once, ``runner.WORKERS`` at a time; the coverage line printed."""
    wanted = {
        item.callspec.params["case"].no
        for item in request.session.items
        if getattr(item, "originalname", "") == "test_a_hostile_value_is_answered_within_the_bounds"
    }
    cases = [c for c in PLAN.cases if c.no in wanted]
    harness = Harness(tmp_path_factory.mktemp("attack"))
    started = time.monotonic()
    try:
        harness.prepare()
        done = harness.run(cases)
    finally:
        harness.close()
    took = time.monotonic() - started
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        slowest = max(done, key=lambda r: r.seconds, default=None)
        with capture.global_and_fixture_disabled():  # the coverage line shows with -q too
            reporter.write_line(
                f"\n{PLAN.coverage()}; ran {len(done)} in {took:.0f}s"
                + (f" (slowest {slowest.seconds:.1f}s: {slowest.case.id})" if slowest else "")
            )
    SERVED.update(harness.servers.hits)
    return {r.case.no: r for r in done}


SERVED: dict[str, int] = {}  # connections each URL server took during the run


@pytest.mark.parametrize("case", params())
def test_a_hostile_value_is_answered_within_the_bounds(results: dict[int, Result], case: Case) -> None:
    r = results[case.no]
    assert not r.problems, r.shown()


def test_every_url_server_was_reached_and_the_redirect_never_followed(results: dict[int, Result]) -> None:
    """Each URL case reached its server on 127.0.0.1 (a case that stopped short would prove nothing), and no
    redirect was followed off the machine: the driver refuses and logs a connection there, which fails the case."""
    ran = {r.case.value for r in results.values() if r.case.option.cls == "url"}
    for value, server in (("url_close", "close"), ("url_trickle", "trickle"), ("url_redirect", "redirect")):
        if value in ran:
            assert SERVED.get(server, 0) >= 1, (value, SERVED)
    assert not [r.case.id for r in results.values() if any(kind == "connect" for kind, _ in r.log)]


def test_every_option_gets_two_values_and_every_class_value_pair_is_thrown() -> None:
    per_option = Counter(c.option.id for c in PLAN.cases)
    options = [o for cmd in tree.build() for o in cmd.options]
    assert options and all(per_option[o.id] >= PER_OPTION for o in options)
    assert all(per_option[p.id] >= PER_OPTION for p in attack_plan.PLACES)
    thrown = {(c.option.cls, c.value) for c in PLAN.cases}
    assert thrown == {(cls, v) for cls, vals in VALUES.items() for v in vals}
    nested = {cmd.path for cmd in tree.build() if len(cmd.path) > 1}
    assert {("profiles", "show"), ("catalog", "sync"), ("kernel", "bench"), ("lab", "up")} <= nested
    print(PLAN.coverage())


def test_the_tables_classify_the_options_whose_class_is_known() -> None:
    by_id = {o.id: o for cmd in tree.build() for o in cmd.options}
    expected = {
        "render --inventory": ("path", "inventory", False),
        "render --vault-password-file": ("path", "vault", False),
        "tune space": ("path", "space", False),
        "report record": ("path", "record", False),
        "waves-calibrate sweeps": ("path", "sweep", False),
        "report --out": ("path", "html", True),
        "init directory": ("path", "folder", True),
        "load-profile --prometheus": ("url", "", False),
        "load-profile --window": ("duration", "", False),
        "apply --max-fail-percent": ("number", "", False),
        "render --host": ("string", "", False),
        "render --what": ("choice", "", False),
        "apply --yes": ("flag", "", False),
    }
    assert {k: (by_id[k].cls, by_id[k].kind, by_id[k].output) for k in expected} == expected


def _with_a_new_command(real: object) -> object:
    def build(command: str | None = None) -> argparse.ArgumentParser:
        from knobfleet import argtypes

        parser = real(command)  # type: ignore[operator]
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        p = sub.add_parser("zz-new", help="a command added after the harness was written")
        p.add_argument("--input", type=argtypes.input_file(1024, "input file"), help="what it reads")
        p.add_argument("--count", type=argtypes.POSITIVE, help="how many")
        p.set_defaults(func=lambda args: 0)
        return parser

    return build


def test_a_new_option_is_covered_with_no_new_test_code(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A command with a path option and a number option, added to a copy of the parser: the walk finds both, the
    tables class them, the plan throws each class's values at them, and the command lines it makes are refused by
    the new options' own checks in one line (parsed here, in the test, with the parser that has them)."""
    import contextlib
    import io

    import knobfleet.cli

    monkeypatch.setattr(knobfleet.cli, "build_parser", _with_a_new_command(knobfleet.cli.build_parser))
    fresh = plan(tree.build())
    mine = [c for c in fresh.cases if c.command is not None and c.command.path == ("zz-new",)]
    got = {(c.option.dest, c.option.cls) for c in mine}
    assert {("input", "path"), ("count", "number")} <= got
    assert sum(c.option.dest == "input" for c in mine) >= PER_OPTION
    assert sum(c.option.dest == "count" for c in mine) >= PER_OPTION

    harness = Harness(tmp_path)
    harness.prepare()
    try:
        parser = knobfleet.cli.build_parser()
        for case in mine:
            if case.option.cls == "flag":
                continue
            slot = tmp_path / "slot"
            slot.mkdir(exist_ok=True)
            harness.reset(slot)
            prepared = harness.compose(case, slot)
            assert prepared.argv[0] == "zz-new"
            err = io.StringIO()
            monkeypatch.chdir(slot / "proj")
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                try:
                    code = knobfleet.cli.run(prepared.argv, parser)
                except SystemExit as exc:
                    code = exc.code  # type: ignore[assignment]
            assert code in (0, 64), (case.id, code, err.getvalue())
            if code == 64:
                assert len(err.getvalue().strip().splitlines()) == 1, (case.id, err.getvalue())
    finally:
        harness.close()


def test_a_sweep_whose_fit_finds_no_time_per_token_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the harness: the sweep it used as the benign one, its first launch 1 us instead of 13.3."""
    from knobfleet import cli
    from tests.unit.security.attack.values import Shape, sweep_doc

    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))
    sweep = tmp_path / "sweep.json"
    sweep.write_text(sweep_doc(Shape()).replace('"attn_us": 13.30', '"attn_us": 1', 1))
    code = cli.run(["waves", "calibrate", str(sweep), "--dry-run"])
    err = capsys.readouterr().err
    assert "internal error" not in err and code in (0, 1), err

"""Global options (--debug, -v, --examples) work before the command and after it, on every command."""

from __future__ import annotations

import argparse

import pytest

from knobfleet.cli import build_parser


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found: list[tuple[str, ...]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append((*prefix, name))
                found.extend(_commands(sub, (*prefix, name)))
    return found


@pytest.mark.parametrize(
    ("argv", "debug", "verbose", "examples"),
    [
        (["render", "ctas512"], False, None, False),
        (["--examples", "render", "ctas512"], False, None, True),
        (["render", "ctas512", "--examples"], False, None, True),
        (["render", "--examples", "ctas512", "-v"], False, 1, True),
        (["render", "ctas512", "-vv", "--debug"], True, 2, False),
        (["-v", "--debug", "drift"], True, 1, False),
        (["drift", "-v"], False, 1, False),
        (["profiles", "validate", "--examples"], False, None, True),
        (["lab", "status", "--debug"], True, None, False),
    ],
)
def test_global_options_before_or_after_the_command(
    argv: list[str], debug: bool, verbose: int | None, examples: bool
) -> None:
    args = build_parser().parse_args(argv)
    assert (args.debug, args.verbose, args.examples) == (debug, verbose, examples)


def test_every_command_accepts_the_global_options_after_it() -> None:
    parser = build_parser()
    missing = []
    for path in _commands(parser):
        sub = parser
        for word in path:
            sub = next(a for a in sub._actions if isinstance(a, argparse._SubParsersAction)).choices[word]
        options = {o for a in sub._actions for o in a.option_strings}
        if not {"--debug", "-v", "--examples"} <= options:
            missing.append(" ".join(path))
    assert missing == []


def test_help_lists_every_environment_variable_the_package_reads() -> None:
    import re
    from pathlib import Path

    import knobfleet
    from knobfleet.cli import EPILOG

    package = Path(knobfleet.__file__).parent
    read = set()
    for source in package.rglob("*.py"):
        read |= set(re.findall(r"\bKNOBFLEET_[A-Z][A-Z_]*[A-Z]\b", source.read_text(encoding="utf-8")))
    assert sorted(name for name in read if name not in EPILOG) == []

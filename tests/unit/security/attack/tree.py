"""The CLI's argparse tree, walked from the parser ``knobfleet.cli.build_parser`` builds: every command (nested ones
included, an alias once), every option and positional, each put in a class (``CLASSES``), a file kind (``KINDS``) and
a role (``OUTPUT``) by tables read top to bottom, the first row whose every field matches winning. A field is the
text of one attribute of the argparse action: ``type`` (the type function's ``__name__`` and ``__qualname__``: the
checks of ``knobfleet.cli.types`` name what they read), ``dest``, ``metavar``, ``help``, ``nargs``, ``choices`` and
``positional``. An option added tomorrow falls into a class by these rows, with no new code."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")

CLASSES: tuple[tuple[str, dict[str, str]], ...] = (
    ("flag", {"nargs": r"^0$"}),  # store_true, count, version: no value
    ("choice", {"choices": r"."}),
    ("path", {"type": r"\b(output_file|output_dir|html_file|report_target|calibrations_file|inventory|vault_id)\b"}),
    ("path", {"type": r"\bfile\b"}),  # input_file(MAX, "sweep file"): the check is named after what it reads
    ("duration", {"type": r"\bduration\b"}),
    ("number", {"type": r"\b(integer|number|serial|int_list|_ints|buckets|weights_option)\b"}),
    ("url", {"metavar": r"\bURL\b"}),
    ("url", {"help": r"\bURLs?\b"}),
    ("path", {"metavar": r"\b(DIR|FILE|PATH|VENV_PYTHON)\b"}),
    ("path", {"help": r"\bor path\b|\bthe record\b|\b[A-Z]{2,} file\b"}),  # "name or path", "the SPACE file"
    ("path", {"help": r"\bprofile\b", "positional": r"yes"}),  # a profile is named, or given by its path
    ("number", {"help": r"\b(comma-separated|number of|seconds)\b"}),
    ("number", {"metavar": r"^(N|S|SECONDS)$"}),
    ("string", {}),
)

# What a path names: the documented file kinds (what the content of a hostile file of that kind looks like) and the
# outputs. Read for class path only.
KINDS: tuple[tuple[str, dict[str, str]], ...] = (
    ("inventory", {"type": r"\binventory\b"}),
    ("vault", {"dest": r"^vault_"}),
    ("sweep", {"type": r"\bsweep\b"}),
    ("calibrations", {"type": r"\bcalibrations_file\b"}),
    ("html", {"type": r"\b(html_file|report_target)\b"}),
    ("folder", {"type": r"\boutput_dir\b"}),
    ("folder", {"metavar": r"^DIR$"}),
    ("prom", {"dest": r"^prom$"}),
    ("space", {"help": r"\bSPACE\b"}),
    ("record", {"help": r"\brecord\b", "positional": r"yes"}),
    ("program", {"metavar": r"PYTHON"}),
    ("profile", {"help": r"\bprofiles?\b"}),
    ("json", {}),
)

# Whether a path is written (its value, and everything under it, is a declared output of the case) or read.
OUTPUT: tuple[tuple[bool, dict[str, str]], ...] = (
    (True, {"type": r"\b(output_file|output_dir|html_file|report_target|calibrations_file)\b"}),
    (True, {"help": r"\b(to create|write it|write the raw)\b"}),
    (False, {}),
)

SKIPPED = (argparse._HelpAction, argparse._SubParsersAction)


@dataclass(frozen=True)
class Option:
    """One option or positional of one command, classified."""

    command: tuple[str, ...]  # ("profiles", "show"); () for the top parser's own options
    dest: str
    flags: tuple[str, ...]  # its option strings; () for a positional
    cls: str
    kind: str  # the file kind of a path; "" for the other classes
    output: bool
    required: bool
    nargs: object
    choices: tuple[str, ...] | None

    @property
    def flag(self) -> str | None:
        """The spelling used on the command line: the longest option string (``--inventory`` over ``-i``)."""
        return max(self.flags, key=len) if self.flags else None

    @property
    def id(self) -> str:
        return " ".join([*self.command, self.flag or self.dest]) if self.command else self.flag or self.dest


@dataclass
class Command:
    path: tuple[str, ...]
    options: list[Option] = field(default_factory=list)
    runnable: bool = True  # a leaf with a handler; a group (``profiles``) only dispatches

    @property
    def positionals(self) -> list[Option]:
        return [o for o in self.options if not o.flags]


def fields(action: argparse.Action) -> dict[str, str]:
    t = action.type
    type_text = " ".join(str(getattr(t, a, "")) for a in ("__name__", "__qualname__")) if t is not None else ""
    return {
        "type": type_text,
        "dest": action.dest,
        "metavar": "" if action.metavar is None else str(action.metavar),
        "help": action.help or "",
        "nargs": str(action.nargs),
        "choices": "yes" if action.choices else "",
        "positional": "" if action.option_strings else "yes",
    }


def first(table: tuple[tuple[T, dict[str, str]], ...], text: dict[str, str]) -> T:
    for value, wanted in table:
        if all(re.search(rx, text[name]) for name, rx in wanted.items()):
            return value
    raise LookupError(text)  # every table ends with a row that matches anything


def classify(command: tuple[str, ...], action: argparse.Action) -> Option:
    text = fields(action)
    cls = first(CLASSES, text)
    return Option(
        command=command,
        dest=action.dest,
        flags=tuple(action.option_strings),
        cls=cls,
        kind=first(KINDS, text) if cls == "path" else "",
        output=first(OUTPUT, text) if cls == "path" else False,
        required=bool(action.required),
        nargs=action.nargs,
        choices=tuple(str(c) for c in action.choices) if action.choices else None,
    )


def walk(parser: argparse.ArgumentParser) -> list[Command]:
    """Every command of ``parser``, depth first, the top parser first. The options the top parser gives every
    command (``--debug``, ``-v``, ``--examples``: default SUPPRESS there) are counted once, on the top parser."""
    top = {o for a in parser._actions for o in a.option_strings}
    seen: set[int] = set()
    commands: list[Command] = []

    def visit(p: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        if id(p) in seen:  # an alias (apply-profile) is the same parser
            return
        seen.add(id(p))
        groups = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        cmd = Command(path, runnable=not groups or p.get_default("func") is not None)
        commands.append(cmd)
        for a in p._actions:
            if isinstance(a, SKIPPED):
                continue
            if path and a.default is argparse.SUPPRESS and set(a.option_strings) & top:
                continue
            cmd.options.append(classify(path, a))
        for g in groups:
            for name, sub in g.choices.items():
                visit(sub, (*path, name))

    visit(parser, ())
    return commands


def build(builder: Callable[[], argparse.ArgumentParser] | None = None) -> list[Command]:
    """The tree of the parser the CLI builds now (``knobfleet.cli.build_parser``, looked up at call time so a test
    can replace it)."""
    if builder is None:
        import knobfleet.cli

        builder = knobfleet.cli.build_parser
    return walk(builder())

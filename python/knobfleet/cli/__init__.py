# PYTHON_ARGCOMPLETE_OK  (shell completion with the optional extra knobfleet[completion])
"""Thin command layer: each module in this package is one command group with a ``register(sub)``; a command
parses, calls one use case (ops/, experiment/, lab/), prints through ``report`` and returns an exit code.
One error boundary (``run``) maps every exception to its exit code; ``--debug`` shows the traceback.

Heavy imports (ansible, pydantic models, rich) happen inside the commands that need them, so
``knobfleet --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from knobfleet import __version__
from knobfleet.errors import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, KnobfleetError

Handler = Callable[[argparse.Namespace], int]
# The flat registry: command modules in the order `knobfleet --help` lists them.
COMMANDS = (
    "init",
    "profiles",
    "catalog",
    "render",
    "apply",
    "drift",
    "history",
    "router",
    "bench",
    "telemetry",
    "tune",
    "report",
    "kernel",
    "lab",
)
# Commands whose module is registered alone when they are the command run: the read path (drift, verify) then
# loads no other command's module (the kernel commands alone cost ~17 ms). `--help` lists every command.
ALONE = {"drift": "drift", "verify": "drift"}

EPILOG = """exit codes:
  0   success / in sync
  1   error, or a failed apply (after restoring the previous generation)
  2   drift, verification mismatch, changes pending (plan), or an inconclusive A/B (ab)
  3   a restore failed: manual steps are printed
  4   some host unreachable or erroring during a read-only check
  6   both 2 and 4
  64  usage error (bad command line)
  130 interrupted

environment:
  KNOBFLEET_INVENTORY, KNOBFLEET_LIMIT, KNOBFLEET_VIA   defaults of -i, --limit, --via
  KNOBFLEET_FORKS                                        hosts probed at once (drift, verify: --forks)
  KNOBFLEET_VERBOSE=1|2, KNOBFLEET_EXAMPLES=1            as -v / -vv and --examples
  KNOBFLEET_HOME, KNOBFLEET_STATE_DIR                    project and state folders
  KNOBFLEET_LAB=ID                                       the lab commands mean (lab up --id ID), when several run
  KNOBFLEET_INVENTORY_CACHE=0                            re-read the inventory and host views every time
  KNOBFLEET_HEADSTART=0                                  drift/verify: no probe started before the imports
  KNOBFLEET_SSH_MUX=0                                    drift/verify: ssh clients, not sessions of the ControlMaster
  KNOBFLEET_VLLM_CACHE                                   where the lab's real vLLM is installed (/var/cache/knobfleet)
  KNOBFLEET_PROMETHEUS                                   load-profile's --prometheus
  ANSIBLE_INVENTORY, ANSIBLE_CONFIG, ANSIBLE_VAULT_*     read as Ansible reads them

shell completion: pip install 'knobfleet[completion]'; eval "$(register-python-argcomplete knobfleet)"
"""


def _width() -> int:
    """The help's width as argparse computes it (``shutil.get_terminal_size``), without importing shutil: argparse
    builds a formatter for every ``add_argument`` and shutil (with bz2, lzma, zlib) cost every command ~5 ms."""
    import os

    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns if sys.__stdout__ else 80
        except (AttributeError, ValueError, OSError):
            columns = 80
    return max(columns or 80, 22) - 2


class _Formatter(argparse.HelpFormatter):
    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None):
        super().__init__(prog, indent_increment, max_help_position, _width() if width is None else width)


class _RawFormatter(_Formatter, argparse.RawDescriptionHelpFormatter):
    """The top parser's: its epilog (exit codes, environment) is laid out by hand."""


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on a bad command line; here that is 64, so it never reads as "drift found". Every parser
    (and sub-parser) formats its help with ``_Formatter`` unless it asks for another."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        from knobfleet.argtypes import REFUSED

        if not any(message.endswith(r) for r in REFUSED):  # a refused value is one line; a bad command line shows usage
            self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {_visible(message)}\n")
        raise SystemExit(EXIT_USAGE)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of ``command``'s module alone when it is in ``ALONE``."""
    import importlib

    parser = _Parser(
        prog="knobfleet",
        description="Deploy and verify GPU engine knob profiles.",
        epilog=EPILOG,
        formatter_class=_RawFormatter,
    )
    parser.add_argument("--version", action="version", version=f"knobfleet {__version__}")
    _global_options(parser, None)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in (ALONE[command],) if command in ALONE else COMMANDS:
        importlib.import_module(f"knobfleet.cli.{name}").register(sub)
    _global_options_everywhere(sub)
    _complete(parser)
    return parser


def _global_options(parser: argparse.ArgumentParser, default: object) -> None:
    """--debug, -v and --examples. On a command's parser their default is SUPPRESS, so a global option given
    before the command is kept and one given after it (``knobfleet render --examples …``) works too."""
    bool_default = False if default is None else default
    parser.add_argument(
        "--debug", action="store_true", default=bool_default, help="show a traceback for unexpected errors"
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=default,
        help="show Ansible's output and each run's artifact folder; -vv also runs ansible-playbook -v "
        "(default: $KNOBFLEET_VERBOSE)",
    )
    parser.add_argument(
        "--examples",
        action="store_true",
        default=bool_default,
        help="use knobfleet's built-in example profiles instead of the project's (or $KNOBFLEET_EXAMPLES=1)",
    )


def _global_options_everywhere(sub: argparse._SubParsersAction[Any]) -> None:
    """Give every command parser (and their own sub-commands') the global options, unless it has its own."""
    seen: set[int] = set()
    todo = list(sub.choices.values())
    while todo:
        p = todo.pop()
        if id(p) in seen:
            continue
        seen.add(id(p))
        taken = {o for a in p._actions for o in a.option_strings}
        if not taken & {"--debug", "-v", "--verbose", "--examples"}:
            _global_options(p, argparse.SUPPRESS)
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo.extend(action.choices.values())


def _complete(parser: argparse.ArgumentParser) -> None:
    """Shell completion when argcomplete (the optional extra knobfleet[completion]) is installed and the shell
    asked for it; otherwise nothing."""
    import os

    if "_ARGCOMPLETE" not in os.environ:
        return
    try:
        import argcomplete
    except ImportError:
        return
    argcomplete.autocomplete(parser)


def _command(argv: Sequence[str]) -> str | None:
    """The command word of ``argv`` (global options before it are flags without values)."""
    return next((a for a in argv if not a.startswith("-")), None)


def run(argv: Sequence[str] | None, parser: argparse.ArgumentParser | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = parser or build_parser(_command(argv))
    if argv[:2] == ["waves", "calibrate"]:  # `waves PROFILE` has a positional; calibrate is its own command
        argv = ["waves-calibrate", *argv[2:]]
    args = parser.parse_args(argv)
    _environment(args)
    func: Handler | None = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return func(args)
    except KnobfleetError as exc:
        sys.stderr.write(f"{_visible(_scrubbed(str(exc)))}\n")
        return exc.exit_code
    except OSError as exc:  # a file or folder knobfleet could not read or write: one line, never a traceback
        if getattr(args, "debug", False):
            raise
        where = f"{_visible(_scrubbed(str(exc.filename)))}: " if exc.filename else ""
        sys.stderr.write(f"knobfleet: {where}{_scrubbed(str(exc.strerror or exc))}; nothing more was done\n")
        return EXIT_ERROR
    except KeyboardInterrupt:
        sys.stderr.write("knobfleet: interrupted\n")
        return EXIT_INTERRUPTED
    except Exception as exc:  # the one boundary: no input ever ends in a traceback unless asked
        if getattr(args, "debug", False):
            raise
        return _unexpected(exc)


def _environment(args: argparse.Namespace) -> None:
    """Global options become the environment knobfleet's layers (and the Ansible runs) read."""
    import os

    if getattr(args, "vault_password_file", None):  # for knobfleet's inventory reads and every ansible run
        os.environ["ANSIBLE_VAULT_PASSWORD_FILE"] = str(args.vault_password_file)
    if getattr(args, "vault_id", None):
        os.environ["ANSIBLE_VAULT_IDENTITY_LIST"] = ",".join(args.vault_id)
    if getattr(args, "verbose", None):
        os.environ["KNOBFLEET_VERBOSE"] = str(args.verbose)
    if getattr(args, "examples", False):
        os.environ["KNOBFLEET_EXAMPLES"] = "1"


def _visible(text: str) -> str:
    """Error text with raw terminal escapes, CR and invisible characters shown escaped (newlines kept)."""
    from knobfleet.report_text import visible

    return visible(text)


def _scrubbed(text: str) -> str:
    """What leaves the process as free text: no vault value this process decrypted, nothing shaped like a
    credential (``secretrule``, the one rule)."""
    from knobfleet import secretrule

    return secretrule.scrub(text)


def _unexpected(exc: Exception) -> int:
    import traceback

    from knobfleet import paths

    where = ""
    try:  # owner-only, never through a symlink or into a FIFO; a traceback may quote a value
        from knobfleet import safefile

        crash = paths.state_dir() / "crash.txt"
        crash.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        text = _scrubbed("".join(traceback.format_exception(exc)))  # a lone surrogate may be in it, too
        safefile.write_bytes(crash, text.encode("utf-8", "backslashreplace"), mode=0o600)
        where = f"; details in {crash}"
    except Exception:  # the boundary itself must not fail: the one line below is still printed
        pass
    text = _visible(_scrubbed(f"{type(exc).__name__}: {exc}"))
    sys.stderr.write(f"knobfleet: internal error: {text}{where} (re-run with --debug)\n")
    return EXIT_ERROR


def main(argv: Sequence[str] | None = None) -> int:
    return run(argv)


def apply_profile_main(argv: Sequence[str] | None = None) -> int:
    """``apply-profile PROFILE …`` is ``knobfleet apply PROFILE …``."""
    args = list(sys.argv[1:] if argv is None else argv)
    return run(["apply", *args])

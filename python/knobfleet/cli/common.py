"""What every command module shares: output helpers, the common options and the confirmation rule.

Common options take their defaults from ``KNOBFLEET_*`` environment variables (named in each --help):
KNOBFLEET_INVENTORY, KNOBFLEET_LIMIT, KNOBFLEET_VIA, KNOBFLEET_VERBOSE (-v), KNOBFLEET_EXAMPLES (--examples).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from knobfleet import argtypes
from knobfleet.cli import types

Sub = argparse._SubParsersAction  # the subparsers object each command module registers into


def out(text: str) -> None:
    text = text if text.endswith("\n") else text + "\n"
    # a path with a byte that is not UTF-8 (a lone surrogate) is shown escaped rather than failing the write
    sys.stdout.write(
        text.encode(sys.stdout.encoding or "utf-8", "backslashreplace").decode(sys.stdout.encoding or "utf-8")
    )


def err(text: str) -> None:
    sys.stderr.write(text if text.endswith("\n") else text + "\n")


def inventory_opts(p: argparse.ArgumentParser, limit: bool = True) -> None:
    p.add_argument(
        "-i",
        "--inventory",
        type=types.inventory,
        default=None,
        help="Ansible inventory (default: $KNOBFLEET_INVENTORY, $ANSIBLE_INVENTORY, the project's knobfleet.toml "
        "inventory, else the running lab's)",
    )
    if limit:
        p.add_argument(
            "--limit",
            "-l",
            default=os.environ.get("KNOBFLEET_LIMIT") or None,
            help="Ansible host pattern to restrict the run to (default: $KNOBFLEET_LIMIT, else every host)",
        )
    p.add_argument(
        "--vault-password-file",
        type=argtypes.input_file(argtypes.VAULT_PASSWORD_MAX, "vault password file"),
        default=None,
        metavar="FILE",
        help="password file for vault-encrypted inventory vars (default: ANSIBLE_VAULT_PASSWORD_FILE / ansible.cfg)",
    )
    p.add_argument(
        "--vault-id",
        type=argtypes.vault_id,
        action="append",
        default=None,
        metavar="ID@SOURCE",
        help="a vault identity, as ansible-playbook's --vault-id (repeatable; sets ANSIBLE_VAULT_IDENTITY_LIST)",
    )


def inventory(args: argparse.Namespace) -> Path:
    """-i, else the default inventory (fleet.inventory.default)."""
    if getattr(args, "inventory", None):
        return Path(args.inventory)
    from knobfleet.ops.fleet import default_inventory

    return default_inventory()


def via_opt(p: argparse.ArgumentParser, what: str) -> None:
    from knobfleet.ops.fleet import via_choices

    p.add_argument(
        "--via",
        choices=via_choices(),
        default=os.environ.get("KNOBFLEET_VIA") or "auto",
        help=f"how to reach hosts for {what}: auto (default, or $KNOBFLEET_VIA: ssh where it reaches a host as "
        "Ansible would, else ansible), ssh (the fast path), ansible (a playbook run) or local (this machine, no ssh)",
    )


def json_opt(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON document and nothing else")


def yes_opt(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--yes",
        "-y",
        action="store_true",
        help="do not ask for confirmation (needed without a terminal: cron, CI, pipes, --json)",
    )


def will_ask(args: argparse.Namespace) -> bool:
    """Whether ``confirm`` will put its question to a person (no --yes, no --json, a terminal)."""
    return not getattr(args, "yes", False) and not getattr(args, "json", False) and sys.stdin.isatty()


def confirm(command: str, question: str, n_hosts: int, args: argparse.Namespace) -> None:
    """Changing hosts needs a yes: ``--yes``, or an interactive answer. Without a terminal (cron, CI, a pipe) or
    with --json, refuse (exit 64) rather than proceed silently."""
    from knobfleet.errors import KnobfleetError, UsageError

    if getattr(args, "yes", False):
        return
    if getattr(args, "json", False) or not sys.stdin.isatty():
        raise UsageError(f"{command}: refusing to change {n_hosts} host(s) without confirmation; pass --yes")
    answer = input(f"{question} [y/N] ").strip().lower()
    if answer not in ("y", "yes"):
        raise KnobfleetError(f"{command}: cancelled; nothing was changed")

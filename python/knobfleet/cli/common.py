"""What every command module shares: output helpers and the common options."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

Sub = argparse._SubParsersAction  # the subparsers object each command module registers into


def out(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def err(text: str) -> None:
    sys.stderr.write(text if text.endswith("\n") else text + "\n")


def inventory_opts(p: argparse.ArgumentParser, limit: bool = True) -> None:
    p.add_argument("-i", "--inventory", type=Path, default=None, help="Ansible inventory (default: inventories/lab)")
    if limit:
        p.add_argument("--limit", "-l", default=None, help="Ansible host pattern to restrict the run to")
    p.add_argument(
        "--vault-password-file",
        default=None,
        metavar="FILE",
        help="password file for vault-encrypted inventory vars (default: ANSIBLE_VAULT_PASSWORD_FILE / ansible.cfg)",
    )


def via_opt(p: argparse.ArgumentParser, what: str) -> None:
    from knobfleet.fleet.transports import VIA

    p.add_argument(
        "--via",
        choices=VIA,
        default="auto",
        help=f"how to reach hosts for {what}: auto (default: ssh where it reaches a host as Ansible would, "
        "else ansible), ssh (the fast path) or ansible (a playbook run)",
    )

"""argparse types of the command line (``knobfleet.argtypes``), plus ``-i``, whose check reads the inventory's
files and so goes through ``ops.fleet`` (the CLI reaches the fleet package only through ops)."""

from __future__ import annotations

from pathlib import Path

from knobfleet.argtypes import (
    CALIBRATIONS_MAX,
    FRACTION,
    INVENTORY_MAX,
    NON_NEGATIVE,
    PERCENT,
    POSITIVE,
    REFUSED,
    SECONDS,
    SWEEP_MAX,
    VAULT_PASSWORD_MAX,
    _path,
    calibrations_file,
    checked,
    html_file,
    input_file,
    int_list,
    integer,
    number,
    output_dir,
    output_file,
    refuse,
    report_target,
    serial,
    vault_id,
)
from knobfleet.rules import shown

__all__ = [
    "CALIBRATIONS_MAX",
    "FRACTION",
    "INVENTORY_MAX",
    "NON_NEGATIVE",
    "PERCENT",
    "POSITIVE",
    "REFUSED",
    "SECONDS",
    "SWEEP_MAX",
    "VAULT_PASSWORD_MAX",
    "calibrations_file",
    "checked",
    "html_file",
    "input_file",
    "int_list",
    "integer",
    "inventory",
    "number",
    "output_dir",
    "output_file",
    "refuse",
    "report_target",
    "serial",
    "vault_id",
]


def inventory(value: str) -> Path:
    """-i: an inventory file or folder; every file in it a regular file of bounded size."""
    path = _path(value)
    from knobfleet.ops.fleet import check_sources

    why = check_sources(path)
    if why:
        raise refuse(f"{shown(value)}: {why}")
    return path

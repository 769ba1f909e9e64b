"""Which hostile values each option gets, and the command line each case runs.

Sampling: the options of a class, in the tree's order, take the class's values in turn from a list shuffled once
with the seed, ``PER_OPTION`` each; the turn goes on from one option to the next, so the set rotates across the
options; a value no option got by then is given to one more option of the class (chosen with the seed too), so
every (class, value) pair is thrown somewhere. ``KNOBFLEET_ATTACK_SEED`` picks another sample,
``KNOBFLEET_ATTACK_ALL=1`` throws every value of the class at every option (minutes)."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.unit.security.attack.tree import Command, Option
from tests.unit.security.attack.values import VALUES

SEED = int(os.environ.get("KNOBFLEET_ATTACK_SEED", "56"))
PER_OPTION = 2

# Commands run only as far as the command line is parsed (every type check runs; the handler is replaced by one that
# returns 0): what they do once the line is accepted acts on this machine or reaches out of it.
PARSE_ONLY: dict[tuple[str, ...], str] = {
    ("lab", "up"): "boots nspawn machines on this machine",
    ("lab", "down"): "stops nspawn machines of this machine",
    ("lab", "speed"): "changes a running lab host",
    ("lab", "ssh"): "execs ssh into a lab host",
    ("catalog", "sync"): "runs pip download from PyPI, or builds a vLLM venv",
}

# The top parser's own options run with this command after them.
TOP_COMMAND = ("profiles", "list")

# A valid value for an option that is not under test but must be given (required, or of a kind in GIVEN_ALWAYS):
# by kind for a path, else by class. "{inv}", "{vault_pw}" and "{url}" are the case's shared inventory, vault password
# file and a closed port on 127.0.0.1.
BENIGN_KIND = {
    "profile": "mybase",
    "space": "space.yaml",
    "record": "record.json",
    "sweep": "sweep.json",
    "inventory": "{inv}",
    "vault": "{vault_pw}",
    "calibrations": "calibrations.json",
    "html": "page.html",
    "prom": "out.prom",
    "folder": "newdir",
    "program": "prog",
    "json": "benign.json",
}
# By (command, dest): where the kind or class gives a value the command refuses before it looks at the option
# under test.
BENIGN_OPTION: dict[tuple[tuple[str, ...], str], str] = {
    (("profiles", "migrate"), "to"): "sglang@0.5.23",
    (("catalog", "versions"), "engine"): "sglang",
    (("catalog", "diff"), "engine"): "sglang",
    (("catalog", "diff"), "old"): "0.5.22",
    (("catalog", "diff"), "new"): "0.5.23",
    (("lab", "speed"), "host"): "lab1",
    (("lab", "ssh"), "host"): "lab1",
}
BENIGN_CLASS = {"string": "gpu1", "number": "1", "duration": "10s", "url": "{url}"}
# Options given even when optional: no case reads the project's example inventory (addresses of the documentation
# range) or writes the calibrations shipped in the package.
GIVEN_ALWAYS = {"inventory", "calibrations"}
# Extra arguments of a command's every case.
BASE: dict[tuple[str, ...], list[str]] = {
    ("render",): ["--what=env"],
}

# What a command writes besides its output options' values: paths relative to the working folder (the case's
# project), or a function of the case's values by dest.
OUTPUTS: dict[tuple[str, ...], list[str | Callable[[dict[str, str]], str]]] = {
    ("profiles", "lock"): ["profiles/profiles.lock"],
    ("profiles", "migrate"): ["profiles"],
    ("waves",): ["profiles"],  # --suggest: the candidate profiles
    ("report",): [lambda v: str(Path(v.get("record", "record.json")).with_suffix(".html"))],
}

# The exit codes a command may end with (its contract in DESIGN.md; the longest prefix of its path wins); any other
# command: every documented code (knobfleet --help, "exit codes").
CONTRACT: dict[tuple[str, ...], set[int]] = {
    (): {0, 1, 64, 130},  # local commands: init, profiles, catalog, render, waves, report, load-profile, lab
    ("drift",): {0, 1, 2, 4, 6, 64, 130},
    ("verify",): {0, 1, 2, 4, 6, 64, 130},
    ("plan",): {0, 1, 2, 4, 64, 130},
    ("apply",): {0, 1, 2, 3, 4, 64, 130},
    ("rollback",): {0, 1, 3, 4, 64, 130},
    ("history",): {0, 1, 4, 64, 130},
    ("router",): {0, 1, 2, 4, 64, 130},
    ("bench",): {0, 1, 2, 4, 64, 130},
    ("ab",): {0, 1, 2, 3, 4, 64, 130},
    ("canary",): {0, 1, 2, 3, 4, 64, 130},
    ("tune",): {0, 1, 2, 3, 4, 64, 130},
    ("kernel",): {0, 1, 4, 64, 130},
}


def contract(path: tuple[str, ...]) -> set[int]:
    return next(CONTRACT[path[:n]] for n in range(len(path), -1, -1) if path[:n] in CONTRACT)


@dataclass(frozen=True)
class Place:
    """A documented file that no option names: knobfleet finds it in the project. A pseudo-option of class path."""

    name: str
    path: str  # in the project
    kind: str
    argv: tuple[str, ...]

    cls = "place"

    @property
    def id(self) -> str:
        return f"<{self.name}>"


PLACES = (
    Place("profile in the store", "profiles/mybase.yaml", "profile", ("render", "mybase", "--inventory={inv}")),
    Place("catalog overlay", "catalogs/sglang.overlay.yaml", "overlay", ("profiles", "validate")),
    Place("default inventory", "inventories/hosts.yml", "inventory", ("drift",)),
    Place("group_vars file", "inventories/group_vars/all/vault.yml", "vars", ("render", "mybase", "--what=env")),
)


# (option id, value) pairs thrown whatever the sample: what the harness found and this change fixed, kept as
# regressions.
ALWAYS: tuple[tuple[str, str], ...] = (
    # the URL servers, at the one URL option that asks its server whatever the inventory (canary stops before it
    # reads Prometheus when no host is behind a router)
    ("load-profile --prometheus", "url_close"),
    ("load-profile --prometheus", "url_trickle"),
    ("load-profile --prometheus", "url_redirect"),
    ("plan --vault-password-file", "controls"),  # xfail: a relative password file, lost by the playbook run
    ("kernel bench --vault-id", "nan"),  # xfail: the same
    ("catalog diff engine", "nul"),  # a NUL in a catalog's file name: an internal error
    ("catalog versions engine", "vault_value"),  # a newline in it: a refusal over several lines
    ("profiles migrate --from", "vault_value"),
    ("report record", "secrets"),  # a record's secrets copied into the page
    ("report --out", "ansi_name"),  # the page's path printed raw
    ("kernel bench --host", "blank"),  # a host not in the inventory, handed to ansible-playbook
    ("kernel bench --python", "token"),  # kept in the run's knob_vars.yml
    ("waves-calibrate --gpu", "ansi"),  # printed raw and stored
    ("waves-calibrate --gpu", "url_creds"),
    ("init --name", "token"),  # written in knobfleet.toml and README.md
    ("init directory", "dangling"),  # followed where it points, as declared
    ("waves-calibrate --store", "ansi_name"),  # the store's path printed raw
    ("waves-calibrate sweeps", "controls"),  # the sweep's GPU name printed raw
    ("waves-calibrate sweeps", "secrets"),  # xfail: the sweep's GPU name stored (kernel/fit.py)
)


@dataclass
class Case:
    no: int
    command: Command | None  # None for a place
    option: Option | Place
    value: str  # a name of VALUES[class]

    @property
    def id(self) -> str:
        return f"{self.option.id} = {self.value}"


@dataclass
class Plan:
    cases: list[Case] = field(default_factory=list)
    commands: int = 0
    options: int = 0
    places: int = 0

    def coverage(self) -> str:
        pairs = {(c.option.cls, c.value) for c in self.cases}
        return (
            f"attack harness: {self.commands} subcommands, {self.options} options, {self.places} project files, "
            f"{len(self.cases)} cases, {len(pairs)} (class, value) pairs, seed {SEED}"
        )


def plan(commands: list[Command], places: tuple[Place, ...] = PLACES, seed: int = SEED) -> Plan:
    rng = random.Random(seed)
    order = {cls: rng.sample(vals, len(vals)) for cls, vals in VALUES.items()}
    turn = dict.fromkeys(VALUES, 0)
    out = Plan(commands=sum(c.runnable for c in commands))
    by_class: dict[str, list[tuple[Command | None, Option | Place]]] = {}
    for cmd in commands:
        for opt in cmd.options:
            out.options += 1
            by_class.setdefault(opt.cls, []).append((cmd, opt))
    for place in places:
        out.places += 1
        by_class.setdefault("place", []).append((None, place))
    every = os.environ.get("KNOBFLEET_ATTACK_ALL") == "1"
    picked: list[tuple[Command | None, Option | Place, str]] = []
    for cls, members in by_class.items():
        vals = order[cls]
        for member, opt in members:
            n = len(vals) if every else min(PER_OPTION, len(vals))
            for _ in range(n):
                picked.append((member, opt, vals[turn[cls] % len(vals)]))
                turn[cls] += 1
        used = {v for _, o, v in picked if o.cls == cls}
        for v in vals:  # fewer options than values: one more option each for the rest
            if v not in used:
                extra = rng.choice(members)
                picked.append((*extra, v))
    have = {(o.id, v) for _, o, v in picked}
    members_by_id = {o.id: (c, o) for ms in by_class.values() for c, o in ms}
    for oid, v in ALWAYS:
        if (oid, v) not in have and oid in members_by_id:
            picked.append((*members_by_id[oid], v))
    for no, (owner, what, v) in enumerate(picked):
        out.cases.append(Case(no, owner, what, v))
    return out

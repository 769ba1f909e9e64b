"""What a SPACE may not ask of a campaign, whatever the file's size (pure; issue 56).

- A knob value shaped like a secret is refused as a profile refuses it: it would be in the campaign's record, its
  page and the winner's profile.

- The record holds a row for every candidate (~300 bytes) and is read back up to 8 MiB (``experiment.records``):
  past ``MAX_CANDIDATES`` a legal SPACE made a campaign that ``--resume`` could not read. Beyond it a space is a typo.
- The model stage scores every candidate at every traffic bucket (live traffic: the engine stage's buckets): a 4 KB
  SPACE of many buckets ran it for minutes. ``MAX_MODEL_WORK`` keeps it to seconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

MAX_CANDIDATES = 20_000
MAX_MODEL_WORK = 1_000_000

Bad = Callable[[str, str], None]


def count(knobs: dict[str, tuple[Any, ...]]) -> int:
    return math.prod(len(v) for v in knobs.values()) if knobs else 0


def candidates(knobs: dict[str, tuple[Any, ...]], bad: Bad) -> None:
    n = count(knobs)
    if n > MAX_CANDIDATES:
        bad("knobs", f"{n} candidates: more than {MAX_CANDIDATES}; narrow the ranges or vary fewer knobs")


def model_work(
    knobs: dict[str, tuple[Any, ...]], traffic: dict[int, float] | None, conc: Sequence[int], bad: Bad
) -> None:
    """The model stage's work (candidates x traffic buckets) bounded; a count over MAX_CANDIDATES is said once."""
    n = count(knobs)
    buckets = len(traffic) if traffic else len(conc)
    if n <= MAX_CANDIDATES and n * max(buckets, 1) > MAX_MODEL_WORK:
        bad("traffic", f"{n} candidates at {buckets} traffic buckets: more than {MAX_MODEL_WORK:,} model scores; "
            "weigh fewer buckets (the engine stage measures at most a few) or vary fewer knobs")  # fmt: skip


def secret_value(name: str, values: Sequence[Any], bad: Bad) -> bool:
    """Whether a value of knob ``name`` looks like a secret (``knob_redact.secret_shape``); said with the fix."""
    from knobfleet.module_utils.knob_redact import secret_shape

    shape = next((what for what in map(secret_shape, values) if what), None)
    if shape:
        bad(f"knobs.{name}", f"a value looks like a secret ({shape}); a secret is no knob to tune: set it in the "
            "host vars (knob_serve_host_env, from Ansible Vault) and leave it out of the SPACE")  # fmt: skip
    return shape is not None

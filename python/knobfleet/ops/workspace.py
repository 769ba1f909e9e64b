"""Deprecated (one release): ``ops/workspace.py`` was dissolved into homes that say what they are. Its names
still resolve, lazily, to those homes; new code imports them from there:

* ``ops/profiles.py``: ``store``, ``Validation``, ``validate_profiles``, ``profile_schema``, ``render``,
  ``render_vars``, ``rendered_json``;
* ``ops/fleet.py``: ``hosts``;
* ``kernel/advisor.py``: the wave advisor (``WavePlan``, ``wave_plan``, ``suggest_ctas``, ``knob_dict``, …);
* ``cli/parse.py``: ``parse_weights``, ``parse_int_list``.
"""

from __future__ import annotations

from typing import Any

from knobfleet.errors import KnobfleetError

__all__ = ["KnobfleetError"]

_HOMES = {
    **dict.fromkeys(
        ("store", "Validation", "validate_profiles", "profile_schema", "render", "rendered_json"),
        "knobfleet.ops.profiles",
    ),
    "hosts": "knobfleet.ops.fleet",
    **dict.fromkeys(
        (
            "WavePlan",
            "TARGET_KNOB",
            "BLOCK_H_KNOB",
            "NSPLIT_KNOB",
            "MIN_CHUNK_KNOB",
            "knob_dict",
            "resolve_sms",
            "wave_knobs",
            "wave_plan",
            "Suggestion",
            "suggest_ctas",
            "write_candidate",
        ),
        "knobfleet.kernel.advisor",
    ),
    **dict.fromkeys(("parse_weights", "parse_int_list"), "knobfleet.cli.parse"),
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(home), name)

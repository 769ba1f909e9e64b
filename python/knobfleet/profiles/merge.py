"""Generated catalog + curated overlay -> the one catalog validation reads (``profiles/catalog.py``). Pure and
standard library only: every validation leans on it, so it stands on nothing above ``profiles/`` (it used to
live with the catalog generator, ``engines/sync/build.py``, which re-exports it)."""

from __future__ import annotations

from typing import Any

KNOB_FIELDS = (
    "kind",
    "type",
    "choices",
    "min",
    "max",
    "default",
    "restart",
    "description",
    "aliases",
    "negation",
    "nargs",
    "deprecated",
    "replacement",
    "origin",
)


def ordered(knob: dict[str, Any]) -> dict[str, Any]:
    extra = sorted(k for k in knob if k not in KNOB_FIELDS)
    return {k: knob[k] for k in (*KNOB_FIELDS, *extra) if k in knob}


def merge(generated: dict[str, Any], overlay: dict[str, Any], lenient: bool = False) -> dict[str, Any]:
    """Generated catalog + overlay → one catalog.

    An overlay has ``engine`` (must match), optionally ``serve`` (the engine adapter's data, copied as is), and
    ``knobs``: a knob the engine has gets the overlay's fields on top of its generated ones (ranges, better
    descriptions); a knob it lacks must be complete (kind, type) and name its ``origin`` (the patch that adds
    it). Overlay knobs set to null are removed (a knob knobfleet should refuse although upstream has it).
    ``lenient`` (a catalog of another engine version than the overlay was written for): a patch of a knob that
    version lacks is skipped, not an error. The engine's rename tables (``renamed``, ``removed``) are the union.
    """
    if overlay.get("engine") != generated.get("engine"):
        raise ValueError(f"overlay is for {overlay.get('engine')!r}, catalog for {generated.get('engine')!r}")
    knobs = {n: dict(k) for n, k in generated["knobs"].items()}
    for name, patch in (overlay.get("knobs") or {}).items():
        if patch is None:
            knobs.pop(name, None)
            continue
        if name in knobs:
            knobs[name].update(patch)
        else:
            missing = [f for f in ("kind", "type", "origin") if f not in patch]
            if missing and lenient:
                continue
            if missing:
                raise ValueError(f"overlay knob {name!r} is not upstream and lacks {', '.join(missing)}")
            knobs[name] = {"restart": True, **patch}
    out = {k: v for k, v in generated.items() if k != "knobs"}
    if "serve" in overlay:
        out["serve"] = overlay["serve"]
    for table in ("renamed", "removed"):
        both = {**(generated.get(table) or {}), **(overlay.get(table) or {})}
        if both:
            out[table] = {n: both[n] for n in sorted(both)}
    out["knobs"] = {n: ordered(knobs[n]) for n in sorted(knobs)}
    return out

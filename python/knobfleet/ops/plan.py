"""Pure: what apply will do. Batches, knob-level changes from script diffs, and ``plan_host``: one probe
document + what was rendered → findings (the one live-state rule) → the actions apply takes."""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from knobfleet.compile_cache import Side, invalidations
from knobfleet.errors import UsageError
from knobfleet.live.verify import Declared, Finding, actions, check_rendered, refusal
from knobfleet.module_utils import knob_argv, knob_running, knob_shell

if TYPE_CHECKING:
    from knobfleet.engines.adapter import Engine
    from knobfleet.render import Rendered


def batches(
    hosts: list[str], serial: str | None, canary: bool, units: list[tuple[str, ...]] | None = None
) -> list[list[str]]:
    """Split hosts into rollout batches: ``--canary`` = one host first; ``--serial N`` or ``N%``. ``units``: the
    hosts in restart units (an engine group's ranks are one unit: ``groups.units``); the canary and ``--serial``
    count units, and a unit is never split."""
    return [
        [h for unit in batch for h in unit] for batch in _unit_batches(units or [(h,) for h in hosts], serial, canary)
    ]


def _unit_batches(units: list[tuple[str, ...]], serial: str | None, canary: bool) -> list[list[tuple[str, ...]]]:
    hosts = units
    if not hosts:
        return []
    rest = list(hosts)
    out: list[list[tuple[str, ...]]] = []
    if canary:
        out.append([rest.pop(0)])
    if not rest:
        return out
    if serial is None:
        return [*out, rest]
    text = serial.strip()
    try:
        if text.endswith("%"):
            pct = float(text[:-1])
            if not 0 < pct <= 100:
                raise ValueError
            size = max(1, math.floor(len(hosts) * pct / 100))
        else:
            size = int(text)
            if size < 1:
                raise ValueError
    except ValueError:
        raise UsageError(f"--serial {serial!r}: expected a count such as 2 or a percentage such as 25%") from None
    return out + [rest[i : i + size] for i in range(0, len(rest), size)]


def parse_script(text: str) -> tuple[dict[str, str], list[str]]:
    """Env exports and exec argv of a serve script (knobfleet's or a simple hand-written one): the one reader,
    shared with the on-host modules (module_utils/knob_shell.py)."""
    return knob_shell.script_env_argv(text)


@dataclass(frozen=True)
class KnobChange:
    kind: str  # env | flag | unit
    name: str
    before: str | None
    after: str | None

    def __str__(self) -> str:
        if self.kind == "unit":  # a unit setting a host var controls
            var = UNIT_SETTINGS.get(self.name)
            return f"unit {self.name}= {self.before or '(unset)'} → {self.after or '(unset)'}" + (
                f" ({var})" if var else ""
            )
        label = self.name if self.kind == "env" else f"--{self.name}"
        before = "(unset)" if self.before is None else self.before
        after = "(unset)" if self.after is None else self.after
        return f"{label} {before} → {after}"


def _shown_flags(argv: list[str], spec: dict[str, Any] | None) -> dict[str, str]:
    return {k: "(set)" if v == knob_argv.TRUE else v for k, v in knob_argv.flags_of(argv, spec).items()}


def knob_changes(before_script: str, after_script: str, spec: dict[str, Any] | None = None) -> list[KnobChange]:
    """Env and flag changes between two serve scripts. Flags are read by the engine's parser rules (``spec``:
    ``Engine.argv_spec``, module_utils/knob_argv.py), so a hand-written ``--tp 2`` and knobfleet's
    ``--tp-size=2`` are the same flag with the same value, not a change."""
    env_a, argv_a = parse_script(before_script)
    env_b, argv_b = parse_script(after_script)
    out = [
        KnobChange("env", k, env_a.get(k), env_b.get(k))
        for k in sorted(env_a.keys() | env_b.keys())
        if env_a.get(k) != env_b.get(k)
    ]
    fa, fb = _shown_flags(argv_a, spec), _shown_flags(argv_b, spec)
    out += [
        KnobChange("flag", k, fa.get(k), fb.get(k)) for k in sorted(fa.keys() | fb.keys()) if fa.get(k) != fb.get(k)
    ]
    return out


@dataclass(frozen=True)
class HostPlan:
    """What apply will do on one host, from one probe and the one live-state rule."""

    host: str
    findings: list[Finding]
    actions: list[str]  # [] = in sync; ["refuse"] = left alone; else in the order apply performs them
    refusal: str | None
    diffs: list[dict[str, str]]
    knob_changes: list[str]
    main_pid: int | None
    seen: dict[str, str]
    # why the engine's compile cache will be cold after the restart this plan causes (compile_cache.invalidations)
    cache_cold: list[str] = field(default_factory=list)

    @property
    def in_sync(self) -> bool:
        return not self.actions

    @property
    def refused(self) -> bool:
        return self.refusal is not None


# [Service] settings of the unit a host var sets, shown by name when an apply changes them (an adopted hand-written
# unit's Restart=always would otherwise turn into another policy without a word).
UNIT_SETTINGS = {"Restart": "knob_serve_restart", "RestartSec": "knob_serve_restart_sec", "User": "knob_serve_user"}


def unit_settings(text: str) -> dict[str, str]:
    """``[Service]`` settings of a unit file (the last one of a key wins, as systemd reads it)."""
    out: dict[str, str] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith(("#", ";")):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def unit_changes(before_unit: str, after_unit: str) -> list[KnobChange]:
    """The host-var-controlled unit settings (``UNIT_SETTINGS``) an install changes. Only where the unit is
    there: a host without one gets knobfleet's unit whatever it says."""
    if not before_unit.strip():
        return []
    a, b = unit_settings(before_unit), unit_settings(after_unit)
    return [KnobChange("unit", k, a.get(k), b.get(k)) for k in UNIT_SETTINGS if a.get(k) != b.get(k)]


def file_diff(before: str, after: str, path: str) -> str:
    return "".join(
        difflib.unified_diff(
            before.splitlines(True), after.splitlines(True), f"{path} (installed)", f"{path} (profile)"
        )
    )


def seen_knobs(doc: dict[str, Any], engine: Engine) -> dict[str, str]:
    """The knobs worth showing (the engine's ``show`` list) as the engine's main process has them."""
    pid = knob_running.main_pid(doc)
    main = next((p for p in doc.get("processes") or [] if p.get("pid") == pid), None)
    env = (main or {}).get("env") or {}
    return {engine.short(k): env.get(k, "(unset)") for k in engine.show}


def plan_host(
    doc: dict[str, Any],
    rendered: Rendered,
    declared: Declared,
    engine: Engine,
    dropin_policy: str = "fail",
    break_lock: bool = False,
    versions: tuple[str | None, str | None] = (None, None),
) -> HostPlan:
    """Pure: the findings between the host in ``doc`` and ``rendered``, and the actions that repair them.
    ``versions``: the engine version the host runs and the one it will run (None: unknown), for ``cache_cold``."""
    findings = check_rendered(doc, rendered, declared, engine.rules())
    acts = actions(findings, dropin_policy, break_lock)
    refused = refusal(findings, dropin_policy, break_lock) or shadowing(doc, rendered.unit_path)
    if refused is not None:
        acts = ["refuse"]
    files = doc.get("files") or {}
    diffs, changes = [], []
    for key, text, path in (
        ("script", rendered.script_shown, rendered.script_path),
        ("unit", rendered.unit_shown, rendered.unit_path),
    ):
        have = files.get(key) or {}
        before = str(have.get("content") or "")
        if before != text:
            diffs.append({"path": path, "diff": file_diff(before, text, path)})
            if key == "script":
                changes += [str(c) for c in knob_changes(before, text, engine.argv_spec)]
            else:
                changes += [str(c) for c in unit_changes(before, text)]
    pid = knob_running.main_pid(doc) or None
    cold = []
    if {"restart", "start"} & set(acts):
        before = str((files.get("script") or {}).get("content") or "")
        cold = cache_cold(engine, before, rendered.script_shown, versions)
    return HostPlan(
        rendered.host,
        findings,
        acts,
        refused,
        diffs,
        changes,
        pid,
        seen_knobs(doc, engine),
        cold,
    )


def shadowing(doc: dict[str, Any], unit_path: str) -> str | None:
    """Apply's refusal of a serve unit named like one the host's packages ship (the probe's ``package_unit``,
    knob_pkgmeta.shadowed_unit; knob_guards.check_unit_name refuses it on the host), in its words; else None."""
    found = doc.get("package_unit")
    if not found:
        return None
    service = unit_path.rsplit("/", 1)[-1].rsplit(".service", 1)[0]
    return (f"knob_serve_service {service} names a unit the host's packages ship ({found}): installing {unit_path} "
            "would take the place of the host's own service and restart it; set knob_serve_service to a name of "
            "the engine's own")  # fmt: skip


def cache_cold(
    engine: Engine, before_script: str, after_script: str, versions: tuple[str | None, str | None] = (None, None)
) -> list[str]:
    """Why the compile cache will be cold when the engine starts on ``after_script`` where ``before_script`` ran
    (``compile_cache.invalidations`` over the two scripts' env and flags and the two engine versions)."""
    sides = []
    for text, version in ((before_script, versions[0]), (after_script, versions[1])):
        env, argv = parse_script(text)
        sides.append(Side(version, env, _shown_flags(argv, engine.argv_spec)))
    return invalidations(engine, sides[0], sides[1])

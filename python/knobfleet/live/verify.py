"""Typed findings and host verdicts around the one live-state rule (``module_utils/knob_live.py``).

``verify_host`` checks a host against its *current generation* (drift, verify, the check after a restore);
``check_rendered`` checks it against what the controller rendered for a profile (plan, apply's pre- and
post-check). Both call ``knob_live.evaluate``: one rule, so the commands cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from knobfleet.module_utils import knob_live, knob_rules
from knobfleet.module_utils.knob_lean import sha256  # hashlib's digest without loading OpenSSL (~4 ms)
from knobfleet.module_utils.knob_rules import Action, Kind

if TYPE_CHECKING:
    from knobfleet.render import Rendered

KINDS = tuple(k.value for k in Kind)
Status = Literal["in_sync", "drift", "unreachable", "error"]


@dataclass(frozen=True)
class Finding:
    kind: Kind
    message: str
    severity: str = "error"
    action: Action = Action.NONE
    path: str | None = None
    pid: int | None = None
    name: str | None = None
    expected: Any = None
    actual: Any = None
    source: str | None = None
    diff: str | None = None

    @classmethod
    def from_rule(cls, d: dict[str, Any]) -> Finding:
        return cls(
            Kind(d["kind"]),
            str(d["message"]),
            str(d.get("severity", "error")),
            Action(d.get("action", "none")),
            d.get("path"),
            d.get("pid"),
            d.get("name"),
            d.get("expected"),
            d.get("actual"),
            d.get("source"),
            d.get("diff"),
        )

    def as_rule(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "message": self.message, "path": self.path, "action": self.action.value}

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind.value, "message": self.message}
        for key in ("path", "pid", "name", "expected", "actual", "source", "diff"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


@dataclass(frozen=True)
class Declared:
    """The profile the inventory says a host runs."""

    name: str
    version: int
    hash: str
    engine_version: str | None = None  # the engine version the profile pins, if it does

    def as_rule(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "hash": self.hash}


@dataclass
class HostVerdict:
    host: str
    status: Status
    profile: str | None = None
    version: int | None = None
    hash: str | None = None
    generation: int | None = None
    findings: list[Finding] = field(default_factory=list)
    error: str | None = None
    engine_version: str | None = None  # what the host's version file says (knob_serve_version_file), when it has one

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "host": self.host,
            "status": self.status,
            "profile": self.profile,
            "version": self.version,
            "hash": self.hash,
            "generation": self.generation,
            "findings": [f.as_json() for f in self.findings],
        }
        if self.error:
            out["error"] = self.error
        if self.engine_version:
            out["engine_version"] = self.engine_version
        return out


def unreachable(host: str, message: str) -> HostVerdict:
    return HostVerdict(host, "unreachable", error=message)


def findings_of(rule_out: list[dict[str, Any]]) -> list[Finding]:
    return [Finding.from_rule(d) for d in rule_out]


def verify_host(
    host: str, probe: dict[str, Any], declared: Declared | None = None, engine: dict[str, Any] | None = None
) -> HostVerdict:
    """Every difference between what knobfleet applied on ``host`` (its current generation) and what ``probe``
    observed. ``engine``: the engine part of the rule (``Engine.rules()``)."""
    expected, why = knob_live.expected_from_generation(probe)
    if why is not None:
        current = (probe.get("generations") or {}).get("current")
        return HostVerdict(
            host,
            "error",
            generation=current,
            error=f"{why}; run `knobfleet history` and `knobfleet rollback --to N` to a readable generation",
        )
    verdict = HostVerdict(host, "in_sync")
    if expected is not None:
        prof = expected["profile"]
        verdict.generation = expected["generation"]
        verdict.profile, verdict.version, verdict.hash = prof["name"], prof["version"], prof["hash"]
    rule_out = knob_live.evaluate(probe, expected, engine, declared.as_rule() if declared else None)
    verdict.findings = findings_of(rule_out)
    if verdict.findings:
        verdict.status = "drift"
    return verdict


def sha256_bytes(data: bytes) -> str:
    return str(sha256(data).hexdigest())


def expected_rendered(probe: dict[str, Any], rendered: Rendered) -> dict[str, Any]:
    """The rule's expected state once ``rendered`` is applied: its files, env and argv; the profile of the
    host's current generation (so a host on another profile gets a ``profile_mismatch``); unmanaged when
    knobfleet never applied anything there."""
    gen, _why = knob_live.expected_from_generation(probe)
    out = knob_live.expected_from_files(
        rendered.script_path,
        rendered.script,
        rendered.unit_path,
        rendered.unit,
        sha256_bytes,
        rendered.secret,
        rendered.secret_key,
    )
    out["managed"] = gen is not None
    if gen is not None:
        out["generation"] = gen["generation"]
        out["profile"] = gen["profile"]
        for key, want in out["files"].items():  # the same file as the generation's: the same mode and owner too
            stored = (gen.get("files") or {}).get(key) or {}
            if stored.get("access") and stored.get("sha256") == want.get("sha256"):
                want["access"] = stored["access"]
    return out


def check_rendered(
    probe: dict[str, Any],
    rendered: Rendered,
    declared: Declared,
    engine: dict[str, Any] | None,
    run_id: str | None = None,
) -> list[Finding]:
    """What stands between the host in ``probe`` and ``rendered`` (the profile ``declared``) being live."""
    expected = expected_rendered(probe, rendered)
    return findings_of(knob_live.evaluate(probe, expected, engine, declared.as_rule(), run_id))


def actions(findings: list[Finding], dropin_policy: str = "fail", break_lock: bool = False) -> list[str]:
    return knob_rules.actions([f.as_rule() for f in findings], dropin_policy, break_lock)


def refusal(findings: list[Finding], dropin_policy: str = "fail", break_lock: bool = False) -> str | None:
    return knob_rules.refusal([{**f.as_rule(), "message": f.message} for f in findings], dropin_policy, break_lock)


def blocking_after_restore(findings: list[Finding]) -> list[Finding]:
    """Findings that make a restored generation fail its verification (the rest predate the change)."""
    return [f for f in findings if not knob_rules.RULES[f.kind].restore_ok]


def summary(verdicts: list[HostVerdict]) -> dict[str, Any]:
    profiles: dict[str, list[str]] = {}
    for v in verdicts:
        if v.status in ("in_sync", "drift") and v.profile is not None:
            profiles.setdefault(f"{v.profile}@{v.version} ({(v.hash or '')[:19]})", []).append(v.host)
    counts = {s: sum(v.status == s for v in verdicts) for s in ("in_sync", "drift", "unreachable", "error")}
    kinds: dict[str, int] = {}
    for v in verdicts:
        for f in v.findings:
            kinds[f.kind.value] = kinds.get(f.kind.value, 0) + 1
    engines: dict[str, list[str]] = {}
    for v in verdicts:
        if v.engine_version:
            engines.setdefault(v.engine_version, []).append(v.host)
    return {
        "hosts": len(verdicts),
        **counts,
        "profiles": profiles,
        "version_skew": len(profiles) > 1,
        "findings": kinds,
        **({"engine_versions": engines, "engine_version_skew": len(engines) > 1} if engines else {}),
    }


def exit_code(verdicts: list[HostVerdict]) -> int:
    from knobfleet.errors import EXIT_DRIFT, EXIT_DRIFT_AND_UNREACHABLE, EXIT_OK, EXIT_UNREACHABLE

    drift = any(v.status == "drift" for v in verdicts)
    broken = any(v.status in ("unreachable", "error") for v in verdicts)
    if drift and broken:
        return EXIT_DRIFT_AND_UNREACHABLE
    return EXIT_UNREACHABLE if broken else EXIT_DRIFT if drift else EXIT_OK

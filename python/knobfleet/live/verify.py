"""Pure: a host's observed state (one probe document) vs what knobfleet applied there → findings.

The reference is the host's *current generation* (its stored serve script and unit, and meta.json),
plus, when the inventory declares ``knob_profile``, that profile's name, version and hash. Expected env
and argv are read from the generation's stored serve script, so verification works even when the
profile files on the controller changed or are gone.
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass, field
from typing import Any

from knobfleet.plan import ENGINE_PREFIXES, parse_script

KINDS = (
    "file_changed",
    "file_missing",
    "dropin_present",
    "daemon_reload_needed",
    "stale_process",
    "env_mismatch",
    "env_missing",
    "env_unexpected",
    "argv_mismatch",
    "service_inactive",
    "profile_mismatch",
    "unmanaged",
    "not_ready",
)
STALE_TOLERANCE_S = 1.0


@dataclass(frozen=True)
class Finding:
    kind: str
    message: str
    path: str | None = None
    pid: int | None = None
    name: str | None = None
    expected: Any = None
    actual: Any = None
    source: str | None = None
    diff: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class Declared:
    """The profile the inventory says a host runs."""

    name: str
    version: int
    hash: str


@dataclass
class HostVerdict:
    host: str
    status: str  # in_sync | drift | unreachable | error
    profile: str | None = None
    version: int | None = None
    hash: str | None = None
    generation: int | None = None
    findings: list[Finding] = field(default_factory=list)
    error: str | None = None

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
        return out


def _diff(expected: str, actual: str, path: str) -> str:
    return "".join(
        difflib.unified_diff(
            expected.splitlines(True), actual.splitlines(True), f"{path} (generation)", f"{path} (on host)"
        )
    )


def _did_you_mean(name: str, known: list[str]) -> str:
    match = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    return f"; did you mean {match[0]}?" if match else ""


def unreachable(host: str, message: str) -> HostVerdict:
    return HostVerdict(host, "unreachable", error=message)


def verify_host(
    host: str, probe: dict[str, Any], declared: Declared | None = None, known_knobs: tuple[str, ...] = ()
) -> HostVerdict:
    """Every difference between what knobfleet applied on ``host`` and what ``probe`` observed."""
    gens = probe.get("generations") or {}
    props = probe.get("unit_props") or {}
    files = probe.get("files") or {}
    procs: list[dict[str, Any]] = probe.get("processes") or []
    out: list[Finding] = []
    verdict = HostVerdict(host, "in_sync")

    current = gens.get("current")
    entries = {e["generation"]: e for e in gens.get("list") or []}
    meta = (entries.get(current) or {}).get("meta") if current is not None else None
    _service_findings(props, probe, out)
    if current is None:
        present = [f["path"] for f in files.values() if f.get("exists")]
        out.append(
            Finding(
                "unmanaged",
                "files present but never applied by knobfleet: " + ", ".join(present)
                if present
                else "no knobfleet generation and no serve files on this host",
                path=present[0] if present else None,
            )
        )
        return _finish(verdict, out)
    if meta is None:
        verdict.status = "error"
        verdict.generation = current
        verdict.error = (
            f"generation {current:04d}: meta.json missing or unreadable ("
            + "; ".join(gens.get("errors") or ["not found"])
            + "); run `knobfleet history` and "
            "`knobfleet rollback --to N` to a readable generation"
        )
        return verdict
    verdict.generation = current
    verdict.profile, verdict.version, verdict.hash = meta.get("profile"), meta.get("version"), meta.get("hash")
    stored = gens.get("current_files") or {}
    script_text = ""
    for key in ("script", "unit"):
        want = (meta.get("files") or {}).get(key)
        have = files.get(key) or {}
        if not want:
            continue
        gen_copy = stored.get(want.get("name", "")) or {}
        if key == "script":
            script_text = gen_copy.get("content", "")
        if not have.get("exists"):
            out.append(Finding("file_missing", f"{want['path']} is missing", path=want["path"]))
        elif have.get("sha256") != want.get("sha256"):
            diff = _diff(gen_copy.get("content", ""), have.get("content", ""), want["path"])
            out.append(
                Finding(
                    "file_changed",
                    f"{want['path']} differs from generation {current:04d}",
                    path=want["path"],
                    expected=want.get("sha256"),
                    actual=have.get("sha256"),
                    diff=diff,
                )
            )
    main_pid = int(props.get("MainPID") or 0)
    main = next((p for p in procs if p["pid"] == main_pid), None)
    if main is not None:
        for key in ("script", "unit"):
            have = files.get(key) or {}
            if have.get("exists") and have.get("mtime", 0) > main["start_epoch"] + STALE_TOLERANCE_S:
                out.append(
                    Finding(
                        "stale_process",
                        f"pid {main_pid} started before {have['path']} was last "
                        "changed; it runs the old contents until restarted",
                        path=have["path"],
                        pid=main_pid,
                    )
                )
    if script_text and procs:
        exp_env, exp_argv = parse_script(script_text)
        _env_findings(procs, exp_env, known_knobs, out)
        if main is not None and exp_argv and main["cmdline"] != exp_argv:
            out.append(
                Finding(
                    "argv_mismatch",
                    f"pid {main_pid}: command line differs from generation {current:04d}'s exec line",
                    pid=main_pid,
                    expected=exp_argv,
                    actual=main["cmdline"],
                )
            )
        if main is not None:
            _engine_env_findings(probe, main, out)
    if declared is not None and (verdict.profile, verdict.version, verdict.hash) != (
        declared.name,
        declared.version,
        declared.hash,
    ):
        out.append(
            Finding(
                "profile_mismatch",
                f"runs {verdict.profile}@{verdict.version}, inventory declares {declared.name}@{declared.version}",
                name="knob_profile",
                expected=f"{declared.name}@{declared.version} {declared.hash}",
                actual=f"{verdict.profile}@{verdict.version} {verdict.hash}",
            )
        )
    return _finish(verdict, out)


def _service_findings(props: dict[str, Any], probe: dict[str, Any], out: list[Finding]) -> None:
    active = props.get("ActiveState")
    if active != "active":
        out.append(
            Finding(
                "service_inactive",
                f"{probe.get('unit')} is {active}/{props.get('SubState')}",
                expected="active",
                actual=active,
            )
        )
    elif probe.get("health") != 200:
        out.append(
            Finding(
                "not_ready",
                f"{probe.get('health_url')} answered {probe.get('health') or 'nothing'}",
                expected=200,
                actual=probe.get("health"),
            )
        )
    if props.get("NeedDaemonReload") == "yes":
        out.append(
            Finding(
                "daemon_reload_needed",
                "unit file changed on disk but systemd was not reloaded",
                path=props.get("FragmentPath"),
            )
        )
    for path in (props.get("DropInPaths") or "").split():
        out.append(Finding("dropin_present", f"drop-in {path} changes the unit", path=path))


def _env_findings(
    procs: list[dict[str, Any]], expected: dict[str, str], known: tuple[str, ...], out: list[Finding]
) -> None:
    for proc in procs:
        env = proc.get("env") or {}
        pid, comm = proc["pid"], proc.get("comm", "")
        for name, value in sorted(expected.items()):
            if name not in env:
                out.append(
                    Finding("env_missing", f"pid {pid} ({comm}): {name} is not set", pid=pid, name=name, expected=value)
                )
            elif env[name] != value:
                out.append(
                    Finding(
                        "env_mismatch",
                        f"pid {pid} ({comm}): {name}={env[name]}, expected {value}",
                        pid=pid,
                        name=name,
                        expected=value,
                        actual=env[name],
                        source="proc",
                    )
                )
        for name in sorted(env):
            if name.startswith(ENGINE_PREFIXES) and name not in expected:
                hint = (
                    "; a known knob the profile does not set"
                    if name in known
                    else _did_you_mean(name, list(known)) or "; not a knob the engine's catalog knows"
                )
                out.append(
                    Finding(
                        "env_unexpected",
                        f"pid {pid} ({comm}): {name}={env[name]} is set but not in the profile{hint}",
                        pid=pid,
                        name=name,
                        actual=env[name],
                    )
                )


def _engine_env_findings(probe: dict[str, Any], main: dict[str, Any], out: list[Finding]) -> None:
    info = probe.get("server_info") or {}
    states = info.get("internal_states") or [{}]
    reported = states[0].get("env_vars") if isinstance(states[0], dict) else None
    if not isinstance(reported, dict):
        return
    live = main.get("env") or {}
    for name, value in sorted(reported.items()):
        if live.get(name) != value:
            out.append(
                Finding(
                    "env_mismatch",
                    f"engine reports {name}={value} but /proc/{main['pid']}/environ has {live.get(name)!r}",
                    pid=main["pid"],
                    name=name,
                    expected=live.get(name),
                    actual=value,
                    source="engine",
                )
            )


def _finish(verdict: HostVerdict, findings: list[Finding]) -> HostVerdict:
    verdict.findings = findings
    if verdict.status == "in_sync" and findings:
        verdict.status = "drift"
    return verdict


def summary(verdicts: list[HostVerdict]) -> dict[str, Any]:
    profiles: dict[str, list[str]] = {}
    for v in verdicts:
        if v.status in ("in_sync", "drift") and v.profile is not None:
            profiles.setdefault(f"{v.profile}@{v.version} ({(v.hash or '')[:19]})", []).append(v.host)
    counts = {s: sum(v.status == s for v in verdicts) for s in ("in_sync", "drift", "unreachable", "error")}
    kinds: dict[str, int] = {}
    for v in verdicts:
        for f in v.findings:
            kinds[f.kind] = kinds.get(f.kind, 0) + 1
    return {
        "hosts": len(verdicts),
        **counts,
        "profiles": profiles,
        "version_skew": len(profiles) > 1,
        "findings": kinds,
    }


def exit_code(verdicts: list[HostVerdict]) -> int:
    drift = any(v.status == "drift" for v in verdicts)
    broken = any(v.status in ("unreachable", "error") for v in verdicts)
    return 6 if drift and broken else 4 if broken else 2 if drift else 0

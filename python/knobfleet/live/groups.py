"""Pure: the cross-rank rule of an engine group. Each host's own rule (``live.verify``) proves that host runs
its generation; this one proves the ranks of one engine agree with each other, which a host alone cannot show
(a hand edit on one rank, then "verified" alone, is still a mismatch).

Compared, rank by rank against rank 0 (prefill/decode groups: within a role, plus the settings both roles must
share): every env var but the group's ``may_differ`` list, every launch flag but the per-rank ones, the model
path and the engine version. A rank whose engine process is not alive and joined is reported too: SGLang's
followers run a dummy health server that answers 200 whatever the engine does, so their health proves nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from knobfleet.groups import PER_RANK_FLAGS, EngineGroup, Member
from knobfleet.module_utils import knob_argv, knob_rules
from knobfleet.module_utils.knob_rules import Kind

GROUP_MISMATCH = Kind.GROUP_MISMATCH.value
GROUP_RANK_DOWN = Kind.GROUP_RANK_DOWN.value
# What a prefill and a decode server of one pair must share (a different TP or model crashes or hangs the pair).
PD_SHARED_FLAGS = ("tp-size", "tensor-parallel-size", "page-size", "kv-cache-dtype", "disaggregation-transfer-backend")


@dataclass(frozen=True)
class RankState:
    """What was observed on one rank (from its probe)."""

    env: Mapping[str, str]
    flags: Mapping[str, str | bool]
    model_path: str | None
    engine_version: str | None
    alive: bool = True  # the engine's main process runs (not stopped, not a zombie)
    joined: bool | None = None  # rank 0's report that this rank joined (None: not reported)
    unreadable: tuple[str, ...] = field(default=())  # what could not be read on this rank
    reports: Mapping[int, bool] = field(default_factory=dict)  # rank 0: each follower rank, joined or not
    # flags that differ between ranks by design (the engine's ``per_rank_flags``, from its catalog's serve.ranks)
    per_rank: tuple[str, ...] = PER_RANK_FLAGS


MODEL_FLAGS = ("model-path", "model")  # compared as the model path, not twice as a flag
ALIVE_STATES = ("active", "reloading")
# Env a process gets from systemd itself, never from the profile or the host vars: not the engine's settings.
SYSTEMD_ENV = ("INVOCATION_ID", "JOURNAL_STREAM", "SYSTEMD_EXEC_PID", "MANAGERPID", "LISTEN_PID", "NOTIFY_SOCKET")


def _split_model(flags: Mapping[str, Any]) -> tuple[dict[str, str | bool], str | None]:
    model = next((str(flags[f]) for f in MODEL_FLAGS if f in flags), None)
    return {k: v for k, v in flags.items() if k not in MODEL_FLAGS}, model


def from_probe(doc: Mapping[str, Any], engine: Mapping[str, Any]) -> RankState:
    """What one rank runs, from its probe document: the main process's env (without what systemd adds) and
    flags, its model path, the engine version (``version_file``), whether it is alive, and — on rank 0 — the
    ranks it reports joined (``server_info.ranks``, as the stand-in and SGLang-style engines report them)."""
    props = doc.get("unit_props") or {}
    try:
        pid = int(props.get("MainPID") or 0)
    except ValueError:
        pid = 0
    main = next((p for p in doc.get("processes") or [] if p.get("pid") == pid), None)
    alive = main is not None and props.get("ActiveState") in ALIVE_STATES and main.get("state") not in ("T", "t", "Z")
    env = {k: str(v) for k, v in ((main or {}).get("env") or {}).items() if k not in SYSTEMD_ENV}
    flags, model = _split_model(knob_argv.flags_of(list((main or {}).get("cmdline") or []), engine.get("argv")))
    info = doc.get("server_info")
    reported = info.get("ranks") if isinstance(info, Mapping) else None
    joined = {
        int(r["rank"]): bool(r.get("joined"))
        for r in reported or []
        if isinstance(r, Mapping) and isinstance(r.get("rank"), int)
    }
    return RankState(env, flags, model, doc.get("engine_version"), alive, None, (), joined, _per_rank(engine))


def from_rendered(env: Mapping[str, str], argv: list[str], engine: Mapping[str, Any], version: str | None) -> RankState:
    """What one rank would run once applied (the controller's render of the profile for that host)."""
    flags, model = _split_model(knob_argv.flags_of(argv, engine.get("argv")))
    return RankState(dict(env), flags, model, version, per_rank=_per_rank(engine))


def _per_rank(engine: Mapping[str, Any]) -> tuple[str, ...]:
    """The engine's flags that differ between ranks by design; the shipped engines' where the rule names none."""
    named = engine.get("per_rank_flags")
    return tuple(str(f) for f in named) if named else PER_RANK_FLAGS


def with_reports(group: EngineGroup, observed: Mapping[str, RankState]) -> dict[str, RankState]:
    """Each follower's ``joined`` from rank 0's report (when rank 0 was read and reports ranks)."""
    head = observed.get(group.head.host) if group.kind == "tp" else None
    if head is None or not head.reports:
        return dict(observed)
    out = dict(observed)
    for m in group.members:
        if m.host in out and m.rank > 0 and m.role == "rank":
            out[m.host] = replace(out[m.host], joined=head.reports.get(m.rank, False))
    return out


def _show(v: Any) -> str:
    return "unset" if v is None else repr(v)


def _label(m: Member) -> str:
    return f"rank {m.rank} ({m.host})" if m.role == "rank" else f"{m.role} {m.rank} ({m.host})"


def _compare(
    group: EngineGroup, ref: Member, other: Member, a: RankState, b: RankState, flags: tuple[str, ...] | None
) -> list[dict[str, Any]]:
    out = []

    def finding(name: str, what: str, expected: Any, actual: Any) -> None:
        message = (
            f"group {group.name}: {_label(other)} {what} {name}: {_label(ref)} has {_show(expected)}, "
            f"{_label(other)} has {_show(actual)}"
        )
        out.append(
            knob_rules.finding(
                Kind.GROUP_MISMATCH, message, host=other.host, name=name, expected=expected, actual=actual
            )
        )

    if flags is None:  # same role: everything but the allow-list
        for name in sorted(set(a.env) | set(b.env)):
            if name not in group.may_differ and a.env.get(name) != b.env.get(name):
                finding(name, "env", a.env.get(name), b.env.get(name))
        names = sorted((set(a.flags) | set(b.flags)) - set(a.per_rank) - set(b.per_rank))
    else:
        names = [f for f in flags if f in a.flags or f in b.flags]
    for name in names:
        if a.flags.get(name) != b.flags.get(name):
            finding(f"--{name}", "flag", a.flags.get(name), b.flags.get(name))
    if a.model_path != b.model_path:
        finding("model path", "has", a.model_path, b.model_path)
    if a.engine_version != b.engine_version:
        finding("engine version", "runs", a.engine_version, b.engine_version)
    return out


def check(group: EngineGroup, observed: Mapping[str, RankState]) -> list[dict[str, Any]]:
    """Findings of ``group`` from each member's observed state (a member missing from ``observed`` was not
    reached: the per-host check reports that)."""
    out: list[dict[str, Any]] = []
    for m in group.members:
        s = observed.get(m.host)
        if s is None:
            continue
        if not s.alive or s.joined is False:
            why = "its engine process is not running" if not s.alive else f"{_label(group.head)} reports it absent"
            message = f"group {group.name}: {_label(m)} is down: {why} (its health endpoint proves nothing)"
            out.append(knob_rules.finding(Kind.GROUP_RANK_DOWN, message, host=m.host))
    roles = ("rank",) if group.kind == "tp" else ("prefill", "decode")
    refs: dict[str, Member] = {}
    for role in roles:
        same = [m for m in group.members if m.role == role and m.host in observed]
        if not same:
            continue
        ref = same[0]
        refs[role] = ref
        for other in same[1:]:
            out += _compare(group, ref, other, observed[ref.host], observed[other.host], None)
    if group.kind == "pd" and len(refs) == 2:
        p, d = refs["prefill"], refs["decode"]
        out += _compare(group, p, d, observed[p.host], observed[d.host], PD_SHARED_FLAGS)
    return out

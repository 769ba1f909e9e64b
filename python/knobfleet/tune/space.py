"""The SPACE file of ``knobfleet tune`` (pure: a parsed document in, a ``Space`` or one line per problem out).

    schema_version: 1
    name: ctas-blockh                 # the campaign (its record, its report)
    base: ctas512                     # the current profile: every candidate extends it, and must beat it
    knobs:                            # the knobs to vary: a list of values, or a range
      SGLANG_SM120_MMA_TARGET_CTAS: [256, 384, 512, 640, 768]
      SGLANG_SM120_MMA_BLOCK_H: {min: 16, max: 64, step: 16}
    traffic: {48: 0.3, 64: 0.3, 80: 0.3, 96: 0.1}   # or `live` (load-profile, from Prometheus)
    budget: {wall: 2h, host_minutes: 60, gpu_minutes: 10}
    stages:
      model: {gpu: rtx-pro-6000, keep: 4, margin: 0.05}
      kernel: {host: gpu1}            # or {sweep: FILE} (a stored kernel sweep) or {skip: "why"}
      engine: {host: lab1, keep: 2, max_rounds: 8, round: 60s}
      live: {hosts: 1, window: 30s, max_windows: 6, probes: 8, hang: 20s}  # or {skip: "why"}; space_live.py
    result: ctas-tuned                # the winner's profile name (default: NAME-best)

Values are checked against the base profile's catalog (names, types, choices, bounds) by ``check_against``;
everything else here. A problem is ``FILE: key: what is wrong; how to fix it``.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from knobfleet import paths, waves
from knobfleet.errors import KnobfleetError
from knobfleet.tune import bounds
from knobfleet.tune.space_fields import duration, frac_field, int_field, skip_reason
from knobfleet.tune.space_live import KEYS as LIVE_KEYS
from knobfleet.tune.space_live import LiveStage, live_stage

SCHEMA_VERSION = 1
MAX_VALUES = 4096
NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
TOP_KEYS = {"schema_version", "name", "base", "knobs", "traffic", "budget", "stages", "result", "description"}
STAGE_KEYS = {
    "model": {"gpu", "keep", "margin", "heads", "context"},
    "kernel": {"host", "sweep", "skip", "keep", "budget"},
    "engine": {"host", "keep", "max_rounds", "round", "conc", "n_mult", "max_tokens", "min_effect", "max_regression"},
    "live": LIVE_KEYS,
}
KERNEL_KNOBS = tuple(waves.DEFAULTS)


class SpaceError(KnobfleetError):
    """A SPACE file that cannot run: every problem, one line each, naming the file and the key."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


@dataclass(frozen=True)
class Budget:
    wall_s: float
    host_s: float
    gpu_s: float


@dataclass(frozen=True)
class ModelStage:
    gpu: str = "rtx-pro-6000"
    keep: int = 4
    margin: float = 0.05
    heads: int = 64
    context: int = waves.L_REF


@dataclass(frozen=True)
class KernelStage:
    host: str | None = None
    sweep: str | None = None
    skip: str | None = None
    keep: int = 3
    budget_s: float = 480.0


@dataclass(frozen=True)
class EngineStage:
    host: str = ""
    keep: int = 2
    max_rounds: int = 8
    round_s: float = 60.0  # one AB/BA round's expected cost on the host: what the budget is checked with
    conc: tuple[int, ...] = ()
    n_mult: int = 4
    max_tokens: int = 256
    min_effect: float = 0.01
    max_regression: float = 0.03


@dataclass(frozen=True)
class Space:
    path: str
    sha256: str
    name: str
    base: str
    knobs: dict[str, tuple[int | float | str | bool, ...]]
    traffic: dict[int, float] | None  # None: `live`
    budget: Budget
    model: ModelStage
    kernel: KernelStage
    engine: EngineStage
    live: LiveStage
    result: str
    description: str = ""

    @property
    def kernel_knobs(self) -> list[str]:
        return [k for k in self.knobs if k in KERNEL_KNOBS]


def file_hash(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def parse(doc: object, path: Path, text: str) -> Space:
    """The space in ``doc`` (parsed from ``text`` at ``path``), or SpaceError with every problem found."""
    where = paths.display(path)
    problems: list[str] = []

    def bad(key: str, what: str) -> None:
        problems.append(f"{where}: {key}: {what}")

    if not isinstance(doc, dict):
        raise SpaceError([f"{where}: expected a mapping with name, base, knobs, traffic, budget and stages"])
    name, base = _head(doc, bad)
    knobs = _knobs(doc.get("knobs"), bad)
    traffic = _traffic(doc.get("traffic"), bad)
    before = len(problems)
    budget = _budget(doc.get("budget"), bad)
    budget_ok = len(problems) == before  # a budget already refused is not also "too small"
    sections = _sections(doc.get("stages"), bad)
    model = _model(sections["model"], bad)
    kernel = _kernel(sections["kernel"], bad)
    engine = _engine(sections["engine"], traffic, bad)
    live = live_stage(sections["live"], bad)
    unworkable = None if live.skip is not None or len(problems) > before else live.settings().check()
    if unworkable:  # the canary would refuse it at the last stage: said before the first
        bad("stages.live", f"{unworkable}; change the live stage's windows")
    result = doc.get("result", f"{name}-best")
    if not isinstance(result, str) or not NAME_RE.fullmatch(result):
        bad("result", f"{result!r}: expected a profile name (lower-case letters, digits, dashes)")
        result = f"{name}-best"
    description = doc.get("description") or ""
    _across(knobs, sections["kernel"], budget, budget_ok, kernel, engine, bad)
    bounds.model_work(knobs, traffic, engine.conc, bad)
    if problems:
        raise SpaceError(problems)
    return Space(
        path=str(path),
        sha256=file_hash(text),
        name=str(name),
        base=str(base),
        knobs=knobs,
        traffic=traffic,
        budget=budget,
        model=model,
        kernel=kernel,
        engine=engine,
        live=live,
        result=str(result),
        description=str(description),
    )


def _head(doc: dict[Any, Any], bad: Any) -> tuple[object, object]:
    """Unknown top-level keys, schema version, name and base (a placeholder each when refused: later checks run)."""
    for key in sorted(set(map(str, doc)) - TOP_KEYS):
        bad(key, f"unknown key; expected one of {', '.join(sorted(TOP_KEYS))}")
    if doc.get("schema_version") != SCHEMA_VERSION:
        bad("schema_version", f"{doc.get('schema_version')!r}: expected {SCHEMA_VERSION}")
    name = doc.get("name")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        bad("name", f"{name!r}: expected lower-case letters, digits and dashes (at most 63), e.g. ctas-blockh")
        name = "tune"
    base = doc.get("base")
    if not isinstance(base, str) or not base:
        bad("base", "missing: name the current profile every candidate extends, e.g. base: ctas512")
        base = ""
    return name, base


def _sections(stages: object, bad: Any) -> dict[str, dict[str, Any]]:
    """Each stage's mapping (empty when missing or refused), unknown stages and keys refused."""
    if not isinstance(stages, dict):
        bad("stages", "missing: give at least stages.engine.host (the host the candidates are compared on)")
        stages = {}
    for key in sorted(set(map(str, stages)) - set(STAGE_KEYS)):
        bad(f"stages.{key}", f"unknown stage; expected {', '.join(STAGE_KEYS)}")
    sections: dict[str, dict[str, Any]] = {}
    for stage, allowed in STAGE_KEYS.items():
        raw = stages.get(stage, {})
        if not isinstance(raw, dict):
            bad(f"stages.{stage}", f"expected a mapping of {', '.join(sorted(allowed))}")
            raw = {}
        for key in sorted(set(map(str, raw)) - allowed):
            bad(f"stages.{stage}.{key}", f"unknown key; expected one of {', '.join(sorted(allowed))}")
        sections[stage] = raw
    return sections


def _across(
    knobs: dict[str, tuple[Any, ...]],
    kernel_section: dict[str, Any],
    budget: Budget,
    budget_ok: bool,
    kernel: KernelStage,
    engine: EngineStage,
    bad: Any,
) -> None:
    """What no section says alone: the number of candidates, a GPU host for kernel knobs, a host budget that covers
    one candidate's A/B (unless the budget was refused already) and GPU minutes for a kernel stage that runs."""
    bounds.candidates(knobs, bad)
    kernel_knobs = [k for k in knobs if k in KERNEL_KNOBS]
    if kernel_knobs and not {"host", "sweep", "skip"} & set(map(str, kernel_section)):  # a bad one: said above
        bad(
            "stages.kernel",
            f"the space varies kernel knobs ({', '.join(kernel_knobs)}) and names no GPU host; give "
            "stages.kernel.host (a host with a GPU), stages.kernel.sweep (a stored `kernel bench` sweep) or "
            'stages.kernel.skip: "why"',
        )
    if engine.host and budget_ok and budget.host_s < engine.round_s * 3:
        bad(
            "budget.host_minutes",
            f"{budget.host_s / 60:g} min cannot cover one candidate: its A/B needs at least 3 rounds of "
            f"~{engine.round_s:g}s (stages.engine.round); raise the budget",
        )
    if kernel.host is not None and kernel.skip is None and kernel.sweep is None and budget.gpu_s <= 0:
        bad("budget.gpu_minutes", "0: the kernel stage runs on a GPU host; give it minutes or skip the stage")


def _knobs(raw: object, bad: Any) -> dict[str, tuple[Any, ...]]:
    if not isinstance(raw, dict) or not raw:
        bad("knobs", "empty: name at least one knob with its values, e.g. SGLANG_SM120_MMA_TARGET_CTAS: [384, 512]")
        return {}
    out: dict[str, tuple[Any, ...]] = {}
    for key, spec in raw.items():
        name = str(key)
        values: list[Any]
        if isinstance(spec, list):
            values = spec
        elif isinstance(spec, dict) and set(spec) <= {"min", "max", "step"} and {"min", "max"} <= set(spec):
            lo, hi, step = spec.get("min"), spec.get("max"), spec.get("step", 1)
            nums = (lo, hi, step)
            if not all(isinstance(x, int) and not isinstance(x, bool) for x in nums):
                bad(f"knobs.{name}", "a range takes integers: {min: 256, max: 768, step: 128}")
                continue
            assert isinstance(lo, int) and isinstance(hi, int) and isinstance(step, int)
            if step < 1 or hi < lo:
                bad(f"knobs.{name}", f"range {lo}..{hi} step {step}: needs min <= max and step >= 1")
                continue
            if (hi - lo) // step + 1 > MAX_VALUES:
                bad(f"knobs.{name}", f"range {lo}..{hi} step {step}: more than {MAX_VALUES} values; use a larger step")
                continue
            values = list(range(lo, hi + 1, step))
        else:
            bad(f"knobs.{name}", "expected a list of values or a range {min: A, max: B, step: S}")
            continue
        if not values:
            bad(f"knobs.{name}", "no values: give at least one")
            continue
        if len(values) > MAX_VALUES:
            bad(f"knobs.{name}", f"{len(values)} values: more than {MAX_VALUES}")
            continue
        if any(isinstance(v, dict | list) or v is None for v in values):
            bad(f"knobs.{name}", "values must be scalars (numbers, strings, true/false)")
            continue
        if bounds.secret_value(name, values, bad):
            continue
        seen: list[Any] = []
        for v in values:
            if not any(v == s and type(v) is type(s) for s in seen):
                seen.append(v)
        out[name] = tuple(seen)
    return out


def _traffic(raw: object, bad: Any) -> dict[int, float] | None:
    if raw == "live":
        return None
    if not isinstance(raw, dict) or not raw:
        bad("traffic", "expected concurrency: weight pairs such as {48: 0.3, 64: 0.3, 80: 0.3, 96: 0.1}, or live")
        return {}
    out: dict[int, float] = {}
    for c, w in raw.items():
        ok_c = isinstance(c, int) and not isinstance(c, bool) and 1 <= c <= 1_000_000
        ok_w = isinstance(w, int | float) and not isinstance(w, bool) and math.isfinite(w) and w >= 0
        if not (ok_c and ok_w):
            bad(f"traffic.{c}", f"{w!r}: expected a concurrency >= 1 and a weight >= 0")
            continue
        assert isinstance(c, int) and isinstance(w, int | float)
        out[c] = float(w)
    if out and sum(out.values()) <= 0:
        bad("traffic", "weights add up to 0; give the buckets where the load is a weight > 0")
    return out


def _budget(raw: object, bad: Any) -> Budget:
    if not isinstance(raw, dict):
        bad("budget", "missing: e.g. {wall: 2h, host_minutes: 60, gpu_minutes: 10}")
        return Budget(0, 0, 0)
    for key in sorted(set(map(str, raw)) - {"wall", "host_minutes", "gpu_minutes"}):
        bad(f"budget.{key}", "unknown key; expected wall, host_minutes, gpu_minutes")
    wall = duration(raw.get("wall"))
    if wall is None:
        bad("budget.wall", f"{raw.get('wall')!r}: expected a duration such as 90m or 2h")
    minutes = {}
    for key in ("host_minutes", "gpu_minutes"):
        v = raw.get(key, 0)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            bad(f"budget.{key}", f"{v!r}: expected a number of minutes >= 0")
            v = 0
        minutes[key] = float(v) * 60
    return Budget(wall or 0.0, minutes["host_minutes"], minutes["gpu_minutes"])


def _model(sec: dict[str, Any], bad: Any) -> ModelStage:
    w = "stages.model"
    gpu = sec.get("gpu", ModelStage.gpu)
    gpus = waves.load_gpus()
    if gpu not in gpus:
        bad(f"{w}.gpu", f"{gpu!r}: unknown GPU; known: {', '.join(sorted(gpus))}")
        gpu = ModelStage.gpu
    return ModelStage(
        gpu=str(gpu),
        keep=int_field(sec, "keep", ModelStage.keep, 1, w, bad),
        margin=frac_field(sec, "margin", ModelStage.margin, w, bad),
        heads=int_field(sec, "heads", ModelStage.heads, 1, w, bad),
        context=int_field(sec, "context", ModelStage.context, 1, w, bad),
    )


def _kernel(sec: dict[str, Any], bad: Any) -> KernelStage:
    w = "stages.kernel"
    skip = skip_reason(sec, w, bad)
    host, sweep = sec.get("host"), sec.get("sweep")
    given = [k for k in ("host", "sweep", "skip") if k in sec]
    if len(given) > 1:
        bad(w, f"{' and '.join(given)}: give one of host, sweep or skip")
    if host is not None and (not isinstance(host, str) or not host):
        bad(f"{w}.host", f"{host!r}: expected an inventory host name")
        host = None
    if sweep is not None and (not isinstance(sweep, str) or not sweep):
        bad(f"{w}.sweep", f"{sweep!r}: expected the path of a `kernel bench` sweep (JSON)")
        sweep = None
    budget = duration(sec.get("budget", KernelStage.budget_s))
    if budget is None:
        bad(f"{w}.budget", f"{sec.get('budget')!r}: expected a duration such as 8m")
    return KernelStage(
        host=host,
        sweep=sweep,
        skip=skip,
        keep=int_field(sec, "keep", KernelStage.keep, 1, w, bad),
        budget_s=budget or KernelStage.budget_s,
    )


def _engine(sec: dict[str, Any], traffic: dict[int, float] | None, bad: Any) -> EngineStage:
    w = "stages.engine"
    host = sec.get("host")
    if not isinstance(host, str) or not host:
        bad(f"{w}.host", f"{host!r}: name the host the candidates are compared on (one inventory host)")
        host = ""
    round_s = duration(sec.get("round", EngineStage.round_s))
    if round_s is None:
        bad(f"{w}.round", f"{sec.get('round')!r}: expected a duration such as 60s (one AB/BA round's cost)")
    conc_raw = sec.get("conc")
    conc: tuple[int, ...]
    if conc_raw is None:
        conc = tuple(sorted(traffic)) if traffic else (48, 64, 80, 96)
    elif (
        isinstance(conc_raw, list)
        and conc_raw
        and all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in conc_raw)
    ):
        conc = tuple(sorted(set(conc_raw)))
    else:
        bad(f"{w}.conc", f"{conc_raw!r}: expected a list of concurrencies >= 1")
        conc = (48, 64, 80, 96)
    if traffic and set(conc) != set(traffic):
        bad(f"{w}.conc", f"{list(conc)}: must be the traffic's buckets {sorted(traffic)} (or left out)")
    return EngineStage(
        host=host,
        keep=int_field(sec, "keep", EngineStage.keep, 1, w, bad),
        max_rounds=int_field(sec, "max_rounds", EngineStage.max_rounds, 3, w, bad),
        round_s=round_s or EngineStage.round_s,
        conc=conc,
        n_mult=int_field(sec, "n_mult", EngineStage.n_mult, 1, w, bad),
        max_tokens=int_field(sec, "max_tokens", EngineStage.max_tokens, 1, w, bad),
        min_effect=frac_field(sec, "min_effect", EngineStage.min_effect, w, bad),
        max_regression=frac_field(sec, "max_regression", EngineStage.max_regression, w, bad),
    )


def grid(knobs: dict[str, tuple[Any, ...]]) -> list[dict[str, Any]]:
    """Every combination of the knobs' values (the exhaustive grid), in the file's order."""
    names = list(knobs)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(knobs[n] for n in names))]


def check_against(space: Space, catalog: Any) -> None:
    """Every knob is in the catalog, as an env knob, and every value valid for it (choices, bounds, type)."""
    from knobfleet.profiles.catalog import check_value, did_you_mean

    where = paths.display(Path(space.path))
    problems = []
    for name, values in space.knobs.items():
        knob = catalog.knobs.get(name)
        if knob is None:
            hint = did_you_mean(name, sorted(catalog.knobs)) or ""
            engine = f"{catalog.engine}@{catalog.version}" if catalog.version else catalog.engine
            problems.append(f"{where}: knobs.{name}: not a knob of {engine}{hint or '; see `knobfleet catalog show`'}")
            continue
        if knob.kind != "env":
            problems.append(f"{where}: knobs.{name}: a launch flag; tune varies env knobs only (for now)")
            continue
        for v in values:
            why = check_value(knob, v)
            if why:
                problems.append(f"{where}: knobs.{name}: {why}")
                break
    if problems:
        raise SpaceError(problems)

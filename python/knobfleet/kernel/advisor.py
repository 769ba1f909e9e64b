"""The wave advisor: the wave table of a profile (or --knob values) on a GPU, with the kernel's calibration when
one is stored, and TARGET_CTAS candidates ranked by predicted cost (``knobfleet waves``). Moved out of
``ops/``: it stands on the kernel wing (calibrations), which the use cases in ``ops/`` do not."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from knobfleet import paths, waves
from knobfleet.errors import KnobfleetError
from knobfleet.profiles.model import Profile
from knobfleet.profiles.store import ProfileStore


def store() -> ProfileStore:
    return ProfileStore()


@dataclass(frozen=True)
class WavePlan:
    sms: int
    heads: int
    knobs: waves.KernelKnobs
    rows: list[waves.WaveRow]
    cliffs: list[int]
    calibration: waves.Calibration | None = None
    calibration_note: str = ""
    context: int = waves.L_REF

    def as_json(self) -> dict[str, Any]:
        return {
            "calibration": self.calibration.fingerprint if self.calibration else None,
            "calibration_note": self.calibration_note,
            "sms": self.sms,
            "heads": self.heads,
            "knobs": knob_dict(self.knobs),
            "rows": [r.as_dict() for r in self.rows],
            "cliffs": self.cliffs,
        }


# The kernel knobs' names, in waves.DEFAULTS' order: target CTAs, heads per CTA, split bound, minimum chunk.
TARGET_KNOB, BLOCK_H_KNOB, NSPLIT_KNOB, MIN_CHUNK_KNOB = waves.DEFAULTS


def knob_dict(k: waves.KernelKnobs) -> dict[str, int]:
    return {
        TARGET_KNOB: k.target_ctas,
        BLOCK_H_KNOB: k.block_h,
        NSPLIT_KNOB: k.nsplit_max,
        MIN_CHUNK_KNOB: k.min_chunk,
    }


def resolve_sms(gpu: str | None, sms: int | None, profile: Profile | None) -> int:
    if sms is not None:
        if sms < 1:
            raise KnobfleetError(f"--sms: {sms} must be >= 1")
        return sms
    gpus = waves.load_gpus()
    name = gpu or (profile.fingerprint.gpu if profile else None) or "rtx-pro-6000"
    if name not in gpus:
        from knobfleet.profiles.catalog import did_you_mean

        hint = did_you_mean(name, sorted(gpus)) or f"; known: {', '.join(sorted(gpus))}; or pass --sms N"
        raise KnobfleetError(f"--gpu: unknown GPU {name!r}{hint}")
    return gpus[name]


def wave_knobs(profile: Profile | None, overrides: list[str]) -> waves.KernelKnobs:
    env: dict[str, object] = dict(profile.env) if profile else {}
    for item in overrides:
        name, sep, value = item.partition("=")
        if not sep or name not in waves.DEFAULTS:
            raise KnobfleetError(f"--knob {item!r}: expected NAME=VALUE with NAME one of {', '.join(waves.DEFAULTS)}")
        env[name] = value
    try:
        return waves.KernelKnobs.from_env(env)
    except ValueError as exc:
        raise KnobfleetError(f"--knob: {exc}") from None


def wave_plan(
    profile_name: str | None,
    knob_args: list[str],
    gpu: str | None,
    sms: int | None,
    heads: int,
    batches: list[int],
    context: int,
    use_calibration: bool = True,
) -> tuple[WavePlan, Profile | None]:
    """The wave table for a profile (or --knob values) on a GPU; with a stored calibration for that GPU
    (``waves calibrate``) the costs are predicted µs per kernel call, else relative units."""
    from knobfleet.kernel.commands import calibration_line

    profile = store().resolve(profile_name) if profile_name else None
    knobs = wave_knobs(profile, knob_args)
    name = gpu or (profile.fingerprint.gpu if profile else None)
    cal, note = calibration_line(name, sms) if use_calibration else (None, "calibration: off (--no-calibration)")
    n_sms = cal.sms if cal is not None and sms is None else resolve_sms(gpu, sms, profile)
    try:
        rows = waves.table(batches, knobs, n_sms, heads, context, cal)
    except ValueError as exc:
        raise KnobfleetError(f"waves: {exc}") from None
    return WavePlan(n_sms, heads, knobs, rows, waves.cliffs(rows), cal, note, context), profile


@dataclass(frozen=True)
class Suggestion:
    target_ctas: int
    weighted_cost: float
    relative: float
    written: str | None


def suggest_ctas(
    plan: WavePlan, base: Profile | None, weights: dict[int, float], top: int, write: bool
) -> list[Suggestion]:
    """Rank TARGET_CTAS candidates by predicted weighted cost (attention + split combine)."""

    def score(k: waves.KernelKnobs) -> float:
        total = sum(weights.values())
        cost = 0.0
        for b, w in weights.items():
            cost += w / total * waves.step_cost(b, k, plan.sms, plan.heads, plan.context, plan.calibration) / b
        return cost

    current = score(plan.knobs)
    candidates = sorted({32 * i for i in range(1, 65)} | {plan.knobs.target_ctas})
    scored = sorted(
        (
            (score(waves.KernelKnobs(c, plan.knobs.block_h, plan.knobs.nsplit_max, plan.knobs.min_chunk)), c)
            for c in candidates
        ),
        key=lambda t: (round(t[0], 9), t[1]),
    )
    out: list[Suggestion] = []
    for cost, ctas in scored:
        if len(out) >= top:
            break
        if ctas == plan.knobs.target_ctas:
            continue
        written = write_candidate(base, ctas) if write and base else None
        out.append(Suggestion(ctas, cost, cost / current - 1, written))
    return out


def write_candidate(base: Profile, ctas: int) -> str:
    st = store()
    name = f"{base.name}-ctas{ctas}"
    path = st.directory / f"{name}.yaml"
    body = (
        "# Written by `knobfleet waves --suggest`: a wave-model prediction, not a measurement.\n"
        f"# Validate it with: knobfleet ab {base.name} {name} --limit HOST\n"
        "schema_version: 1\n"
        f"name: {name}\n"
        "version: 1\n"
        f"extends: {base.name}\n"
        f"description: TARGET_CTAS {ctas} suggested by the wave planner for {base.name}.\n"
        "env:\n"
        f"  {TARGET_KNOB}: {ctas}\n"
    )
    from knobfleet import safefile

    if path.exists() or path.is_symlink():  # a dangling symlink too: never followed out of the project
        try:
            same = safefile.read_text(path, 64 * 1024, "profile") == body
        except safefile.FileRefused as exc:
            raise KnobfleetError(f"{paths.display(path)}: {exc}; nothing was written") from None
        if same:
            return paths.display(path)
        raise KnobfleetError(
            f"{paths.display(path)}: exists with other content; not overwritten "
            "(delete or rename it to write the suggestion)"
        )
    safefile.write_text(path, body)
    st.resolve(name, check_lock=False)
    return paths.display(path)

"""Renderings of the knobs themselves (pure): ``profile list``/``show``, ``catalog diff`` and the wave model's table
(``knobfleet waves``). Imported from ``knobfleet.report`` (which loads this module on first use).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from knobfleet.report_text import human, table

if TYPE_CHECKING:
    from knobfleet.profiles.model import Profile
    from knobfleet.waves import WaveRow


@human
def profile_list(rows: list[tuple[str, str, str, str]]) -> str:
    return table(["profile", "version", "extends", "description"], rows)


@human
def catalog_diff(d: Any) -> str:
    """``catalog diff``: the breaking changes first (removed, renamed, changed), then the additions, then the
    metric names knobfleet reads that changed; counts on the first line."""
    counts = {w: len(d.of(w)) for w in ("removed", "renamed", "changed", "added", "metric")}
    head = f"{d.engine} {d.old} -> {d.new}: " + ", ".join(f"{n} {w}" for w, n in counts.items())
    rows = []
    for c in [*d.of("removed"), *d.of("renamed"), *d.of("changed"), *d.of("added"), *d.of("metric")]:
        what = c.detail if c.what != "renamed" else f"-> {c.new_name} ({c.detail})"
        rows.append((c.what, c.name, what or "-"))
    return head + ("\n" + table(["change", "knob", "detail"], rows) if rows else "\nno difference")


@human
def profile_show(profile: Profile, locked: str | None) -> str:
    out = [
        f"profile    {profile.ref}  ({' -> '.join(profile.chain)})",
        f"engine     {profile.engine}",
        f"hash       {profile.content_hash}",
        f"lock       {'published' if locked == profile.content_hash else 'not locked yet'}",
    ]
    if profile.description:
        out.append(f"about      {profile.description}")
    out.append("env")
    out += [f"  {k}={v}" for k, v in profile.env_strings().items()]
    out.append("args")
    out += [f"  --{k}" if v is True else f"  --{k}={v}" for k, v in profile.args.items() if v is not False]
    g = profile.gate
    weights = ",".join(f"{c}={w:g}" for c, w in sorted(g.weights.items()))
    out.append(
        f"gate       baseline={g.baseline} conc={','.join(map(str, g.concurrency))} weights={weights} "
        f"min_effect={g.min_effect:g} max_regression={g.max_regression:g}"
    )
    return "\n".join(out)


def _short_names(names: list[str]) -> dict[str, str]:
    """Knob names without the prefix they all share (up to its last underscore), for compact tables."""
    import os.path

    common = os.path.commonprefix(names) if len(names) > 1 else ""  # noqa: RUF071 - knob names, not paths
    cut = common.rfind("_") + 1
    return {n: n[cut:] for n in names}


@human
def waves_table(
    rows: list[WaveRow], sms: int, heads: int, knobs: dict[str, int], cliffs: list[int], note: str = ""
) -> str:
    short = _short_names(list(knobs))
    knob_s = " ".join(f"{short[k]}={v}" for k, v in knobs.items())
    body = table(
        ["batch", "n_hg", "nsplit", "CTAs", "waves", "ceil", "last wave", "cost", "combine", "step", "step/req"],
        [
            [
                r.batch,
                r.n_hg,
                r.nsplit,
                r.ctas,
                f"{r.waves:.2f}",
                r.waves_ceil,
                f"{r.last_wave_ctas} CTAs ({r.last_wave_fill:.0%})",
                f"{r.cost:.3f}",
                f"{r.combine_cost:.3f}",
                f"{r.step_cost:.3f}",
                f"{r.step_cost / r.batch:.4f}",
            ]
            for r in rows
        ],
        align="rrrrrrrrrrr",
    )
    lines = [f"{sms} SMs, {heads} heads, {knob_s}", *([note] if note else []), body]
    for b in cliffs:
        lines.append(f"warning: cliff at batch {b}: attention cost per request rises as the batch grows")
    if rows:
        lines.append("step = cost (attention) + combine (split-K merge): the planner ranks TARGET_CTAS by step")
    return "\n".join(lines)

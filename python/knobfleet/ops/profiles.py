"""Use cases on profiles: resolve and validate them, their JSON schema, and what they render to on hosts.
Each function takes plain arguments, returns data for ``report``, and raises ``KnobfleetError`` subclasses; the
CLI maps those to exit codes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from knobfleet.errors import ProfileError
from knobfleet.profiles.model import Profile, ProfileDoc
from knobfleet.profiles.store import ProfileStore

if TYPE_CHECKING:  # jinja2 (render) costs ~50 ms to import; drift and verify never render
    from knobfleet.render import Rendered


def store() -> ProfileStore:
    return ProfileStore()


@dataclass(frozen=True)
class Validation:
    ok: list[Profile]
    unlocked: list[str]


def validate_profiles(names: list[str]) -> Validation:
    """Resolve every named profile (all when none named); collect every problem before failing."""
    st = store()
    targets = names or st.names()
    ok: list[Profile] = []
    problems: list[str] = []
    for name in targets:
        try:
            ok.append(st.resolve(name))
        except ProfileError as exc:
            problems.extend(p for p in exc.problems if p not in problems)
    if problems:
        raise ProfileError(problems)
    lock = st.read_lock()
    return Validation(ok, [p.ref for p in ok if p.ref not in lock])


def profile_schema() -> dict[str, Any]:
    return ProfileDoc.model_json_schema()


def render(profile_name: str, inventory: Path | None, host: str | None) -> list[Rendered]:
    profile = store().resolve(profile_name)
    from knobfleet.fleet.fleetkey import fleet_key
    from knobfleet.render import render_host

    key = fleet_key()
    return [render_host(profile, hv, secret_key=key) for hv in _hosts(inventory, host)]


def _hosts(inventory: Path | None, limit: str | None) -> list[Any]:
    from knobfleet.ops.fleet import hosts

    return hosts(inventory, limit)


def render_vars(profile_name: str, inventory: Path | None = None) -> str:
    """``render --what vars``: the profile and its engine as the role's extra vars (YAML, strings !unsafe), and
    with ``inventory``, its engine groups' per-rank vars (``knob_serve_groups``: what knobfleet passes to the role
    so that each rank renders its own --node-rank), so a plain ``ansible-playbook -e @FILE`` renders every host
    as ``apply`` would."""
    from knobfleet.engines.adapter import engine
    from knobfleet.fleet.runner import dump_vars
    from knobfleet.render import profile_vars

    profile = store().resolve(profile_name)
    adapter = engine(profile.engine)
    unsafe: dict[str, Any] = {"knob_serve_profile": profile_vars(profile), "knob_serve_engine": adapter.role_vars()}
    if inventory is not None:
        from knobfleet.ops import ranks

        groups = ranks.of(_hosts(inventory, None))
        if groups:
            unsafe["knob_serve_groups"] = ranks.role_vars(groups, adapter.name)
    return dump_vars({}, unsafe)


def rendered_json(r: Rendered) -> dict[str, Any]:
    from knobfleet.module_utils.knob_redact import shown_digest

    return {
        "host": r.host,
        "script_sha256": shown_digest(r.script_sha256, r.script_shown != r.script, r.secret_key),
        "unit_sha256": shown_digest(r.unit_sha256, r.unit_shown != r.unit, r.secret_key),
        "env": r.env_shown,
        "argv": r.argv_shown,
    }

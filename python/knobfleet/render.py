"""Pure rendering: (profile, host vars) → serve script, unit, expected env and argv, and hashes.

The templates live once, in ``roles/knob_serve/templates/``; this module renders them with jinja2
configured like Ansible's ``template`` module (trim_blocks, trailing newline kept) and the same
filters the templates use (``quote``, ``combine``), so its bytes equal what Ansible writes — the
integration tests compare them. ``template_vars`` is also what the runner hands to Ansible.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2

from knobfleet import paths
from knobfleet.errors import RenderError
from knobfleet.groups import EngineGroup, RankSpec, rank_flags
from knobfleet.module_utils import knob_argv
from knobfleet.profiles.model import Profile, arg_tokens

if TYPE_CHECKING:  # render reads a host's vars; it never resolves anything through them
    from knobfleet.engines.adapter import Engine
    from knobfleet.fleet.hostvars import HostVars

SCRIPT_TEMPLATE = "serve.sh.j2"
LAUNCHER_TEMPLATE = "launcher.json.j2"  # the one place that decides the launcher (the role reads it too)
CACHE_TEMPLATE = "compile_cache.json.j2"  # the one place that decides the compile caches' folder (the role's too)
UNIT_TEMPLATE = "unit.service.j2"


@dataclass(frozen=True)
class Rendered:
    host: str
    script: str
    unit: str
    env: dict[str, str]
    argv: list[str]
    script_path: str = ""
    unit_path: str = ""
    secret: tuple[str, ...] = ()  # names/patterns of secret env vars and flags (knob_redact.is_secret)
    secret_key: str = field(default="", repr=False)  # the fleet's marker key (fleet/fleetkey.py)

    # What anything but the engine ever sees: every secret value (env, flag, wherever in the script) replaced
    # by its marker, once, here, before any text, diff, report or JSON is made of it.
    @cached_property
    def script_shown(self) -> str:
        from knobfleet.module_utils.knob_redact import redact_script

        return redact_script(self.script, self.secret, self.secret_key)

    @cached_property
    def unit_shown(self) -> str:
        from knobfleet.module_utils.knob_redact import redact_unit

        return redact_unit(self.unit, self.secret, self.secret_key)

    @cached_property
    def env_shown(self) -> dict[str, str]:
        from knobfleet.module_utils.knob_redact import redact_env

        return redact_env(self.env, self.secret, self.secret_key)

    @cached_property
    def argv_shown(self) -> list[str]:
        from knobfleet.module_utils.knob_redact import redact_argv

        return redact_argv(self.argv, self.secret, self.secret_key)

    @property
    def script_sha256(self) -> str:
        return sha256_text(self.script)

    @property
    def unit_sha256(self) -> str:
        return sha256_text(self.unit)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _quote(value: Any) -> str:
    # Same as ansible.plugins.filter.core.quote
    return shlex.quote("" if value is None else str(value))


def _combine(*dicts: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for d in dicts:
        out.update(d)
    return out


@cache
def _environment(template_dir: Path) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir)),
        trim_blocks=True,
        lstrip_blocks=False,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
    )
    env.filters["quote"] = _quote
    env.filters["combine"] = _combine
    env.filters["to_json"] = lambda value: json.dumps(value)
    return env


def profile_vars(profile: Profile) -> dict[str, Any]:
    """The profile as the role sees it: env values as strings, args as strings or true; false dropped."""
    args: dict[str, str | bool] = {}
    for flag, value in profile.args.items():
        if value is True:
            args[flag] = True
        elif value is not False:
            args[flag] = str(value)
    return {
        "name": profile.name,
        "version": profile.version,
        "hash": profile.content_hash,
        "env": profile.env_strings(),
        "args": args,
        "allow_unknown": list(profile.allow_unknown),  # the role's preflight lets these loader variables through
        # the pinned engine version: the role launches its install from knob_serve_launchers (render.launcher_of)
        **({"engine_version": profile.engine_version} if profile.engine_version else {}),
    }


# The host vars the engine's fixed arguments are filled from ({model}, {host}, {port} in its catalog).
PLACEHOLDER_VARS = {"{model}": "knob_serve_model_path", "{host}": "knob_serve_listen_host", "{port}": "knob_serve_port"}


def host_var_of(adapter: Any, flag: str) -> str:
    """The knob_serve_* var behind a reserved flag (``--host={host}`` → knob_serve_listen_host)."""
    for token in adapter.fixed_args:
        if token.startswith(f"--{flag}="):
            for placeholder, var in PLACEHOLDER_VARS.items():
                if placeholder in token:
                    return var
    return "knob_serve_launcher"


def check_conflicts(profile: Profile, hv: HostVars, engine: Engine | None = None) -> None:
    """A key set by both the host vars and the profile is an error naming both places; so is a profile for
    another engine than the host declares. ``engine``: the profile's engine (resolved when not given)."""
    if hv.engine is not None and hv.engine != profile.engine:
        raise RenderError(
            f"profile {profile.name} is for engine {profile.engine}, but host {hv.host} runs {hv.engine} "
            "(inventory var knob_engine); apply a profile of that engine, or change knob_engine"
        )
    adapter = engine or _engine(profile)
    reserved = adapter.reserved_flags
    problems = []
    for name in sorted(set(profile.env) & set(hv.host_env)):
        problems.append(
            f"env {name} is set by the profile {profile.name} and by host {hv.host}'s "
            f"knob_serve_host_env; remove it from one of them"
        )

    def flag_of(name: str) -> str:  # the flag the engine reads (--tp and --tensor-parallel-size are --tp-size)
        return knob_argv.canonical(name, adapter.argv_spec) or name

    launch_line = {flag_of(f): f for f in reserved}
    for flag in sorted(hv.host_args):
        if flag_of(flag) in launch_line:
            problems.append(
                f"flag --{flag} is set by host {hv.host}'s knob_serve_host_args and by its "
                f"{host_var_of(adapter, launch_line[flag_of(flag)])} (the launch line carries it); remove it from "
                "knob_serve_host_args"
            )
    host_flags = {flag_of(f): (host_var_of(adapter, f), f) for f in reserved}
    host_flags.update({flag_of(f): ("knob_serve_host_args", f) for f in hv.host_args})
    for flag in sorted(profile.args):
        if flag_of(flag) in host_flags:
            source, spelled = host_flags[flag_of(flag)]
            also = "" if spelled == flag else f" (as --{spelled})"
            problems.append(
                f"flag --{flag} is set by the profile {profile.name} and by host {hv.host}'s "
                f"{source}{also}; remove it from one of them"
            )
    if hv.group is not None:  # the per-rank flags are knobfleet's to render (groups.rank_flags)
        ranked = {flag_of(f) for f in rank_flags(hv.group, hv.host, rank_spec(hv.group, adapter))}
        for source, flags in ((f"the profile {profile.name}", profile.args), ("knob_serve_host_args", hv.host_args)):
            for flag in sorted(flags):
                if flag_of(flag) in ranked:
                    problems.append(
                        f"flag --{flag} is set by {source} on host {hv.host}, a rank of engine group "
                        f"{hv.group.name}: knobfleet renders each rank's --{flag_of(flag)} from knob_engine_groups; "
                        "remove it"
                    )
    if problems:
        raise RenderError("\n".join(problems))


def _engine(profile: Profile) -> Engine:
    from knobfleet.engines.adapter import engine

    return engine(profile.engine)


def launcher_of(profile: Profile, hv: HostVars) -> tuple[str, ...] | None:
    """The launcher the host's serve script runs: the install of the version the profile pins, where the host names
    its installs (``knob_serve_launchers``); else ``knob_serve_launcher`` (None: the engine's own)."""
    if profile.engine_version and hv.launchers:
        got = hv.launchers.get(profile.engine_version)
        if got is None:
            have = ", ".join(sorted(hv.launchers)) or "none"
            raise RenderError(
                f"host {hv.host}: profile {profile.ref} pins {profile.engine} {profile.engine_version}, but "
                f"knob_serve_launchers names no install of it (has: {have}); add "
                f"knob_serve_launchers['{profile.engine_version}']: [that install's launcher]"
            )
        if not got or any(not a or "\0" in a for a in got):
            raise RenderError(f"host {hv.host}: knob_serve_launchers['{profile.engine_version}']: must be a "
                              "non-empty list of non-empty arguments without NUL bytes")  # fmt: skip
    # the role's own template decides (templates/launcher.json.j2): one place, read by the role's preflight too
    variables = {
        "knob_serve_profile": profile_vars(profile),
        "knob_serve_launcher": list(hv.launcher or ()),
        "knob_serve_launchers": {k: list(v) for k, v in (hv.launchers or {}).items()},
    }
    env = _environment(paths.roles_dir() / "knob_serve" / "templates")
    chosen = json.loads(env.get_template(LAUNCHER_TEMPLATE).render(variables))
    return tuple(str(a) for a in chosen) or None


def compile_cache_of(profile: Profile, hv: HostVars, engine: Engine | None = None) -> dict[str, Any]:
    """Where the host's engine keeps its JIT and compile caches (docs/CACHES.md): ``{}`` when off, else ``root``
    (the service's cache folder), ``dir`` (the engine's folder in it: ``<engine>@<version>`` where the profile pins
    one) and ``env`` (each catalog cache variable -> its subfolder). The role's own template decides
    (templates/compile_cache.json.j2), read by its preflight too."""
    adapter = engine or _engine(profile)
    variables = {
        "knob_serve_compile_cache": hv.compile_cache,
        "knob_serve_engine": {"name": adapter.name, "compile_caches": dict(adapter.compile_caches)},
        "knob_serve_profile": profile_vars(profile),
        "knob_serve_state_root": hv.state_root,
        "knob_serve_service": hv.service,
    }
    env = _environment(paths.roles_dir() / "knob_serve" / "templates")
    return dict(json.loads(env.get_template(CACHE_TEMPLATE).render(variables)))


def template_vars(profile: Profile, hv: HostVars, engine: Engine | None = None) -> dict[str, Any]:
    """Every variable the knob_serve templates read, exactly as Ansible will see it."""
    return {
        "knob_serve_profile": profile_vars(profile),
        "knob_serve_service": hv.service,
        "knob_serve_script_path": hv.script_path,
        "knob_serve_user": hv.user,
        "knob_serve_launcher": list(launcher_of(profile, hv) or ()),
        "knob_serve_engine": (engine or _engine(profile)).role_vars(),
        "knob_serve_model_path": hv.model_path,
        "knob_serve_listen_host": hv.listen_host,
        "knob_serve_port": hv.port,
        "knob_serve_host_env": dict(hv.host_env),
        "knob_serve_host_args": dict(hv.host_args),
        "knob_serve_rank_args": rank_args(hv, engine or _engine(profile)),
        "knob_serve_restart": hv.restart,
        "knob_serve_restart_sec": hv.restart_sec,
        "knob_serve_timeout_start_s": hv.timeout_start_s,
        "knob_serve_timeout_stop_s": hv.timeout_stop_s,
        "knob_serve_runtime": hv.runtime,
        "knob_serve_image": hv.image,
        "knob_serve_container_options": list(hv.container_options),
        "knob_serve_cache": compile_cache_of(profile, hv, engine),
    }


def rank_args(hv: HostVars, engine: Engine) -> dict[str, str | bool]:
    """The flags of ``hv``'s rank in its engine group (none for a host alone)."""
    return rank_flags(hv.group, hv.host, rank_spec(hv.group, engine)) if hv.group is not None else {}


def rank_spec(group: EngineGroup, engine: Engine) -> RankSpec:
    """The engine's rank flags (catalog ``serve.ranks``) where ``group`` is a tensor-parallel one; none for a
    prefill/decode group, whose servers are independent engines. An engine without them is refused in one line."""
    return engine.ranks(f"engine group {group.name}") if group.kind == "tp" else ({}, {})


def expected_env(profile: Profile, hv: HostVars, engine: Engine | None = None) -> dict[str, str]:
    """The env the serve script exports: the compile caches' variables, then the host's, then the profile's (a
    later one wins: a profile or host setting a cache variable keeps its own value)."""
    caches = compile_cache_of(profile, hv, engine).get("env") or {}
    merged = {**caches, **hv.host_env, **profile.env_strings()}
    return {k: merged[k] for k in sorted(merged)}


def expected_argv(profile: Profile, hv: HostVars, engine: Engine | None = None) -> list[str]:
    engine = engine or _engine(profile)
    argv = engine.head_argv(launcher_of(profile, hv), hv.model_path, hv.listen_host, hv.port)
    merged: dict[str, Any] = {**hv.host_args, **rank_args(hv, engine), **profile.args}
    for flag in sorted(merged):
        argv.extend(arg_tokens(flag, merged[flag]))
    return argv


def render_host(
    profile: Profile,
    hv: HostVars,
    template_dir: Path | None = None,
    engine: Engine | None = None,
    secret_key: str = "",
) -> Rendered:
    """Pure: the host's serve script, unit, env and argv. ``engine``: the profile's engine adapter, resolved once
    by the caller for every host (resolved here when not given). ``secret_key``: the fleet's marker key
    (fleet/fleetkey.py), which the caller reads; without one, secret values show as ``<secret>``."""
    engine = engine or _engine(profile)
    check_conflicts(profile, hv, engine)
    env = _environment(template_dir or paths.roles_dir() / "knob_serve" / "templates")
    variables = template_vars(profile, hv, engine)
    try:
        script = env.get_template(SCRIPT_TEMPLATE).render(variables)
        unit = env.get_template(UNIT_TEMPLATE).render(variables)
    except jinja2.TemplateError as exc:
        raise RenderError(f"roles/knob_serve/templates: {exc}") from None
    return Rendered(
        hv.host,
        script,
        unit,
        expected_env(profile, hv, engine),
        expected_argv(profile, hv, engine),
        hv.script_path,
        hv.unit_path,
        tuple(hv.secrets(profile.engine)),
        secret_key,
    )

"""Per-host settings (``knob_serve_*`` inventory vars) as a strict model. Pure: no inventory I/O here."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from knobfleet import rules
from knobfleet.errors import InventoryError
from knobfleet.groups import EngineGroup, GroupError
from knobfleet.groups import parse as parse_groups

if TYPE_CHECKING:
    from knobfleet.engines.adapter import Engine

# The one rule set (roles/knob_serve/vars/rules.json), shared with the role's preflight; always fullmatch():
# `$` lets "\n" through.
SAFE_PATH_RE = rules.regex("path")
SERVICE_RE = rules.regex("service")
USER_RE = rules.regex("user")  # what lands in the unit's User=
LISTEN_RE = rules.regex("listen_host")  # an address or host name: lands in argv and URLs
PREFIX = "knob_serve_"
# The router that fronts a host (fleet.router): inventory var -> HostVars field.
ROUTER_VARS = {
    "knob_router_url": "router_url",
    "knob_router_kind": "router_kind",
    "knob_drain_timeout": "drain_timeout_s",
    "knob_router_max_unavailable": "router_max_unavailable",
}
# Secrets are never copied; only whether one is set (the fast path cannot type a password).
SECRET_VARS = ("ansible_password", "ansible_ssh_pass", "ansible_ssh_password")


@cache
def connection_vars() -> frozenset[str]:
    """How Ansible reaches a host, as the transports declare it: the union of every registered transport's
    ``reads`` (a new transport brings its own keys; nothing here lists them), less the secret ones, which are never
    copied (only whether one is set). Kept so a transport connects exactly as Ansible would."""
    from knobfleet.fleet.transports import REGISTRY

    wanted: set[str] = set().union(*(t.reads for t in REGISTRY.values()))
    return frozenset(k for k in wanted if k not in SECRET_VARS and "pass" not in k)


@cache
def role_defaults() -> dict[str, Any]:
    """roles/knob_serve/defaults/main.yml: the one place the role's defaults are written (the host-var model
    takes its defaults from there, so controller and role cannot disagree)."""
    import yaml

    from knobfleet import paths

    data = yaml.safe_load((paths.roles_dir() / "knob_serve" / "defaults" / "main.yml").read_text(encoding="utf-8"))
    return dict(data or {})


def _default(name: str) -> Any:
    return role_defaults()[PREFIX + name]


# The fields checked by one rule of rules.json each (the rule's name).
RULE_OF = {"script_path": "path", "unit_dir": "path", "state_root": "path", "model_path": "path", "user": "user",
           "listen_host": "listen_host"}  # fmt: skip


class HostVars(BaseModel):
    """What knobfleet needs to know about one host. Defaults mirror ``roles/knob_serve/defaults``."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    host: str
    address: str = ""
    service: str = Field(default_factory=lambda: str(_default("service")))
    script_path: str = Field(default_factory=lambda: str(_default("script_path")))
    unit_dir: str = "/etc/systemd/system"
    state_root: str = "/var/lib/knobfleet"
    user: str = "root"
    compile_cache: bool | str = Field(
        default_factory=lambda: _default("compile_cache"),
        description="the engine's JIT/compile caches, kept across generations (knob_serve_compile_cache; "
        "docs/CACHES.md): true = <state_root>/.compile-cache/<service>, an absolute path = that folder, false = off "
        "(the default: turning it on changes every host's script and unit, so each restarts once)",
    )
    engine: str | None = Field(default=None, description="the engine this host runs (inventory var knob_engine)")
    launcher: tuple[str, ...] | None = Field(default=None, description="None: the engine's launcher")
    runtime: Literal["systemd", "docker", "podman"] = Field(
        default="systemd", description="what runs the engine (knob_serve_runtime; python/knobfleet/runtimes.py)"
    )
    image: str = Field(default="", description="docker/podman: the engine's image, by ID (knob_serve_image)")
    container_options: tuple[str, ...] = Field(
        default=(), description="docker/podman: more `run` options, --name=value words (knob_serve_container_options)"
    )
    model_path: str = Field(default_factory=lambda: str(_default("model_path")))
    listen_host: str = "127.0.0.1"
    port: int = Field(default=30000, ge=1, le=65535)
    readiness_path: str | None = Field(default=None, description="None: the engine's readiness path")
    readiness_timeout_s: int = Field(default=600, ge=1)
    readiness_grace_s: int = Field(default=0, ge=0)
    host_env: dict[str, str] = Field(default_factory=dict)
    secret_env: tuple[str, ...] = Field(
        default=(),
        description="env or flag names (or patterns) whose values are secret, on top of the catalog's and knobfleet's "
        "patterns; the inventory reader adds the host vars whose values came from Ansible Vault",
    )
    host_args: dict[str, str | bool] = Field(default_factory=dict)
    restart: Literal["always", "on-failure", "on-abnormal", "on-abort", "on-watchdog", "on-success", "no"] = Field(
        default="always",
        description="systemd Restart= of the unit; always, since vLLM exits 0 when its EngineCore dies",
    )
    restart_sec: int = Field(default=5, ge=0)
    timeout_start_s: int = Field(default=900, ge=1)
    timeout_stop_s: int = Field(default=60, ge=1)
    foreign_dropins: Literal["fail", "remove"] = Field(
        default="fail", description="a drop-in knobfleet did not write: refuse the host, or move it into the backup"
    )
    profile: str | None = Field(default=None, description="the profile this host is declared to run")
    connection: dict[str, str] = Field(default_factory=dict, description="ansible_* connection vars, templated")
    router_url: str | None = Field(default=None, description="the router that fronts this host (knob_router_url)")
    router_kind: str = Field(default="sglang", description="how to talk to it (knob_router_kind; fleet.router_kinds)")
    drain_timeout_s: int = Field(default=120, ge=1, description="wait at most this for in-flight requests to end")
    router_max_unavailable: str = Field(default="1", description="workers of one router out at once: N or N%")
    group: EngineGroup | None = Field(
        default=None, description="the engine group this host is a rank of (knob_engine_groups; groups.py)"
    )
    version_file: str = Field(
        default="", description="a file whose first line is the engine version (the probe reports it; empty: none)"
    )
    launchers: dict[str, tuple[str, ...]] = Field(
        default_factory=dict,
        description="engine version -> the launcher argv of that version's install on this host "
        "(knob_serve_launchers): a profile that pins engine_version launches that one, so an upgrade is a rollout",
    )
    engine_version: str = Field(
        default="",
        description="the engine version this host runs, as the operator names it (knob_serve_engine_version): the "
        "profile is validated against that version's catalog; overrides what version_file says",
    )

    @field_validator(*RULE_OF)
    @classmethod
    def _by_rule(cls, value: str, info: ValidationInfo) -> str:
        why = rules.check(RULE_OF[info.field_name or ""], value)
        if why:
            raise ValueError(why)
        return value

    @field_validator("compile_cache")
    @classmethod
    def _compile_cache(cls, value: bool | str, info: ValidationInfo) -> bool | str:
        if isinstance(value, bool):
            return value
        how = "set it to true (the default folder), false (no cache) or an absolute path of its own"
        why = rules.check("path", value)
        if why:
            raise ValueError(f"{rules.shown(value)} must be {why}; {how}")
        if value.count("/") < 2 or value.endswith("/"):
            raise ValueError(f"{value} is too near the root: the engine's user would own it; {how}")
        state = f"{info.data.get('state_root', '')}/{info.data.get('service', '')}"
        owned = {"the service's state folder": state, "knob_serve_unit_dir": str(info.data.get("unit_dir", "")),
                 "knob_serve_script_path": str(info.data.get("script_path", ""))}  # fmt: skip
        for what, path in owned.items():
            if path and _overlaps(value, path):
                raise ValueError(f"{value} overlaps {what} {path} (root's, never the engine user's); {how}")
        return value

    @field_validator("router_url")
    @classmethod
    def _router_url(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"https?://[A-Za-z0-9.:\[\]-]+(/[A-Za-z0-9._~/-]*)?", value):
            raise ValueError("must be the router's base URL such as http://router.example:30080")
        return value

    @field_validator("router_max_unavailable")
    @classmethod
    def _max_unavailable(cls, value: str) -> str:
        if not re.fullmatch(r"[1-9][0-9]*%?", value.strip()) or (value.endswith("%") and int(value[:-1]) > 100):
            raise ValueError("must be a count such as 1 or a percentage such as 25%")
        return value.strip()

    @field_validator("launcher")
    @classmethod
    def _launcher(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None and (not value or any(not a or "\0" in a for a in value)):
            raise ValueError("must be a non-empty list of non-empty arguments without NUL bytes")
        return value

    @model_validator(mode="after")
    def _runtime(self) -> HostVars:
        from knobfleet.runtimes import runtime

        problems = runtime(self.runtime).problems(self.image, self.container_options, self.compile_cache_root or "")
        if problems:
            raise ValueError(problems[0])
        return self

    @field_validator("host_env", "host_args", mode="after")
    @classmethod
    def _no_nul(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name, v in value.items():
            if isinstance(v, str) and "\0" in v:
                raise ValueError(f"{name}: a NUL byte cannot be in an env value or an argument")
        return value

    @field_validator("engine")
    @classmethod
    def _engine(cls, value: str | None) -> str | None:
        from knobfleet.profiles.model import ENGINE_NAME_RE

        if value is not None and not ENGINE_NAME_RE.fullmatch(value):
            raise ValueError("must be an engine name with a catalog (e.g. the name of profiles/catalogs/NAME.yaml)")
        return value

    @field_validator("readiness_path")
    @classmethod
    def _readiness(cls, value: str | None) -> str | None:
        if value == "":
            return None  # empty: the engine's own readiness path (as in the role's defaults)
        why = None if value is None else rules.check("url_path", value)
        if why:
            raise ValueError(why)
        return value

    @field_validator("service")
    @classmethod
    def _service(cls, value: str) -> str:
        why = rules.check("service", value)
        if why:
            raise ValueError(why)
        if rules.is_reserved_unit(value):
            raise ValueError(
                f"{value!r} is a unit the host itself needs; an apply would write /etc/systemd/system/"
                f"{value.removesuffix('.service')}.service over it and restart it: name the engine's own service"
            )
        return value.removesuffix(".service")

    @field_validator("host_env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            why = rules.check("env_name", name)
            if why:
                raise ValueError(f"{name!r} is not a valid env var name: {why}")
            if rules.is_shell_reserved(name):
                raise ValueError(f"{name!r}: bash will not let the serve script set it (read-only); remove it")
        return value

    @field_validator("host_args")
    @classmethod
    def _flag_names(cls, value: dict[str, str | bool]) -> dict[str, str | bool]:
        for name in value:
            why = rules.check("flag_name", name)
            if why:
                raise ValueError(f"{name!r} is not a valid flag name (no leading dashes): {why}")
        return value

    @property
    def compile_cache_root(self) -> str | None:
        """The service's compile-cache folder on the host (None: off). The role's templates/compile_cache.json.j2
        decides the same (tests/unit/test_compile_cache_render.py holds them equal)."""
        if self.compile_cache is False:
            return None
        if isinstance(self.compile_cache, str):
            return self.compile_cache
        return f"{self.state_root}/.compile-cache/{self.service}"

    @property
    def unit_name(self) -> str:
        return f"{self.service}.service"

    @property
    def unit_path(self) -> str:
        return f"{self.unit_dir}/{self.unit_name}"

    @property
    def service_state_dir(self) -> str:
        return f"{self.state_root}/{self.service}"

    def secrets(self, engine: str | None = None) -> list[str]:
        """This host's part of the one notion of a secret (module_utils/knob_redact.is_secret): env and flag names
        or patterns declared here (knob_serve_secret_env, and those whose values came from vault), those whose
        values are shaped like a secret (``knob_redact.secret_shape``: a URL with a password, a JWT, a provider's
        token, whatever the name) and those the engine's catalog marks (``!NAME``: marked not secret).
        knobfleet's own patterns apply on top."""
        from knobfleet.module_utils.knob_redact import secret_shape
        from knobfleet.profiles.catalog import catalog_for

        try:
            marked = catalog_for(engine or self.engine or self.adapter().name).secret_names()
        except Exception:  # an unknown engine is reported where the catalog is needed
            marked = ()
        shaped = {str(k) for k, v in self.host_env.items() if secret_shape(v)}
        shaped |= {str(k).removeprefix("--") for k, v in self.host_args.items() if secret_shape(v)}
        return sorted({*self.secret_env, *marked, *shaped})

    def has_secrets(self) -> bool:
        """Whether a value of this host's vars is secret (such hosts are never cached)."""
        from knobfleet.module_utils.knob_redact import is_secret, is_secret_flag

        names = self.secrets()
        return any(is_secret(k, names) for k in self.host_env) or any(
            is_secret_flag(k, names) and not isinstance(v, bool) for k, v in self.host_args.items()
        )

    @property
    def base_url(self) -> str:
        return f"http://{self.listen_host}:{self.port}"

    def adapter(self, name: str | None = None) -> Engine:
        """The engine adapter for this host: ``name`` (a profile's engine), else the host's, else the default."""
        from knobfleet.engines.adapter import engine

        return engine(name or self.engine)

    @property
    def health_url(self) -> str:
        return self.base_url + (self.readiness_path or self.adapter().readiness_path)


def _overlaps(a: str, b: str) -> bool:
    """Whether one of two absolute paths is the other or inside it."""
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


# Integer host vars: ``true`` is not a port (pydantic would read it as 1), nor is 30000.5.
INT_VARS = ("port", "readiness_timeout_s", "readiness_grace_s", "restart_sec", "timeout_start_s", "timeout_stop_s")


def _name(key: object, var: str, refuse: Callable[[str, str], InventoryError]) -> str:
    if not isinstance(key, str):  # YAML reads `true:` or `1:` as a bool or a number, not a name
        raise refuse(var, f"{key!r} is a {type(key).__name__}, not a name; quote it")
    return key


def _scalar(value: object, var: str, key: str, refuse: Callable[[str, str], InventoryError]) -> str | bool:
    """A host env value or host arg as the text that runs; values that would silently become another text are
    refused (null → 'None', true → 'True' in an env var, a list → its repr)."""
    if isinstance(value, bool):
        if key == "host_args":
            return value  # true: a bare flag; false: omitted
        raise refuse(var, f"{str(value).lower()} would become the text {value!s}; write '1' or '0' (quoted)")
    if value is None:
        fix = "true for a bare flag, false to leave it out" if key == "host_args" else "'' for an empty value"
        raise refuse(var, f"null would become the text None; write {fix}, or remove the key")
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise refuse(var, f"{value} is not a finite number")
        return str(value)
    raise refuse(var, f"a {type(value).__name__} is not a value; write a string, a number or true/false")


def _integer(value: object, var: str, refuse: Callable[[str, str], InventoryError]) -> object:
    """An integer host var: an int, or the digits a template renders; never a bool, a float or null."""
    if isinstance(value, bool) or value is None or isinstance(value, float):
        shown = "null" if value is None else str(value).lower()
        raise refuse(var, f"{shown} is not an integer; write a whole number such as 30000")
    if isinstance(value, str):
        digits = value
        if not (digits.isascii() and digits.isdigit() and len(digits) <= 18):
            raise refuse(var, f"{rules.shown(value)} is not an integer; write a whole number")
        return int(digits)
    return value


def from_inventory_vars(host: str, variables: dict[str, Any], where: str) -> HostVars:
    """Build HostVars from one host's (already templated) inventory variables."""
    data: dict[str, Any] = {k[len(PREFIX) :]: v for k, v in variables.items() if k.startswith(PREFIX)}
    data["host"] = host
    data["address"] = str(variables.get("ansible_host", host))
    data["connection"] = {k: str(variables[k]) for k in sorted(connection_vars()) if variables.get(k) is not None}
    data["connection"].update({k: "<set>" for k in SECRET_VARS if variables.get(k)})
    if "knob_profile" in variables:
        data["profile"] = variables["knob_profile"]
    if "knob_engine" in variables:
        data["engine"] = variables["knob_engine"]
    for var, key in ROUTER_VARS.items():
        if variables.get(var) not in (None, ""):
            data[key] = str(variables[var]) if key in ("router_url", "router_max_unavailable") else variables[var]

    def refuse(var: str, why: str) -> InventoryError:
        return InventoryError(f"{where}: host {host}: {var}: {why}; fix it in host_vars or group_vars")

    for key in ("host_env", "host_args"):
        if isinstance(data.get(key), dict):
            data[key] = {
                _name(k, f"{PREFIX}{key}", refuse): _scalar(v, f"{PREFIX}{key}.{rules.shown(str(k))}", key, refuse)
                for k, v in data[key].items()
            }
    for key in INT_VARS:
        if key in data:
            data[key] = _integer(data[key], f"{PREFIX}{key}", refuse)
    try:
        return HostVars.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        names = {"engine": "knob_engine", "profile": "knob_profile", **{v: k for k, v in ROUTER_VARS.items()}}
        var = names.get(field, f"{PREFIX}{field}")
        raise InventoryError(f"{where}: host {host}: {var}: {err['msg']}; fix it in host_vars or group_vars") from None


def attach_groups(
    hosts: list[HostVars], declared: dict[str, Any], addresses: dict[str, str], where: str
) -> list[HostVars]:
    """``hosts`` with the engine group each one is a rank of. ``declared``: each host's ``knob_engine_groups``
    (one declaration for the whole inventory: group_vars/all); ``addresses``: every inventory host's address
    (a ``--limit`` may leave some ranks out of ``hosts``)."""
    seen = {h: d for h, d in declared.items() if d not in (None, {}, "")}
    if not seen:
        return hosts
    first_host, decl = next(iter(seen.items()))
    for host, other in seen.items():
        if other != decl:
            raise GroupError(
                f"{where}: knob_engine_groups differs between hosts {first_host} and {host}; declare it once, "
                "in group_vars/all"
            )
    try:
        groups = parse_groups(decl, addresses)
    except GroupError as exc:
        raise GroupError(f"{where}: {exc}") from None
    of = {m.host: g for g in groups for m in g.members}
    for g in groups:
        blind = [m.host for m in g.members if m.host in declared and m.host not in seen]
        if blind:
            raise GroupError(
                f"{where}: knob_engine_groups.{g.name}: {blind[0]} is a member but its vars do not declare the "
                "groups; declare knob_engine_groups in group_vars/all"
            )
    return [hv.model_copy(update={"group": of[hv.host]}) if hv.host in of else hv for hv in hosts]

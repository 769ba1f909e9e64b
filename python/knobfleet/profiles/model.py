"""Strict, frozen models of profile files, resolved profiles and engine catalogs.

A *profile document* is one YAML file as written (values may be ``null`` to remove an inherited key).
A *profile* is the resolved result of an ``extends`` chain: no nulls, every value validated against
the engine's catalog, with a canonical content hash. Values are stored as the operator wrote them
(str / int / float / bool); ``env_strings`` and ``arg_strings`` give the exact strings that run.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StringConstraints, field_validator, model_validator

from knobfleet import rules

SCHEMA_VERSION = 1

# The one rule set (roles/knob_serve/vars/rules.json), shared with the role's preflight; always fullmatch().
ENV_NAME_RE = rules.regex("env_name")
FLAG_NAME_RE = rules.regex("flag_name")
PROFILE_NAME_RE = rules.regex("profile_name")
ENGINE_NAME_RE = rules.regex("engine_name")

Scalar = str | bool | int | float
ProfileName = Annotated[str, StringConstraints(pattern=f"^{PROFILE_NAME_RE.pattern}$")]
# Any engine with a catalog file (profiles/catalogs/<engine>.yaml); the store checks that it exists.
EngineName = Annotated[str, StringConstraints(pattern=f"^{ENGINE_NAME_RE.pattern}$")]


class _Strict(BaseModel):
    # defer_build: validators are built on first use, so commands that never validate a profile (drift,
    # verify, history) do not pay for building them (~50 ms of every start).
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class Gate(_Strict):
    """What a new generation of this profile must pass before it is kept (used by bench / ab)."""

    baseline: ProfileName | None = None
    concurrency: tuple[int, ...] = (48, 64, 80, 96)
    weights: dict[int, float] = Field(default_factory=lambda: {48: 0.3, 64: 0.3, 80: 0.3, 96: 0.1})
    min_effect: float = Field(default=0.01, ge=0, le=1)
    max_regression: float = Field(default=0.03, ge=0, le=1)
    consistency: bool = True


class Fingerprint(_Strict):
    """What the profile was tuned on; a mismatch on a host is worth a warning, not a refusal."""

    gpu: str | None = None
    sm_count: int | None = Field(default=None, ge=1)
    engine_version: str | None = None
    model: str | None = None


class ProfileDoc(_Strict):
    """One profile file as written. Unknown top-level keys are errors."""

    schema_version: Literal[1] = 1
    name: ProfileName
    version: StrictInt = Field(ge=1)
    extends: ProfileName | None = None
    description: str = ""
    engine: EngineName | None = None
    # The engine version this profile runs (desired state): validated against that version's catalog, and on a host
    # with knob_serve_launchers the serve script launches that version's install. Unset: whatever the host runs.
    engine_version: str | None = Field(default=None, pattern=r"^[0-9][A-Za-z0-9.+-]{0,63}$")
    env: dict[str, Scalar | None] = Field(default_factory=dict)
    args: dict[str, Scalar | None] = Field(default_factory=dict)
    allow_unknown: tuple[str, ...] = ()
    gate: Gate | None = None
    fingerprint: Fingerprint | None = None


def env_string(value: Scalar) -> str:
    """The string an env value becomes in the environment: booleans are 1/0."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def arg_tokens(flag: str, value: Scalar) -> list[str]:
    """argv tokens for one flag. ``true`` is a bare flag, ``false`` omits it; values use ``--flag=value``
    so a value that starts with ``-`` can never be read as another flag."""
    if value is True:
        return [f"--{flag}"]
    if value is False:
        return []
    return [f"--{flag}={value}"]


class Profile(_Strict):
    """A resolved, validated profile. ``chain`` lists the files it was built from, root first."""

    schema_version: Literal[1] = 1
    name: str
    version: int
    engine: EngineName
    engine_version: str | None = None
    description: str = ""
    env: dict[str, Scalar]
    args: dict[str, Scalar]
    allow_unknown: tuple[str, ...] = ()
    gate: Gate = Field(default_factory=Gate)
    fingerprint: Fingerprint = Field(default_factory=Fingerprint)
    chain: tuple[str, ...] = ()
    # The engine version whose catalog validated it: its fingerprint's engine_version where that version has a
    # synced catalog, else the pinned one. Not in the content hash (a fact of validation, not of behaviour).
    validated_on: str | None = None

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    def canonical(self) -> dict[str, Any]:
        """What the content hash covers: everything that changes behaviour (not description or chain)."""
        return {
            "schema_version": self.schema_version,
            "name": self.name,
            "version": self.version,
            "engine": self.engine,
            **({"engine_version": self.engine_version} if self.engine_version else {}),  # unset: hashes as before
            "env": {k: self.env[k] for k in sorted(self.env)},
            "args": {k: self.args[k] for k in sorted(self.args)},
            "gate": self.gate.model_dump(mode="json"),
        }

    @property
    def content_hash(self) -> str:
        blob = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return "sha256:" + hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def env_strings(self) -> dict[str, str]:
        return {k: env_string(v) for k, v in sorted(self.env.items())}


KnobType = Literal["int", "float", "str", "bool"]


class Knob(_Strict):
    kind: Literal["env", "flag"]
    type: KnobType
    choices: tuple[Scalar, ...] | None = None
    min: float | None = None
    max: float | None = None
    default: Scalar | None = None
    restart: bool = True
    description: str = ""
    # From the engine's registry (generated catalogs) and the overlay.
    aliases: tuple[str, ...] = ()
    deprecated: bool = False
    replacement: str | None = None
    negation: str | None = None
    nargs: str | int | None = None
    origin: str | None = Field(default=None, description="the patch a knob comes from, when it is not upstream")
    # A credential (true: hashed wherever it goes, refused in profiles), or explicitly not one although its name
    # matches knobfleet's secret patterns (false: SGLANG_INIT_NEW_TOKEN_RATIO); unset: the patterns decide.
    secret: bool | None = None

    @field_validator("min", "max")
    @classmethod
    def _finite_bound(cls, value: float | None) -> float | None:
        """A bound of NaN compares false with everything: every value would pass it. Refused where it is read."""
        if value is not None and not math.isfinite(value):
            raise ValueError(f"a bound must be a finite number, not {value!r}")
        return value


BENCH_FIELDS = frozenset(
    {
        "launcher0",
        "host",
        "port",
        "model",
        "concurrency",
        "num_prompts",
        "input_len",
        "output_len",
        "seed",
        "result_dir",
        "result_file",
    }
)


class BenchTool(_Strict):
    """The engine's own serving benchmark (``knobfleet bench --tool engine``), run on the host once per
    concurrency bucket; knobfleet parses the JSON result it writes."""

    name: str = Field(description="what the tool is called in reports, e.g. 'vllm bench serve'")
    argv: tuple[str, ...] = Field(
        min_length=1,
        description="argv; {launcher0} (the host's launcher's first word), {host}, {port}, {model}, {concurrency}, "
        "{num_prompts}, {input_len}, {output_len}, {seed}, {result_dir} and {result_file} are filled in",
    )
    result: Literal["json", "jsonl"] = Field(default="json", description="jsonl: the last line is this run's")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment of the tool's process")
    version_path: str | None = Field(default=None, pattern=r"^/[A-Za-z0-9._~/-]*$")
    version_key: str = Field(default="version", description="the engine version's key in version_path's JSON")

    @field_validator("argv")
    @classmethod
    def _known_fields(cls, argv: tuple[str, ...]) -> tuple[str, ...]:
        import string

        for token in argv:
            for _text, field, _spec, _conv in string.Formatter().parse(token):
                if field is not None and field not in BENCH_FIELDS:
                    raise ValueError(f"unknown placeholder {{{field}}} in {token!r}; known: {sorted(BENCH_FIELDS)}")
        return argv


METRIC_NAME = r"^[A-Za-z_:][A-Za-z0-9_:]*$"


class Metrics(_Strict):
    """The engine's Prometheus names knobfleet reads (catalog ``serve.metrics``), each for the uses that need it
    (``engines.adapter.METRIC_USES``): the router drain's in-flight count (``running`` + ``queued`` gauges), the
    canary's throughput, latency and finished-request counters, and the load profile's running gauge. A catalog
    names those it has (llama.cpp's server has the gauges but no latency histograms: its drain works, its canary
    is refused); a use whose names are missing is refused where it is needed, never guessed."""

    running: str | None = Field(default=None, pattern=METRIC_NAME, description="gauge: requests being decoded now")
    queued: str | None = Field(default=None, pattern=METRIC_NAME, description="gauge: requests waiting to start")
    generation_tokens: str | None = Field(default=None, pattern=METRIC_NAME, description="counter: tokens generated")
    e2e_latency: str | None = Field(
        default=None, pattern=METRIC_NAME, description="histogram (base name): end-to-end request latency"
    )
    inter_token_latency: str | None = Field(
        default=None, pattern=METRIC_NAME, description="histogram (base name): inter-token latency"
    )
    finished: str | None = Field(default=None, pattern=METRIC_NAME, description="counter: requests finished")


RankValue = str | bool


class Ranks(_Strict):
    """How the ranks of one multi-node engine find each other (catalog ``serve.ranks``): the flags knobfleet renders
    for every rank of a tensor-parallel group, and those only followers (rank > 0) carry. A value is a template:
    ``{nnodes}`` (the group's size), ``{rank}``, ``{head}`` (rank 0's address) and ``{port}`` (the group's
    ``dist_port``); ``true`` is a bare flag. An engine without them is refused where a group needs them."""

    flags: dict[str, RankValue] = Field(min_length=1, description="every rank's flags")
    follower_flags: dict[str, RankValue] = Field(default_factory=dict, description="flags of ranks 1..N-1 only")


class StartupPhase(_Strict):
    """One phase of the engine's start-up as its log shows it (catalog ``serve.startup_phases``): the phase ends at
    the last journal line ``pattern`` matches before the engine is ready (module_utils/knob_startup.py)."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,39}$", description="the phase's name in history and plans")
    pattern: str = Field(min_length=1, max_length=400, description="a regular expression searched in each line")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str) -> str:
        import re

        try:
            re.compile(v)
        except re.error as exc:
            raise ValueError(f"not a regular expression ({exc}); escape ( ) [ ] . with a backslash") from None
        return v


CACHE_SUBFOLDER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class CompileCaches(_Strict):
    """Where the engine keeps its JIT and compile caches (catalog ``serve.compile_caches``; docs/CACHES.md): the env
    vars the serve script points into the service's persistent cache folder, each at its own subfolder, and the knobs
    whose values enter the engines' compile keys (a change makes the next start compile again: ``plan`` says so)."""

    env: dict[str, str] = Field(min_length=1, description="env var -> its subfolder of the service's cache folder")
    key: tuple[str, ...] = Field(default=(), description="env vars and flags (catalog names) in the compile key")

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        for name, sub in env.items():
            if not ENV_NAME_RE.fullmatch(name):
                raise ValueError(f"invalid env name {name!r}")
            if not CACHE_SUBFOLDER_RE.fullmatch(sub) or sub in (".", ".."):
                raise ValueError(f"{name}: subfolder {sub!r} must be one plain folder name (letters, digits, _.-)")
        subs = sorted(env.values())
        twice = sorted({s for s in subs if subs.count(s) > 1})
        if twice:
            raise ValueError(f"subfolder {twice[0]!r} is named by two env vars; give each its own")
        return env

    @field_validator("key")
    @classmethod
    def _key(cls, key: tuple[str, ...]) -> tuple[str, ...]:
        for name in key:
            if not (ENV_NAME_RE.fullmatch(name) or FLAG_NAME_RE.fullmatch(name)):
                raise ValueError(f"{name!r} is neither an env var nor a flag name")
        if len(set(key)) != len(key):
            raise ValueError("a knob is named twice")
        return key


class Serve(_Strict):
    """How the engine is launched, reached and observed: the data its adapter (knobfleet.engines) is built from."""

    default: bool = Field(default=False, description="the engine of profiles and hosts that name none")
    launcher: tuple[str, ...] = Field(description="argv before the engine's own arguments")
    fixed_args: tuple[str, ...] = Field(
        description="arguments every launch carries, with {model}, {host} and {port} filled in from host vars"
    )
    readiness_path: str = Field(pattern=r"^/[A-Za-z0-9._~/-]*$")
    info_path: str | None = Field(default=None, pattern=r"^/[A-Za-z0-9._~/-]*(\?[A-Za-z0-9._~=&-]*)?$")
    info_env: tuple[str | int, ...] | None = Field(
        default=None, description="where in the info endpoint's JSON the engine reports its env vars"
    )
    info_version: tuple[str | int, ...] = Field(
        default=("version",), description="where in the info endpoint's JSON the engine reports its version"
    )
    ignore_env: tuple[str, ...] = Field(default=(), description="env vars the engine sets itself in its processes")
    info_args: bool = Field(default=False, description="the info endpoint reports the resolved server arguments")
    info_args_ignore: tuple[str, ...] = Field(
        default=(), description="flags the engine reports in another spelling (not comparable as text)"
    )
    show: dict[str, str] = Field(default_factory=dict, description="knob -> short label shown in summaries")
    liveness_path: str | None = Field(
        default=None,
        pattern=r"^/[A-Za-z0-9._~/-]*$",
        description="an OpenAI completions endpoint verify sends one bounded one-token completion to, where the "
        "readiness path does not generate (vLLM's /health); None where it does (SGLang's /health_generate)",
    )
    flag_underscores: bool = Field(
        default=False, description="the engine's parser reads --max_model_len as --max-model-len (vLLM's does)"
    )
    packages: tuple[str, ...] = Field(
        default=(),
        description="the engine's distribution names, in order, whose METADATA in the launcher's environment says "
        "the installed version (the probe's engine_package); empty: the module or console script the launcher runs",
    )
    bench: BenchTool | None = Field(default=None, description="the engine's own serving benchmark, if it has one")
    metrics: Metrics | None = Field(default=None, description="the Prometheus names the drain and the canary read")
    ranks: Ranks | None = Field(default=None, description="how a multi-node engine's ranks find each other")
    compile_caches: CompileCaches | None = Field(
        default=None, description="the JIT/compile caches kept across generations, and the knobs in their key"
    )
    startup_phases: tuple[StartupPhase, ...] = Field(
        default=(), description="the start-up phases its log shows, in order (knobfleet measures each restart's)"
    )


class Catalog(_Strict):
    schema_version: Literal[1] = 1
    engine: EngineName
    version: str | None = Field(default=None, description="engine version a generated catalog was read from")
    generated: bool = False
    source: str | None = None
    model: dict[str, str] | None = None
    env_prefixes: tuple[str, ...]
    serve: Serve
    knobs: dict[str, Knob]
    # The engine's own tables of names this version no longer reads (SGLang's removed server arguments, vLLM's
    # removed flags), curated in the overlay or generated; knobfleet adds the renames older synced versions declare
    # (a deprecated knob's replacement). ``renamed``: old name -> new name; ``removed``: name -> the engine's note.
    renamed: dict[str, str] = Field(default_factory=dict)
    removed: dict[str, str] = Field(default_factory=dict)

    @field_validator("knobs")
    @classmethod
    def _names_are_valid(cls, knobs: dict[str, Knob]) -> dict[str, Knob]:
        for name, knob in knobs.items():
            pattern = ENV_NAME_RE if knob.kind == "env" else FLAG_NAME_RE
            if not pattern.fullmatch(name):
                raise ValueError(f"invalid {knob.kind} name {name!r}")
        return knobs

    @model_validator(mode="after")
    def _compile_caches(self) -> Catalog:
        """A cache env var the engine sets itself (``serve.ignore_env``) would differ in its children: refused; so
        is a compile-key knob the catalog marks secret (plan names the values that changed)."""
        caches = self.serve.compile_caches
        if caches is None:
            return self
        where = f"serve.compile_caches of engine {self.engine} (profiles/catalogs/{self.engine}.overlay.yaml)"
        for name in caches.env:
            if name in self.serve.ignore_env:
                raise ValueError(f"{where}: {name} is in serve.ignore_env (the engine sets it itself); drop one")
        for name in caches.key:
            knob = self.knobs.get(name)
            if knob is not None and knob.secret:
                raise ValueError(f"{where}: key {name} is marked secret; a compile key shows its values: drop it")
        return self

    def env_knobs(self) -> dict[str, Knob]:
        return {n: k for n, k in self.knobs.items() if k.kind == "env"}

    def flag_knobs(self) -> dict[str, Knob]:
        return {n: k for n, k in self.knobs.items() if k.kind == "flag"}

    def secret_names(self) -> tuple[str, ...]:
        """The catalog's part of the one notion of a secret (module_utils/knob_redact.is_secret), on top of
        knobfleet's patterns: env vars and flags it marks secret, and ``!NAME`` for those it marks not secret
        although their names match. Handed to the hosts as is (knob_serve_engine.secret_env)."""
        marked = sorted(n for n, k in self.knobs.items() if k.secret)
        return (*marked, *sorted(f"!{n}" for n, k in self.knobs.items() if k.secret is False))

    def is_secret(self, name: str) -> bool:
        from knobfleet.module_utils.knob_redact import is_secret

        return is_secret(name, self.secret_names())

    def is_secret_flag(self, name: str) -> bool:
        """A launch flag whose value is secret: by name, as an abbreviation argparse accepts, or as an alias of a
        flag the catalog marks secret."""
        from knobfleet.module_utils.knob_redact import is_secret_flag

        alias = self.flag_alias(name)
        return is_secret_flag(name, self.secret_names()) or bool(alias is not None and alias.secret)

    def flag_alias(self, name: str) -> Knob | None:
        """The flag knob ``name`` is an alias of (``tensor-parallel-size`` for ``tp-size``), if any."""
        for knob in self.knobs.values():
            if knob.kind == "flag" and name in knob.aliases:
                return knob
        return None

    def is_engine_env(self, name: str) -> bool:
        return name.startswith(self.env_prefixes)

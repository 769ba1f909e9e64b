"""An engine as data: everything knobfleet needs to know about SGLang, vLLM or any other engine comes from
its catalog file (``profiles/catalogs/<engine>.yaml``, section ``serve`` plus its knobs). Adding an engine is
adding that file; no code names an engine.

Pure apart from reading the catalog (cached)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

from knobfleet.module_utils import knob_argv

if TYPE_CHECKING:
    from knobfleet.profiles.model import BenchTool, Metrics


# What each use of an engine's Prometheus names reads (catalog ``serve.metrics``): a catalog may name some only.
METRIC_USES: dict[str, tuple[str, ...]] = {
    "the router drain": ("running", "queued"),
    "the canary": ("generation_tokens", "e2e_latency", "inter_token_latency", "finished"),
    "load-profile": ("running",),
}


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


@dataclass(frozen=True)
class Engine:
    name: str
    launcher: tuple[str, ...]
    fixed_args: tuple[str, ...]
    readiness_path: str
    info_path: str | None
    info_env: tuple[str | int, ...] | None
    env_prefixes: tuple[str, ...]
    ignore_env: tuple[str, ...]
    show: dict[str, str]
    known_env: tuple[str, ...]
    secret_env: tuple[str, ...] = ()
    info_args: bool = False
    info_args_ignore: tuple[str, ...] = ()
    bench: BenchTool | None = None
    liveness_path: str | None = None  # verify's one-token completion, where readiness_path does not generate
    packages: tuple[str, ...] = ()  # distribution names whose METADATA says the installed version (engine_package)
    argv_spec: dict[str, Any] | None = None  # how its parser reads an argv (module_utils/knob_argv.py)
    metric_names: Metrics | None = None  # the catalog's serve.metrics
    info_version: tuple[str | int, ...] = ("version",)  # where its server info says its version
    rank_spec: tuple[dict[str, str | bool], dict[str, str | bool]] | None = None  # serve.ranks: (flags, followers')
    # serve.compile_caches: env var -> subfolder of the service's cache folder, and the knobs in the compile key
    compile_caches: dict[str, str] = field(default_factory=dict)
    compile_key: tuple[str, ...] = ()
    startup_phases: tuple[tuple[str, str], ...] = ()  # serve.startup_phases: (name, pattern) in order

    def ranks(self, needed_by: str) -> tuple[dict[str, str | bool], dict[str, str | bool]]:
        """The engine's rank flags (catalog ``serve.ranks``: every rank's, followers' own); a one-line
        KnobfleetError naming the catalog and what needs them when it has none (never another engine's flags)."""
        if self.rank_spec is None:
            from knobfleet.errors import KnobfleetError

            raise KnobfleetError(
                f"engine {self.name}: {needed_by} needs how its ranks find each other, and its catalog has no "
                f"serve.ranks; add flags (with {{nnodes}}, {{rank}}, {{head}}, {{port}}) and follower_flags under "
                f"serve: in profiles/catalogs/{self.name}.overlay.yaml"
            )
        return self.rank_spec

    def metrics(self, needed_by: str) -> tuple[str, ...]:
        """The engine's Prometheus names ``needed_by`` reads (``METRIC_USES``: catalog ``serve.metrics``), in that
        order; a one-line KnobfleetError naming the catalog, the use and the names it lacks when any is missing
        (never another engine's names)."""
        wanted = METRIC_USES[needed_by]
        have = self.metric_names.model_dump() if self.metric_names is not None else {}
        missing = [n for n in wanted if not have.get(n)]
        if missing:
            from knobfleet.errors import KnobfleetError

            lacks = "no serve.metrics" if not have else f"no serve.metrics.{', serve.metrics.'.join(missing)}"
            raise KnobfleetError(
                f"engine {self.name}: {needed_by} needs its Prometheus metric names, and its catalog has {lacks}; "
                f"add {_and(missing)} under serve.metrics: in profiles/catalogs/{self.name}.overlay.yaml"
            )
        return tuple(str(have[n]) for n in wanted)

    def head_argv(self, launcher: tuple[str, ...] | None, model: str, host: str, port: int) -> list[str]:
        """The argv before the profile's flags: launcher, then the fixed arguments with host values filled in."""
        fill = {"{model}": model, "{host}": host, "{port}": str(port)}
        out = list(launcher or self.launcher)
        for token in self.fixed_args:
            for key, value in fill.items():
                token = token.replace(key, value)
            out.append(token)
        return out

    def bench_runs(
        self,
        launcher: tuple[str, ...] | None,
        model: str,
        host: str,
        port: int,
        *,
        conc: tuple[int, ...],
        n_mult: int,
        input_len: int,
        output_len: int,
        seed: int,
        result_dir: str,
        run_id: str,
    ) -> list[dict[str, Any]]:
        """One run of the engine's own benchmark per concurrency bucket: argv (every placeholder filled in) and
        the result file it writes. Pure."""
        if self.bench is None:
            raise ValueError(f"engine {self.name} has no bench tool in its catalog (serve.bench)")
        runs = []
        for c in conc:
            fields = {
                "launcher0": (launcher or self.launcher)[0],
                "host": host,
                "port": str(port),
                "model": model,
                "concurrency": str(c),
                "num_prompts": str(max(n_mult * c, 1)),
                "input_len": str(input_len),
                "output_len": str(output_len),
                "seed": str(seed),
                "result_dir": result_dir,
                "result_file": f"{run_id}-c{c}.json",
            }
            runs.append(
                {
                    "concurrency": c,
                    "num_prompts": max(n_mult * c, 1),
                    "argv": [token.format_map(fields) for token in self.bench.argv],
                    "result_path": f"{result_dir}/{fields['result_file']}",
                }
            )
        return runs

    @property
    def reserved_flags(self) -> tuple[str, ...]:
        """Flags the launch line already sets from host vars: a profile may not set them."""
        return tuple(t[2:].split("=", 1)[0] for t in self.fixed_args if t.startswith("--"))

    @property
    def per_rank_flags(self) -> tuple[str, ...]:
        """Flags that differ between the ranks of one engine group by design, never compared across them: the
        rank flags whose value names ``{rank}``, the followers' own (catalog ``serve.ranks``), and the fixed
        argument that carries the host's own address (``--host={host}``, or ``--bind {host}``)."""
        every, followers = self.rank_spec or ({}, {})
        out = [f for f, v in every.items() if isinstance(v, str) and "{rank}" in v] + list(followers)
        for i, token in enumerate(self.fixed_args):
            if token.startswith("--") and "{host}" in token:
                out.append(token[2:].split("=", 1)[0])
            elif token == "{host}" and i > 0 and self.fixed_args[i - 1].startswith("--"):
                out.append(self.fixed_args[i - 1][2:])
        return tuple(dict.fromkeys(out))

    def rules(self, with_known: bool = True) -> dict[str, Any]:
        """The engine part of the live-state rule (module_utils/knob_live.py); ``per_rank_flags`` where the engine
        runs in groups (``serve.ranks``)."""
        out: dict[str, Any] = {
            "name": self.name,
            "env_prefixes": list(self.env_prefixes),
            "ignore_env": list(self.ignore_env),
            "info_env": list(self.info_env) if self.info_env else None,
            "info_args": self.info_args,
            "info_args_ignore": list(self.info_args_ignore),
            "info_version": list(self.info_version),
            "argv": self.argv_spec,
        }
        if self.rank_spec is not None:
            out["per_rank_flags"] = list(self.per_rank_flags)
        if with_known:
            out["known_env"] = list(self.known_env)
        return out

    def role_vars(self) -> dict[str, Any]:
        """``knob_serve_engine``: what the knob_serve role reads about the engine."""
        return {
            **self.rules(with_known=False),
            "launcher": list(self.launcher),
            "fixed_args": list(self.fixed_args),
            "reserved_flags": list(self.reserved_flags),
            "readiness_path": self.readiness_path,
            "info_path": self.info_path or "",
            "secret_env": list(self.secret_env),
            "compile_caches": dict(self.compile_caches),  # templates/compile_cache.json.j2
            "startup_phases": [{"name": n, "pattern": p} for n, p in self.startup_phases],
        }

    def short(self, knob: str) -> str:
        return self.show.get(knob, knob)


@cache
def engine(name: str | None = None) -> Engine:
    """The adapter of ``name`` (the default engine when None), built from its catalog."""
    from knobfleet.profiles.catalog import catalog_for, default_engine

    cat = catalog_for(name or default_engine())
    s = cat.serve
    model = cat.model or {}
    flags = {n: k.model_dump(include={"type", "nargs", "aliases", "negation"}) for n, k in cat.flag_knobs().items()}
    spec = knob_argv.build_spec(
        flags,
        subcommand=model.get("subcommand"),
        positional="model" if model.get("style") == "positional" else None,
        underscores=s.flag_underscores,
    )
    return Engine(
        name=cat.engine,
        launcher=s.launcher,
        fixed_args=s.fixed_args,
        readiness_path=s.readiness_path,
        info_path=s.info_path,
        info_env=s.info_env,
        env_prefixes=cat.env_prefixes,
        ignore_env=s.ignore_env,
        show=dict(s.show),
        known_env=tuple(sorted(cat.env_knobs())),
        secret_env=cat.secret_names(),
        info_args=s.info_args,
        info_args_ignore=s.info_args_ignore,
        bench=s.bench,
        liveness_path=s.liveness_path,
        packages=s.packages,
        argv_spec=spec,
        metric_names=s.metrics,
        info_version=s.info_version,
        rank_spec=(dict(s.ranks.flags), dict(s.ranks.follower_flags)) if s.ranks is not None else None,
        compile_caches=dict(s.compile_caches.env) if s.compile_caches is not None else {},
        compile_key=s.compile_caches.key if s.compile_caches is not None else (),
        startup_phases=tuple((p.name, p.pattern) for p in s.startup_phases),
    )


def names() -> list[str]:
    from knobfleet.profiles.catalog import engine_names

    return engine_names()

"""A new engine = 1 data file: the proof (issue 36, "engines are data everywhere").

``toyserve`` is a documented test engine that exists nowhere but in one hand-written catalog,
tests/unit/engines/data/toyserve.yaml. Each test builds a user's project (``knobfleet.toml``, its
``catalogs/``, ``profiles/`` and ``inventories/hosts.yml``) in its tmp_path and copies that file into the
project's ``catalogs/`` as it is. No code names toyserve, nothing is registered, and nothing of knobfleet's own
logic is mocked: the CLI runs in-process, and the fakes are the suite's own (the ``Hosts`` door of
tests/unit/ops/rollout_fakes.py, the in-memory router of tests/unit/fleet/test_router.py, a Prometheus that
records its queries, an engine ``/metrics`` on a 127.0.0.1 port).

What the catalog file holds, and where each part is shown to be read:

* ``engine``, ``env_prefixes`` and ``knobs`` (env and flag knobs with types, choices, ranges, an alias):
  profiles of engine toyserve validate against them, and a bad knob is refused by them (1);
* ``serve.launcher``, ``serve.fixed_args`` (toyserve's ``--model M --bind H --port P`` spelling) and the flag
  table the knobs make: ``render``, ``plan`` and the probe's arguments (1), and the role's variables an apply
  hands Ansible (2);
* ``serve.readiness_path``, ``info_path``, ``info_env``, ``info_version``, ``ignore_env``, ``packages``,
  ``show``: the probe's URLs and the live rule ``drift``, ``plan`` and apply's verify judge a toyserve host
  by (3);
* ``serve.metrics`` (toyserve's Prometheus names): the router drain's in-flight count and the canary's window
  queries (4);
* ``serve.ranks`` (toyserve's ``--world/--rank/--coordinator`` and ``--follower``): the flags of each rank of
  an engine group (5);
* without ``serve.metrics`` or ``serve.ranks``, the drain, the canary and a group are refused in one line (6).

Every assertion is on an output that SGLang's names or flags (the default engine's) would change. The cross-rank
rule skips the flags that differ by rank by design as the catalog says them (``Engine.per_rank_flags``: the
``{rank}`` flags and followers' own of ``serve.ranks``, and the ``{host}`` flag of ``serve.fixed_args``), so a
toyserve group is in sync and applied as one unit (the last test; it failed while the rule knew only SGLang's and
vLLM's names).
"""

from __future__ import annotations

import copy
import json
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from knobfleet import paths
from knobfleet.cli import run as cli
from knobfleet.engines import adapter
from knobfleet.errors import KnobfleetError
from knobfleet.experiment import canary_windows
from knobfleet.fleet import router_kinds
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.inventory import load_hosts
from knobfleet.fleet.probe import probe_args
from knobfleet.fleet.readhost import plan_from_hostvars
from knobfleet.fleet.router import Outcome as RouterOutcome
from knobfleet.fleet.router import RouterError, drain
from knobfleet.fleet.runner import RunRequest, RunResult
from knobfleet.fleet.transports.base import Outcome
from knobfleet.groups import rank_flags
from knobfleet.module_utils.knob_rules import Kind
from knobfleet.ops import drift, ranks
from knobfleet.ops.apply import apply
from knobfleet.ops.precheck import Options
from knobfleet.ops.profiles import store
from knobfleet.ops.steps import Slots
from knobfleet.profiles import catalog
from knobfleet.profiles.model import Profile
from knobfleet.render import Rendered, expected_argv, rank_args, rank_spec, render_host, sha256_text
from knobfleet.telemetry import loadprofile
from knobfleet.telemetry.prom import Sample
from tests.conftest import REPO
from tests.unit.fleet.test_router import FakeClock, MemRouter
from tests.unit.ops.rollout_fakes import CLEAN, FakeHosts, Host

CATALOG = Path(__file__).parent / "data" / "toyserve.yaml"
CLEAN_DOC = json.loads(CLEAN.read_text())

PROFILES = {
    "toy": """\
schema_version: 1
name: toy
version: 1
engine: toyserve
env:
  TOYSERVE_KV_BLOCK_TOKENS: 64
  TOYSERVE_SCHEDULER: lpm
args:
  max-batch: 128
  attention: paged
  no-warmup: true
""",
    "toy-big": """\
schema_version: 1
name: toy-big
version: 1
extends: toy
env:
  TOYSERVE_KV_BLOCK_TOKENS: 32
args:
  max-batch: 256
  kv-fraction: 0.8
""",
    "bad": """\
schema_version: 1
name: bad
version: 1
engine: toyserve
env:
  TOYSERVE_SCHEDULR: lpm
  TOYSERVE_NOPE: 1
  TOYSERVE_KV_BLOCK_TOKENS: 48
args:
  max-batchh: 128
  tp-size: 2
  kv-fraction: 2.0
""",
}

# toy1 and toy2: a tensor-parallel engine group; toy3 and toy4: engines of their own.
INVENTORY = """\
all:
  vars:
    knob_engine: toyserve
    knob_serve_model_path: /models/toy
    knob_serve_port: 31000
    knob_serve_service: toyserve
    knob_serve_script_path: /opt/toyserve/serve.sh
    knob_engine_groups:
      tg: {members: {toy1: 0, toy2: 1}, dist_port: 7100}
  hosts:
    toy1: {ansible_host: 127.0.1.1, knob_serve_listen_host: 127.0.1.1}
    toy2: {ansible_host: 127.0.1.2, knob_serve_listen_host: 127.0.1.2}
    toy3: {ansible_host: 127.0.1.3, knob_serve_listen_host: 127.0.1.3}
    toy4: {ansible_host: 127.0.1.4, knob_serve_listen_host: 127.0.1.4}
"""

LAUNCH = ["/usr/bin/python3", "-m", "toyserve.server", "--model", "/models/toy", "--bind"]
TOY_ARGS = ["--attention=paged", "--max-batch=128", "--no-warmup"]


def _clear_caches() -> None:
    adapter.engine.cache_clear()
    catalog.catalog_for.cache_clear()  # type: ignore[attr-defined]
    catalog.default_engine.cache_clear()


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """knobfleet's state folder (catalog and inventory caches, fleet key), shared by this file's projects: the
    shipped catalogs (the default engine is looked up) are parsed once, not once per test."""
    return tmp_path_factory.mktemp("state")


@pytest.fixture
def project(tmp_path: Path, state: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A user's project whose only engine-specific file is toyserve's catalog; the working directory is its root."""
    for var in ("KNOBFLEET_VERBOSE", "KNOBFLEET_EXAMPLES", "ANSIBLE_VAULT_IDENTITY_LIST", "ANSIBLE_VAULT_PASSWORD_FILE",
                "KNOBFLEET_HOME", "KNOBFLEET_INVENTORY", "ANSIBLE_INVENTORY"):  # fmt: skip
        monkeypatch.setenv(var, "")  # recorded, so what the CLI writes into os.environ is undone afterwards
        monkeypatch.delenv(var)
    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(state))
    root = tmp_path / "fleet"
    for folder in ("catalogs", "profiles", "inventories"):
        (root / folder).mkdir(parents=True)
    (root / "knobfleet.toml").write_text('[project]\nname = "toyfleet"\n')
    shutil.copyfile(CATALOG, root / "catalogs" / "toyserve.yaml")
    for name, text in PROFILES.items():
        (root / "profiles" / f"{name}.yaml").write_text(text)
    (root / "inventories" / "hosts.yml").write_text(INVENTORY)
    monkeypatch.chdir(root)
    # The knob_serve templates, read from the checkout: a project's Ansible collection is staged from these very
    # files, and staging it would write under the checkout's build/.
    monkeypatch.setattr(paths, "roles_dir", lambda: REPO / "roles")
    _clear_caches()
    yield root
    _clear_caches()


def call(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def hosts(limit: str) -> list[HostVars]:
    return load_hosts(paths.project_root() / "inventories" / "hosts.yml", limit)


def resolve(name: str) -> Profile:
    return store().resolve(name, check_lock=False)


def without(section: str) -> None:
    """The project's toyserve catalog without ``serve.<section>``, everything else as it was."""
    path = paths.project_root() / "catalogs" / "toyserve.yaml"
    data = yaml.safe_load(CATALOG.read_text())
    del data["serve"][section]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    _clear_caches()


# --- a probe document of a host running toyserve ------------------------------------------------------------

SYSTEMD_ENV = {k: v for k, v in CLEAN_DOC["processes"][0]["env"].items() if not k.startswith("SGLANG_")}


def running(r: Rendered, p: Profile, generation: int = 1) -> dict[str, Any]:
    """What the probe reports of a host running ``r`` (profile ``p``) as its current generation: the recorded
    clean lab probe (tests/unit/live/verify_cases/clean) with toyserve's files, generation, processes and server
    info in place of SGLang's, as the verify cases that could not be recorded live are synthesized from it.
    Toyserve's main process and its worker; the worker also has TOYSERVE_WORKER_ID (toyserve's ``ignore_env``)
    and both a leftover SGLang variable, none of toyserve's business."""
    doc: dict[str, Any] = copy.deepcopy(CLEAN_DOC)
    texts = {"script": (r.script_path, r.script), "unit": (r.unit_path, r.unit)}
    stored = {}
    for key, (path, text) in texts.items():
        doc["files"][key].update(path=path, content=text, sha256=sha256_text(text), size=len(text.encode()))
        stored[Path(path).name] = {**doc["files"][key], "path": f"/var/lib/knobfleet/toyserve/{Path(path).name}"}
    good = CLEAN_DOC["generations"]["list"][1]
    meta = {
        **good["meta"],
        "generation": generation,
        "previous": generation - 1,
        "profile": p.name,
        "version": p.version,
        "hash": p.content_hash,
        "engine": "toyserve",
        "files": {
            k: {"name": Path(path).name, "path": path, "sha256": sha256_text(t)} for k, (path, t) in texts.items()
        },
    }
    doc["generations"].update(
        current=generation,
        current_files=stored,
        list=[{"files": ["meta.json", *stored], "generation": generation, "meta": meta}],
    )
    env = {**SYSTEMD_ENV, **r.env, "SGLANG_SM120_MMA_TARGET_CTAS": "512"}
    main = {**CLEAN_DOC["processes"][0], "pid": 4242, "cmdline": list(r.argv), "env": env}
    worker = {**CLEAN_DOC["processes"][1], "pid": 4243, "ppid": 4242, "comm": "toyserve-work",
              "cmdline": [*r.argv, "--worker=0"], "env": {**env, "TOYSERVE_WORKER_ID": "0"}}  # fmt: skip
    doc["processes"] = [main, worker]
    doc["unit"] = Path(r.unit_path).name
    doc["service"] = Path(r.unit_path).stem
    doc["unit_props"].update(MainPID="4242", FragmentPath=r.unit_path, ControlGroup=f"/system.slice/{doc['unit']}")
    doc["health_url"] = f"http://{r.argv[6]}:31000/toyserve/ready"
    doc["server_info"] = {"build": {"version": "1.4.0"}, "runtime": {"env": dict(r.env)}}
    return doc


def main_of(doc: dict[str, Any]) -> dict[str, Any]:
    main: dict[str, Any] = doc["processes"][0]
    return main


@dataclass
class Door(FakeHosts):
    """The suite's fake ``Hosts`` door, answering with toyserve probe documents: ``docs`` before the change (the
    pre-check, drift), ``ready`` once the play made a host ready (apply's verify step); it keeps every request."""

    docs: dict[str, dict[str, Any]] = field(default_factory=dict)
    ready: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[RunRequest] = field(default_factory=list)

    def probe(self, hosts: Any, on_event: Any = None, *, quick: bool = False) -> dict[str, Outcome]:
        return {hv.host: Outcome(hv.host, doc=copy.deepcopy(self.docs[hv.host])) for hv in hosts}

    def stream(self, hosts: Any, on_event: Any = None) -> Iterator[Outcome]:
        for hv in hosts:
            yield Outcome(hv.host, doc=copy.deepcopy(self.docs[hv.host]))

    def play(self, req: RunRequest, hosts: Any = ()) -> RunResult:
        self.requests.append(req)
        result = super().play(req, hosts)
        for name, hr in result.hosts.items():
            if name in self.ready and "probe" in hr.results.get("ready", {}):
                hr.results["ready"]["probe"] = copy.deepcopy(self.ready[name])
        return result


def door_for(profile: str, names: list[str]) -> tuple[Door, list[HostVars]]:
    """Hosts ``names`` of the project's inventory, each running ``profile`` as generation 3."""
    hvs = hosts(":".join(names))
    p = resolve(profile)
    docs = {hv.host: running(render_host(p, hv), p, generation=3) for hv in hvs}
    return Door({hv.host: Host() for hv in hvs}, docs=docs), hvs


# --- 1. validate, render, plan ------------------------------------------------------------------------------


def test_the_one_file_makes_toyserve_an_engine_its_profiles_validate_against(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert catalog.catalog_files("toyserve") == [project / "catalogs" / "toyserve.yaml"]
    assert "toyserve" in catalog.engine_names()
    code, out, err = call(capsys, "profiles", "validate", "toy", "toy-big", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert [p["ref"] for p in doc["profiles"]] == ["toy@1", "toy-big@1"]
    assert resolve("toy-big").engine == "toyserve"  # from the profile it extends


def test_a_bad_knob_is_refused_by_toyserves_catalog(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = call(capsys, "profiles", "validate", "bad", "--json")
    assert code == 1
    assert json.loads(out)["problems"] == [
        "profiles/bad.yaml: env.TOYSERVE_SCHEDULR: unknown knob; did you mean TOYSERVE_SCHEDULER?",
        "profiles/bad.yaml: env.TOYSERVE_NOPE: unknown knob; add it to allow_unknown if toyserve really reads it",
        "profiles/bad.yaml: env.TOYSERVE_KV_BLOCK_TOKENS: 48 is not one of 16, 32, 64",
        "profiles/bad.yaml: args.max-batchh: unknown flag; did you mean max-batch?",
        # SGLang's flag is nothing to toyserve
        "profiles/bad.yaml: args.tp-size: unknown flag; add it to allow_unknown if the engine really accepts it",
        "profiles/bad.yaml: args.kv-fraction: 2.0 is out of range; allowed 0.1..0.99",
    ]


def test_render_is_toyserves_launch_line_in_its_own_flag_spelling(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = call(capsys, "render", "toy", "--host", "toy3", "--json")
    assert code == 0, err
    (doc,) = json.loads(out)
    argv = [*LAUNCH, "127.0.1.3", "--port", "31000", *TOY_ARGS]
    assert doc["argv"] == argv
    assert doc["env"] == {"TOYSERVE_KV_BLOCK_TOKENS": "64", "TOYSERVE_SCHEDULER": "lpm"}
    (hv,) = hosts("toy3")
    assert expected_argv(resolve("toy"), hv) == argv  # what `render` and `plan` compare the host with
    code, script, _ = call(capsys, "render", "toy", "--host", "toy3", "--what", "script")
    exec_line = " \\\n".join(f"  {a}" for a in argv)
    assert f"export TOYSERVE_KV_BLOCK_TOKENS=64\nexport TOYSERVE_SCHEDULER=lpm\nexec \\\n{exec_line}\n" in script
    # the probe reads toyserve's endpoints and package, from this host's launcher
    args = probe_args(hv)
    assert (args["health_url"], args["info_url"]) == (
        "http://127.0.1.3:31000/toyserve/ready",
        "http://127.0.1.3:31000/toyserve/info",
    )
    assert (args["launcher"], args["packages"]) == (LAUNCH[:3], ["toyserve"])


def test_plan_reads_a_toyserve_host_with_toyserves_flag_table(project: Path) -> None:
    door, hvs = door_for("toy", ["toy3", "toy4"])
    main_of(door.docs["toy4"])["cmdline"] = [  # started by hand with toyserve's alias: the same flags
        *LAUNCH, "127.0.1.4", "--port", "31000", "--attention", "paged", "--mb", "128", "--no-warmup"
    ]  # fmt: skip
    in_sync = apply(resolve("toy"), hvs[:1], door, Options(check=True), slots=Slots())  # type: ignore[arg-type]
    assert [(o.host, o.status) for o in in_sync.hosts] == [("toy3", "in-sync")]
    report = apply(resolve("toy-big"), hvs, door, Options(check=True), slots=Slots())  # type: ignore[arg-type]
    assert [(o.host, o.status, o.actions) for o in report.hosts] == [
        ("toy3", "pending", ["install", "daemon-reload", "restart"]),
        ("toy4", "pending", ["install", "daemon-reload", "restart"]),
    ]
    for o in report.hosts:
        assert o.knob_changes == ["TOYSERVE_KV_BLOCK_TOKENS 64 → 32", "--kv-fraction (unset) → 0.8",
                                  "--max-batch 128 → 256"]  # fmt: skip
        assert o.seen == {"KV_BLOCK": "64"}  # toyserve's `show`
    assert door.requests == []  # a plan plays nothing


# --- 2. apply -------------------------------------------------------------------------------------------------


def test_apply_hands_the_role_toyserves_launcher_and_argv(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    door, hvs = door_for("toy", ["toy3", "toy4"])
    big = resolve("toy-big")
    door.ready = {hv.host: running(render_host(big, hv), big, generation=4) for hv in hvs}
    main_of(door.ready["toy4"])["env"]["TOYSERVE_SCHEDULER"] = "fifo"  # toy4's engine came up without the profile's
    door.ready["toy4"]["server_info"]["runtime"]["env"]["TOYSERVE_SCHEDULER"] = "fifo"
    report = apply(big, hvs, door, Options(), slots=Slots())  # type: ignore[arg-type]
    assert [r.playbook for r in door.requests] == ["apply.yml", "restore.yml"]  # toy4 failed verify: restored
    req = door.requests[0]
    engine_vars = req.unsafe_vars["knob_serve_engine"]
    assert engine_vars == adapter.engine("toyserve").role_vars()
    assert (engine_vars["name"], engine_vars["launcher"], engine_vars["fixed_args"]) == (
        "toyserve", LAUNCH[:3], ["--model", "{model}", "--bind", "{host}", "--port", "{port}"]
    )  # fmt: skip
    assert (engine_vars["reserved_flags"], engine_vars["readiness_path"], engine_vars["info_path"]) == (
        ["model", "bind", "port"], "/toyserve/ready", "/toyserve/info"
    )  # fmt: skip
    assert engine_vars["env_prefixes"] == ["TOYSERVE_"] and engine_vars["ignore_env"] == ["TOYSERVE_WORKER_ID"]
    assert engine_vars["argv"]["flags"] == {"attention": "1", "kv-fraction": "1", "max-batch": "1", "no-warmup": "0"}
    assert req.unsafe_vars["knob_serve_profile"]["args"] == {
        "attention": "paged", "kv-fraction": "0.8", "max-batch": "256", "no-warmup": True
    }  # fmt: skip
    # the verify step judged each ready engine by toyserve's rule
    by = {o.host: o for o in report.hosts}
    assert by["toy3"].status == "applied" and by["toy3"].findings == []
    assert by["toy4"].status == "failed"
    assert [(f.kind, f.name, f.expected, f.actual) for f in by["toy4"].findings] == [
        (Kind.ENV_MISMATCH, "TOYSERVE_SCHEDULER", "lpm", "fifo")
    ]
    # `render --what vars`: the same engine vars for a plain ansible-playbook run
    code, out, _ = call(capsys, "render", "toy-big", "--what", "vars")
    assert code == 0
    shown = yaml.load(out.replace("!unsafe ", ""), Loader=yaml.SafeLoader)
    assert shown["knob_serve_engine"] == engine_vars


# --- 3. drift -------------------------------------------------------------------------------------------------


def _drift(door: Door, hvs: list[HostVars]) -> dict[str, Any]:
    return {v.host: v for v in drift.stream(plan_from_hostvars(hvs), door)}  # type: ignore[arg-type]


def test_drift_judges_a_toyserve_host_by_toyserves_rules(project: Path) -> None:
    door, hvs = door_for("toy", ["toy3", "toy4"])
    verdicts = _drift(door, hvs)
    assert [(v.status, v.findings, v.profile, v.engine_version) for v in verdicts.values()] == [
        ("in_sync", [], "toy", "1.4.0")  # its version from toyserve's info_version path
    ] * 2
    # a host whose inventory names no engine is judged by the engine its generation recorded
    anon = [hv.model_copy(update={"engine": None}) for hv in hvs]
    assert [v.status for v in _drift(door, anon).values()] == ["in_sync", "in_sync"]

    main_of(door.docs["toy3"])["env"]["TOYSERVE_KV_BLOCK_TOKENS"] = "16"  # the engine took it: it reports 16 too
    door.docs["toy3"]["server_info"]["runtime"]["env"]["TOYSERVE_KV_BLOCK_TOKENS"] = "16"
    door.docs["toy3"]["processes"][1]["env"]["TOYSERVE_SCHEDULR"] = "lpm"
    door.docs["toy4"]["server_info"]["runtime"]["env"]["TOYSERVE_SCHEDULER"] = "fifo"
    main_of(door.docs["toy4"])["cmdline"][-2] = "--max-batch=256"
    for hv_list in (hvs, anon):
        verdicts = _drift(door, hv_list)
        assert verdicts["toy3"].status == verdicts["toy4"].status == "drift"
        assert [(f.kind, f.name, f.pid) for f in verdicts["toy3"].findings] == [
            (Kind.ENV_MISMATCH, "TOYSERVE_KV_BLOCK_TOKENS", 4242),
            (Kind.ENV_UNEXPECTED, "TOYSERVE_SCHEDULR", 4243),
        ]
        assert verdicts["toy3"].findings[1].message.endswith("did you mean TOYSERVE_SCHEDULER?")
        assert [(f.kind, f.source, f.name) for f in verdicts["toy4"].findings] == [
            (Kind.ARGV_MISMATCH, None, None),
            (Kind.ENV_MISMATCH, "engine", "TOYSERVE_SCHEDULER"),  # toyserve's info_env: runtime.env
        ]


# --- 4. the router drain and the canary ---------------------------------------------------------------------


class Metrics(BaseHTTPRequestHandler):
    """An engine's /metrics: each GET answers the next of ``bodies`` (the last one again once they run out)."""

    bodies: ClassVar[list[str]] = []
    seen: ClassVar[list[str]] = []

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        self.seen.append(self.path)
        body = (self.bodies.pop(0) if len(self.bodies) > 1 else self.bodies[0]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def engine_metrics() -> Iterator[tuple[str, type[Metrics]]]:
    handler = type("M", (Metrics,), {"bodies": [], "seen": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    httpd.shutdown()
    httpd.server_close()


def exposition(running: int, waiting: int, sglang_busy: int = 40) -> str:
    """toyserve's gauges, plus SGLang's names busy: read by mistake, they would never drain."""
    return (
        "# TYPE toyserve_running_requests gauge\n"
        f'toyserve_running_requests{{model="toy"}} {running}\n'
        "# TYPE toyserve_waiting_requests gauge\n"
        f'toyserve_waiting_requests{{model="toy"}} {waiting}\n'
        f"sglang:num_running_reqs {sglang_busy}\nsglang:num_queue_reqs {sglang_busy}\n"
    )


def test_the_router_drain_waits_on_toyserves_running_and_waiting_gauges(
    project: Path, engine_metrics: tuple[str, type[Metrics]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, handler = engine_metrics
    handler.bodies = [exposition(3, 2)]
    assert router_kinds.engine_inflight(url, "toyserve")() == 5
    handler.bodies = ["sglang:num_running_reqs 0\nsglang:num_queue_reqs 0\n"]
    with pytest.raises(RouterError) as exc:
        router_kinds.engine_inflight(url, "toyserve")()
    assert exc.value.outcome is RouterOutcome.ENGINE_METRICS
    assert str(exc.value) == (
        f"{url}/metrics: none of toyserve_running_requests, toyserve_waiting_requests in the engine's /metrics"
    )
    # the drain step of a routed toyserve host, built from its host vars as the rollout builds it
    port = int(url.rsplit(":", 1)[1])
    (hv,) = hosts("toy3")
    hv = hv.model_copy(update={"listen_host": "127.0.0.1", "port": port, "router_url": "http://127.0.0.1:30080"})
    router = MemRouter({hv.base_url: True, "http://127.0.1.4:31000": True})
    monkeypatch.setattr(router_kinds, "router_for", lambda kind, url: router)
    handler.bodies, handler.seen = [exposition(1, 1), exposition(0, 1), exposition(0, 0)], []
    route = router_kinds.route_of(hv, set(), clock=FakeClock())
    assert route is not None
    result = drain(route)
    assert (result.outcome, result.message) == (RouterOutcome.OK, f"{hv.base_url} out of {router.url}, 0 in flight")
    assert handler.seen == ["/metrics"] * 4  # 2, 1, 0, 0: zero twice
    assert router.calls == ["list", f"remove {hv.base_url}"]


@dataclass
class RecordingProm:
    """Prometheus as the canary sees it: records each query and answers per host from ``values`` (a metric name
    that occurs in the query -> the value)."""

    values: dict[str, float]
    queries: list[str] = field(default_factory=list)

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        self.queries.append(expr)
        hit = [v for name, v in self.values.items() if name in expr]
        return [Sample({"host": h}, hit[0]) for h in ("toy3", "toy4")] if hit else []


def test_the_canary_and_load_profile_read_toyserves_series(project: Path) -> None:
    prom = RecordingProm(
        {"toyserve_tokens_out_total": 900.0, "toyserve_token_gap_seconds": 0.02, "toyserve_requests_done_total": 120.0}
    )
    values, requests, resets = canary_windows.window_values(prom, hosts("toy3:toy4"), 1000.0, 15.0)  # type: ignore[arg-type]
    sel = 'host=~"toy3|toy4"'
    assert prom.queries == [
        f"sum by (host) (rate(toyserve_tokens_out_total{{{sel}}}[15s])) / "
        f"sum by (host) (rate(toyserve_request_duration_seconds_sum{{{sel}}}[15s]))",
        f"sum by (host) (rate(toyserve_token_gap_seconds_sum{{{sel}}}[15s])) / "
        f"sum by (host) (rate(toyserve_token_gap_seconds_count{{{sel}}}[15s]))",
        f"sum by (host) (increase(toyserve_requests_done_total{{{sel}}}[15s]))",
        f"max by (host) (resets(toyserve_requests_done_total{{{sel}}}[15s]))",
    ]
    assert values == {"tput": {"toy3": 900.0, "toy4": 900.0}, "itl": {"toy3": 0.02, "toy4": 0.02}}
    assert requests == resets == {"toy3": 120.0, "toy4": 120.0}
    assert loadprofile.running_gauges()["toyserve"] == "toyserve_running_requests"


# --- 5. engine groups -----------------------------------------------------------------------------------------


def test_an_engine_group_of_toyserve_hosts_gets_toyserves_rank_flags(project: Path) -> None:
    toy1, toy2 = hosts("toy1:toy2")
    engine = adapter.engine("toyserve")
    assert toy1.group is not None and toy2.group is not None
    assert rank_flags(toy1.group, "toy2", rank_spec(toy1.group, engine)) == rank_args(toy2, engine)
    assert rank_args(toy1, engine) == {"world": "2", "rank": "0", "coordinator": "127.0.1.1:7100"}
    assert rank_args(toy2, engine) == {"world": "2", "rank": "1", "coordinator": "127.0.1.1:7100", "follower": True}
    toy = resolve("toy")
    assert expected_argv(toy, toy2) == [
        *LAUNCH, "127.0.1.2", "--port", "31000",
        "--attention=paged", "--coordinator=127.0.1.1:7100", "--follower", "--max-batch=128", "--no-warmup",
        "--rank=1", "--world=2",
    ]  # fmt: skip
    # what an apply hands the role per rank (knob_serve_groups)
    assert ranks.role_vars(ranks.of([toy1, toy2]), "toyserve") == {
        "toy1": {"name": "tg", "hosts": ["toy1", "toy2"], "args": rank_args(toy1, engine)},
        "toy2": {"name": "tg", "hosts": ["toy1", "toy2"], "args": rank_args(toy2, engine)},
    }


def test_an_engine_group_of_toyserve_hosts_is_in_sync_and_applied_as_one_unit(project: Path) -> None:
    door, hvs = door_for("toy", ["toy1", "toy2"])
    verdicts = _drift(door, hvs)
    assert [(v.status, [f.message for f in v.findings]) for v in verdicts.values()] == [("in_sync", [])] * 2
    report = apply(resolve("toy-big"), hvs, door, Options(check=True), slots=Slots())  # type: ignore[arg-type]
    assert [(o.host, o.status, o.group) for o in report.hosts] == [
        ("toy1", "pending", "tg rank 0"),
        ("toy2", "pending", "tg rank 1"),
    ], report.hosts[0].message


# --- 6. a catalog without serve.metrics or serve.ranks --------------------------------------------------------


def _one_line_refusal(exc: pytest.ExceptionInfo[KnobfleetError], needed_by: str, needs: str) -> None:
    text = str(exc.value)
    assert "\n" not in text
    # the message then names where to add them (profiles/catalogs/toyserve.overlay.yaml: the shipped overlay's
    # place, not this project's hand-written catalogs/toyserve.yaml)
    assert text.startswith(f"engine toyserve: {needed_by} needs {needs}, and its catalog has no serve.")


def test_without_serve_metrics_the_drain_and_the_canary_refuse_toyserve_in_one_line(project: Path) -> None:
    without("metrics")
    for needed_by, use in (
        ("the router drain", lambda: router_kinds.engine_inflight("http://127.0.0.1:9", "toyserve")),
        ("the canary", lambda: canary_windows.engine_series("toyserve")),
        ("the canary", lambda: canary_windows.window_values(RecordingProm({}), hosts("toy3"), 1000.0, 15.0)),  # type: ignore[arg-type]
    ):
        with pytest.raises(KnobfleetError) as exc:
            use()
        _one_line_refusal(exc, needed_by, "its Prometheus metric names")
        names = "running and queued" if needed_by == "the router drain" else \
            "generation_tokens, e2e_latency, inter_token_latency and finished"  # fmt: skip
        assert f"serve.metrics; add {names} under serve.metrics: in " in str(exc.value)
    assert "toyserve" not in loadprofile.running_gauges()  # load-profile reads the engines that name a gauge
    assert expected_argv(resolve("toy"), hosts("toy3")[0])[:3] == LAUNCH[:3]  # the rest of the engine is there


def test_without_serve_ranks_a_group_refuses_toyserve_in_one_line(project: Path) -> None:
    without("ranks")
    toy1, toy3 = hosts("toy1:toy3")
    for use in (
        lambda: rank_args(toy1, adapter.engine("toyserve")),
        lambda: render_host(resolve("toy"), toy1),
        lambda: ranks.role_vars(ranks.of([toy1, *hosts("toy2")]), "toyserve"),
    ):
        with pytest.raises(KnobfleetError) as exc:
            use()
        _one_line_refusal(exc, "engine group tg", "how its ranks find each other")
        assert "serve.ranks; add flags (with {nnodes}, {rank}, {head}, {port}) and follower_flags under serve: in " in (
            str(exc.value)
        )
    assert render_host(resolve("toy"), toy3).argv == [*LAUNCH, "127.0.1.3", "--port", "31000", *TOY_ARGS]  # alone

"""Use cases: verify / drift. One probe per host through a transport (fleet/probe.py), then the one live-state
rule against the host's current generation (live/verify.py). Nothing is changed on any host.

``stream`` works on the read path's plain view of the hosts (fleet/readhost.py) and yields each verdict as its
host answers; ``check`` is the same for validated host vars, collected in order."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from knobfleet.errors import KnobfleetError
from knobfleet.fleet.hosts import Hosts, door
from knobfleet.live.verify import Declared, Finding, HostVerdict, unreachable, verify_host

if TYPE_CHECKING:
    from knobfleet.fleet.hostvars import HostVars
    from knobfleet.fleet.readhost import ReadHost, ReadPlan
    from knobfleet.fleet.transports.base import Outcome
    from knobfleet.groups import EngineGroup


def _declared(profile: str | None, cache: dict[str, Declared | str]) -> Declared | str | None:
    if not profile:
        return None
    if profile not in cache:
        from knobfleet.profiles.store import ProfileStore

        try:
            p = ProfileStore().resolve(profile)
            cache[profile] = Declared(p.name, p.version, p.content_hash, p.engine_version)
        except KnobfleetError as exc:
            cache[profile] = f"knob_profile {profile!r} cannot be resolved: {str(exc).splitlines()[0]}"
    return cache[profile]


def engine_rules(hv: HostVars, doc: dict[str, Any]) -> dict[str, Any]:
    """The engine part of the rule for ``hv``: its declared engine, else the one its current generation
    recorded, else the default engine."""
    from knobfleet.fleet.readhost import recorded_engine

    name = hv.engine if hv.engine is not None else recorded_engine(doc)
    try:
        return hv.adapter(name).rules()
    except KnobfleetError:
        return hv.adapter().rules()


def verdict_for(hv: HostVars, doc: dict[str, Any], declared: Declared | None) -> HostVerdict:
    return verify_host(hv.host, doc, declared, engine_rules(hv, doc))


def _verdict(plan: ReadPlan, host: ReadHost, o: Outcome, cache: dict[str, Declared | str]) -> HostVerdict:
    if o.error is not None:
        if o.error.kind == "unreachable":
            return unreachable(host.host, str(o.error))
        return HostVerdict(host.host, "error", error=str(o.error))
    declared = _declared(host.profile, cache)
    if isinstance(declared, str):
        return HostVerdict(host.host, "error", error=declared)
    rules = plan.rules_for(host, o.doc)
    verdict = verify_host(host.host, o.doc, declared, rules)
    from knobfleet.profiles.hostversion import INFO_VERSION, reported

    running, _ = reported(o.doc, tuple(rules.get("info_version") or INFO_VERSION))
    if running:  # the fleet's engine versions: skew shows mid-upgrade
        verdict.engine_version = running
        found = version_mismatch(declared, verdict)
        if found is not None:
            verdict.status, verdict.findings = "drift", [*verdict.findings, found]
    return verdict


def version_mismatch(declared: Declared | None, verdict: HostVerdict) -> Finding | None:
    """The ``engine_version_mismatch`` finding of a host whose version file says another version than its
    declared profile pins; None when the profile pins none, the host reports none, or they agree. Pure."""
    from knobfleet.module_utils.knob_rules import Kind

    pin = declared.engine_version if declared is not None else None
    if not pin or not verdict.engine_version or verdict.engine_version == pin:
        return None
    if verdict.status not in ("in_sync", "drift"):
        return None
    return ruled(
        Kind.ENGINE_VERSION_MISMATCH,
        f"the host reports engine version {verdict.engine_version}; {declared.name if declared else '?'}@"
        f"{declared.version if declared else '?'} pins {pin}: check the install behind its launcher",
        expected=pin,
        actual=verdict.engine_version,
    )


def ruled(kind: Any, message: str, **fields: Any) -> Finding:
    """A finding drift makes itself (not the host's rule), with its kind's severity and action. Pure."""
    from knobfleet.module_utils.knob_rules import RULES

    rule = RULES[kind]
    return Finding(kind, message, rule.severity, rule.action, **fields)


def stream(
    plan: ReadPlan,
    inventory: Path | Hosts,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    save_probes: Path | None = None,
    via: str = "auto",
    forks: int | None = None,
    liveness: bool = False,
    routers: dict[str, str] | None = None,
) -> Iterator[HostVerdict]:
    """Each host's verdict as its probe arrives (at most ``forks`` hosts probed at once). Nothing but the verdict
    is kept of a host once it is yielded: its probe document is dropped (or saved to ``save_probes``).
    ``liveness`` (verify): engines whose health check does not generate also get a one-token completion.
    With ``routers`` (a dict: ``drift`` and ``verify`` pass one; a rollout's own checks do not, since it takes hosts
    out on purpose), hosts a router fronts are also looked up in its worker list, read once per router while the
    probes run: a worker it does not list is an ``out_of_router`` finding; a router that cannot be read is put in
    ``routers`` (URL -> one line) and its hosts judged without it."""
    import dataclasses

    hosts = [
        h
        if liveness or not h.probe.get("liveness_url")
        else dataclasses.replace(h, probe={**h.probe, "liveness_url": ""})
        for h in plan.hosts
    ]
    by_name = {h.host: h for h in hosts}
    cache: dict[str, Declared | str] = {}
    if save_probes is not None:
        save_probes.mkdir(parents=True, exist_ok=True)
    gate = door(inventory, via, forks)
    ranks = _Ranks(plan, hosts)
    lists = RouterLists.start(hosts) if routers is not None else None
    try:
        for o in gate.stream(hosts, on_event) if hosts else ():
            if save_probes is not None and o.doc is not None:
                import json

                write_atomic(save_probes / f"{o.host}.json", json.dumps(o.doc, indent=1, sort_keys=True) + "\n")
            verdict = _verdict(plan, by_name[o.host], o, cache)
            if lists is not None:
                verdict = lists.judge(by_name[o.host], verdict)
            yield from ranks.add(by_name[o.host], o, verdict)
    finally:
        if lists is not None:
            lists.close()
            if routers is not None:
                routers.update(lists.problems)


class RouterLists:
    """The worker list of every router that fronts a host being read, each read once in its own thread as soon
    as the read starts (a router answers while the hosts' probes run)."""

    def __init__(self, routers: set[tuple[str, str]]) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.pool = ThreadPoolExecutor(max_workers=min(len(routers), 8), thread_name_prefix="router")
        self.futures = {url: self.pool.submit(_listed, kind, url) for kind, url in sorted(routers)}
        self.problems: dict[str, str] = {}

    @classmethod
    def start(cls, hosts: list[ReadHost]) -> RouterLists | None:
        routers = {(h.router["kind"], h.router["url"]) for h in hosts if h.router}
        return cls(routers) if routers else None

    def judge(self, host: ReadHost, verdict: HostVerdict) -> HostVerdict:
        """``verdict`` with an ``out_of_router`` finding when the host's router does not list its worker."""
        if host.router is None or verdict.status not in ("in_sync", "drift"):
            return verdict
        listed = self.futures[host.router["url"]].result()
        if isinstance(listed, str):
            self.problems[host.router["url"]] = listed
            return verdict
        found = out_of_router(host.host, host.router, listed)
        if found is None:
            return verdict
        import dataclasses

        return dataclasses.replace(verdict, status="drift", findings=[*verdict.findings, found])

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def _listed(kind: str, url: str) -> set[str] | str:
    """The worker URLs ``url`` lists, or why it cannot be read (one line)."""
    from knobfleet.fleet.router import RouterError
    from knobfleet.fleet.router_kinds import router_for

    try:
        return {w.url for w in router_for(kind, url).list_workers()}
    except RouterError as exc:
        return str(exc)


def out_of_router(host: str, router: dict[str, str], listed: set[str]) -> Finding | None:
    """The ``out_of_router`` finding of ``host`` when its worker (``router["worker"]``) is not among ``listed``,
    the URLs its router lists; None when it is. Pure."""
    from knobfleet.fleet.router import normalize_url
    from knobfleet.module_utils.knob_rules import Kind

    worker = normalize_url(router["worker"])
    if worker in listed:
        return None
    return ruled(
        Kind.OUT_OF_ROUTER,
        f"{router['url']} does not list {worker} among its {len(listed)} worker(s): it sends this host no traffic; "
        f"`knobfleet router readd --limit {host}` puts it back",
        expected=worker,
    )


class _Ranks:
    """The ranks of engine groups: a rank's verdict waits (keeping only what it runs, never its document) until
    every rank of its group read here has answered; then the cross-rank rule (live/groups.py) adds its findings
    to the ranks concerned and they are yielded together."""

    def __init__(self, plan: ReadPlan, hosts: list[ReadHost]) -> None:
        self.plan = plan
        self.groups: dict[str, EngineGroup] = {}
        for h in hosts:
            if h.group is not None and h.group["name"] not in self.groups:
                from knobfleet.groups import from_json  # only a fleet with groups loads their module

                self.groups[h.group["name"]] = from_json(h.group)
        here = {h.host for h in hosts}
        self.waiting = {name: [m for m in g.hosts if m in here] for name, g in self.groups.items()}
        self.held: dict[str, HostVerdict] = {}
        self.states: dict[str, dict[str, Any]] = {name: {} for name in self.groups}

    def add(self, host: ReadHost, o: Outcome, verdict: HostVerdict) -> Iterator[HostVerdict]:
        if host.group is None:
            yield verdict
            return
        from knobfleet.live import groups as rule
        from knobfleet.live.verify import findings_of

        name = host.group["name"]
        if o.doc is not None:
            self.states[name][host.host] = rule.from_probe(o.doc, self.plan.rules_for(host, o.doc))
        self.held[host.host] = verdict
        if not all(m in self.held for m in self.waiting[name]):
            return
        group = self.groups[name]
        found = rule.check(group, rule.with_reports(group, self.states[name]))
        for m in self.waiting[name]:
            v = self.held.pop(m)
            mine = findings_of([f for f in found if f["host"] == m])
            if mine and v.status in ("in_sync", "drift"):
                v.findings = [*v.findings, *mine]
                v.status = "drift"
            yield v


def check(
    hosts: list[HostVars],
    inventory: Path | Hosts,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    save_probes: Path | None = None,
    via: str = "auto",
    forks: int | None = None,
) -> list[HostVerdict]:
    """Every host's verdict, in the order of ``hosts``."""
    from knobfleet.fleet.readhost import plan_from_hostvars

    got = {v.host: v for v in stream(plan_from_hostvars(hosts), inventory, on_event, save_probes, via, forks)}
    return [got[hv.host] for hv in hosts]


def write_atomic(path: Path, text: str) -> None:
    """Temp file + rename in the same folder; never replaces a device, FIFO, directory or symlink (safefile)."""
    from knobfleet import safefile

    safefile.write_text(path, text)


def run_testinfra(inventory: Path, limit: str | None, quiet: bool) -> int:
    """``verify --testinfra``: the shipped host checks (tests/testinfra) against the same hosts."""
    import subprocess
    import sys

    from knobfleet import paths

    tests = paths.project_root() / "tests" / "testinfra"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--hosts=ansible://{limit or 'all'}",
        f"--ansible-inventory={inventory.resolve()}",
        str(tests),
    ]
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")  # ansible-inventory
    proc = subprocess.run(cmd, capture_output=quiet, text=True, cwd=paths.project_root(), env=env)
    return proc.returncode

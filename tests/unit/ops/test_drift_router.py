"""``out_of_router`` (ops/drift.py): a host its router does not list is drift, found while the probes run, from
the router's own ``GET /workers`` over real HTTP (a tiny router on 127.0.0.1 in the test); a router that cannot be
read leaves its hosts judged without it and is named once. ``router status`` / ``router readd`` (ops/routing.py)
read the same list and put the missing worker back."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from test_drift_unreachable import HOSTS, ScriptedTransport, outcome

from knobfleet import report_prom
from knobfleet.fleet import readhost, transports
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.readhost import plan_from_hostvars
from knobfleet.live.verify import exit_code
from knobfleet.module_utils.knob_rules import Kind
from knobfleet.ops import drift, routing
from tests.unit.fleet.test_router_kinds import Recorder


class Router(ThreadingHTTPServer):
    """sglang-router 0.3's worker API: ``GET /workers``, ``POST /workers {"url"}``."""

    workers: list[str]


class Handler(Recorder):  # its JSON answers and its silence, with sglang-router 0.3's worker list
    server: Router  # type: ignore[assignment]

    def do_GET(self) -> None:
        ws = [{"id": f"w{i}", "url": u, "is_healthy": True, "load": 0} for i, u in enumerate(self.server.workers)]
        self._send(200, {"workers": ws}) if self.path == "/workers" else self._send(404, {})

    def do_POST(self) -> None:
        doc = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.workers.append(doc["url"])
        self._send(202, {"status": "accepted"})


@pytest.fixture
def router() -> Iterator[Router]:
    srv = Router(("127.0.0.1", 0), Handler)
    srv.workers = [f"http://{a}:30000" for a in HOSTS.values()]
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def hostvars(url: str) -> list[HostVars]:
    return [HostVars(host=h, address=a, listen_host=a, port=30000, router_url=url) for h, a in HOSTS.items()]


def stream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hosts: list[HostVars], **probes: str) -> Any:
    monkeypatch.setitem(transports.REGISTRY, "scripted", ScriptedTransport())
    monkeypatch.setattr(transports, "VIA", (*transports.VIA, "scripted"))
    monkeypatch.setattr(ScriptedTransport, "script", {h: outcome(h, probes.get(h, "clean")) for h in HOSTS})
    problems: dict[str, str] = {}
    plan = plan_from_hostvars(hosts)
    assert readhost.from_json(readhost.to_json(plan)).hosts == plan.hosts  # the router survives the read-path cache
    verdicts = {v.host: v for v in drift.stream(plan, tmp_path / "inventory", via="scripted", routers=problems)}
    return verdicts, problems


def router_url(srv: Router) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}"


def test_a_host_its_router_does_not_list_is_drift(
    router: Router, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    router.workers.remove("http://127.0.1.2:30000")
    verdicts, problems = stream(tmp_path, monkeypatch, hostvars(router_url(router)))
    assert problems == {}
    assert {h: v.status for h, v in verdicts.items()} == {"lab1": "in_sync", "lab2": "drift", "lab3": "in_sync"}
    (f,) = verdicts["lab2"].findings
    assert f.kind is Kind.OUT_OF_ROUTER and f.severity == "error" and f.expected == "http://127.0.1.2:30000"
    assert f.message == (
        f"{router_url(router)} does not list http://127.0.1.2:30000 among its 2 worker(s): it sends this host no "
        "traffic; `knobfleet router readd --limit lab2` puts it back"
    )
    assert exit_code(list(verdicts.values())) == 2
    prom = report_prom.prometheus(list(verdicts.values()))
    assert 'knobfleet_drift_findings{host="lab2",kind="out_of_router"} 1' in prom


def test_its_own_drift_and_being_out_are_both_reported(
    router: Router, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    router.workers.remove("http://127.0.1.1:30000")
    verdicts, _ = stream(tmp_path, monkeypatch, hostvars(router_url(router)), lab1="drift")
    kinds = [f.kind for f in verdicts["lab1"].findings]
    assert Kind.OUT_OF_ROUTER in kinds and len(kinds) > 1


def test_an_unreachable_host_gets_no_router_finding(
    router: Router, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    router.workers.clear()
    verdicts, _ = stream(tmp_path, monkeypatch, hostvars(router_url(router)), lab3="unreachable")
    assert verdicts["lab3"].status == "unreachable" and verdicts["lab3"].findings == []
    assert [f.kind for f in verdicts["lab1"].findings] == [Kind.OUT_OF_ROUTER]


def test_a_router_that_cannot_be_read_is_named_and_its_hosts_judged_without_it(
    router: Router, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = router_url(router)
    router.shutdown()
    router.server_close()
    verdicts, problems = stream(tmp_path, monkeypatch, hostvars(url))
    assert {v.status for v in verdicts.values()} == {"in_sync"}
    assert list(problems) == [url] and problems[url]


def test_hosts_without_a_router_are_not_looked_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = [HostVars(host=h, address=a) for h, a in HOSTS.items()]
    assert all(h.router is None for h in plan_from_hostvars(plain).hosts)
    assert drift.RouterLists.start(plan_from_hostvars(plain).hosts) is None
    verdicts, problems = stream(tmp_path, monkeypatch, plain)
    assert {v.status for v in verdicts.values()} == {"in_sync"} and problems == {}


@pytest.mark.parametrize(
    ("listed", "out"),
    [
        ({"http://h:1"}, False),
        ({"http://h:1/"}, True),  # the router's list is already normalized; the worker is normalized here
        (set(), True),
        ({"http://h:2", "http://g:1"}, True),
    ],
)
def test_out_of_router_is_pure(listed: set[str], out: bool) -> None:
    got = drift.out_of_router("h", {"kind": "sglang", "url": "http://r:1", "worker": "http://h:1/"}, listed)
    assert (got is not None) == out


def test_router_status_and_readd(router: Router) -> None:
    router.workers.remove("http://127.0.1.3:30000")
    hosts = hostvars(router_url(router))
    states = routing.worker_states(hosts)
    assert [(s.host, s.listed, s.healthy) for s in states] == [
        ("lab1", True, True), ("lab2", True, True), ("lab3", False, False)
    ]  # fmt: skip
    refused = routing.readd(hosts, engine_ready=lambda hv: "http://127.0.1.3:30000/health: Connection refused")
    assert refused == [
        ("lab3", False, "not put back: its engine is not ready (http://127.0.1.3:30000/health: Connection refused); "
                        "fix it first (knobfleet verify)")
    ]  # fmt: skip
    assert "http://127.0.1.3:30000" not in router.workers
    done = routing.readd(hosts, engine_ready=lambda hv: None)
    assert [(h, ok) for h, ok, _ in done] == [("lab3", True)]
    assert "http://127.0.1.3:30000" in router.workers
    assert routing.readd(hosts, engine_ready=lambda hv: None) == []  # nothing left out: nothing done

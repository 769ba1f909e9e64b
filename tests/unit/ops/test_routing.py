"""Router-aware rollouts (ops/routing.py): every host a router fronts is drained before anything changes on it and
put back once verified, one host at a time with --serial 1; a failure restores the old generation and then puts
the worker back; the capacity guard refuses to take out the last healthy worker. A fake ``Hosts`` door and an
in-memory router (no host, no Ansible, no HTTP)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rollout_fakes import FakeHosts, Host

from knobfleet.errors import UsageError
from knobfleet.fleet import router_kinds
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.router import Route
from knobfleet.ops.apply import apply
from knobfleet.ops.precheck import Options
from knobfleet.ops.routing import route_slots, router_slots
from knobfleet.profiles.store import ProfileStore
from knobfleet.stepcore import Batch, Journal, drive, undo_walk
from tests.unit.fleet.test_router import FakeClock, MemRouter

ROUTER = "http://127.0.0.1:30080"


@pytest.fixture
def profile(profiles_dir: Path):  # type: ignore[no-untyped-def]
    return ProfileStore(profiles_dir).resolve("ctas512")


def hosts(n: int, **kw: Any) -> list[HostVars]:
    return [
        HostVars(
            host=f"h{i}",
            listen_host=f"127.0.1.{i}",
            port=30000,
            router_url=ROUTER,
            drain_timeout_s=5,
            timeout_stop_s=60,
            **kw,
        )
        for i in range(1, n + 1)
    ]


@pytest.fixture
def router(monkeypatch: pytest.MonkeyPatch) -> MemRouter:
    mem = MemRouter({f"http://127.0.1.{i}:30000": True for i in range(1, 4)}, url=ROUTER)
    monkeypatch.setattr(router_kinds, "router_for", lambda kind, url: mem)
    monkeypatch.setattr(router_kinds, "engine_inflight", lambda url, engine: lambda: 0)

    class Clock:
        t = 0.0

        def now(self) -> float:
            return self.t

        def sleep(self, s: float) -> None:
            self.t += s

    monkeypatch.setattr(router_kinds, "MonotonicClock", Clock)
    return mem


def _events(router: MemRouter, door: FakeHosts) -> list[str]:
    return [c for c in router.calls if c != "list"]


def test_serial_1_drains_each_host_restarts_it_and_puts_it_back_before_the_next(
    profile: Any, router: MemRouter
) -> None:
    hv = hosts(3)
    door = FakeHosts({h.host: Host() for h in hv})
    seen: list[str] = []
    door.during_play = lambda: seen.append(",".join(sorted(router.workers)))
    report = apply(profile, hv, door, Options(serial="1"))  # type: ignore[arg-type]
    assert [o.status for o in report.hosts] == ["applied"] * 3
    assert _events(router, door) == [
        "remove http://127.0.1.1:30000",
        "add http://127.0.1.1:30000",
        "remove http://127.0.1.2:30000",
        "add http://127.0.1.2:30000",
        "remove http://127.0.1.3:30000",
        "add http://127.0.1.3:30000",
    ]
    # while a host's engine restarted, the router held every other worker and not that one
    assert seen == [
        "http://127.0.1.2:30000,http://127.0.1.3:30000",
        "http://127.0.1.1:30000,http://127.0.1.3:30000",
        "http://127.0.1.1:30000,http://127.0.1.2:30000",
    ]
    assert sorted(router.workers) == [f"http://127.0.1.{i}:30000" for i in range(1, 4)]


def test_without_serial_the_rollout_follows_the_capacity_guard(profile: Any, router: MemRouter) -> None:
    """`apply-profile ctas512 --yes` behind a router with max_unavailable 1: every host applied, one at a time,
    never one refused by the guard (it used to fail 3 of 4: "taking ... out would leave 2 of 4 workers out")."""
    hv = hosts(3)
    door = FakeHosts({h.host: Host() for h in hv})
    out_at_once: list[int] = []
    door.during_play = lambda: out_at_once.append(3 - len(router.workers))
    report = apply(profile, hv, door, Options())  # type: ignore[arg-type]
    assert [o.status for o in report.hosts] == ["applied"] * 3, [o.message for o in report.hosts]
    assert [o.batch for o in report.hosts] == [1, 2, 3]
    assert out_at_once == [1, 1, 1]
    plays = len(door.log)
    with pytest.raises(UsageError, match=r"^--serial 2: a batch would take 2 workers of .* nothing was changed$"):
        apply(profile, hv, door, Options(serial="2"))  # type: ignore[arg-type]
    assert len(door.log) == plays


def test_a_failed_restart_restores_then_puts_the_worker_back(profile: Any, router: MemRouter) -> None:
    hv = hosts(2)
    door = FakeHosts({"h1": Host(fail_at="ready"), "h2": Host()})
    report = apply(profile, hv, door, Options(serial="1"))  # type: ignore[arg-type]
    assert report.hosts[0].status != "applied"
    assert door.hosts["h1"].current == 3 and door.hosts["h1"].lock is None
    i_restore = door.log.index("play restore.yml h1")
    assert router.calls.index("add http://127.0.1.1:30000") > router.calls.index("remove http://127.0.1.1:30000")
    assert "http://127.0.1.1:30000" in router.workers, "a host is never left out of its router"
    assert i_restore > door.log.index("play apply.yml h1")


@pytest.mark.parametrize(
    ("force", "statuses", "dropped"),
    [(False, ["failed", "not-run"], [None, None]), (True, ["applied", "applied"], [2, None])],
    ids=["drain-timeout-fails-the-host", "force-restart-restarts-and-counts"],
)
def test_a_drain_that_times_out(
    profile: Any, router: MemRouter, monkeypatch: pytest.MonkeyPatch, force: bool, statuses: list[str],
    dropped: list[int | None],
) -> None:  # fmt: skip
    """h1's engine keeps 2 requests in flight past knob_drain_timeout: without --force-restart h1 fails and stays in
    service on its old generation; with it, h1 is restarted anyway, put back, and its 2 dropped requests counted."""
    monkeypatch.setattr(
        router_kinds, "engine_inflight", lambda url, engine: (lambda: 2) if "127.0.1.1" in url else (lambda: 0)
    )
    hv = hosts(2)
    door = FakeHosts({h.host: Host() for h in hv})
    report = apply(profile, hv, door, Options(serial="1", force_restart=force))  # type: ignore[arg-type]
    assert [o.status for o in report.hosts] == statuses, [o.message for o in report.hosts]
    assert [o.dropped for o in report.hosts] == dropped
    assert door.hosts["h1"].current == (4 if force else 3)
    assert "http://127.0.1.1:30000" in router.workers, "a host is never left out of its router"
    if force:
        assert "restarted anyway (--force-restart): 2 dropped" in report.hosts[0].message
        assert report.hosts[0].as_json()["dropped"] == 2
        from knobfleet.report_rollout import apply_summary

        assert "--force-restart dropped 2 request(s) on 1 host(s)" in apply_summary(report)
    else:
        assert "raise knob_drain_timeout or use --force-restart" in report.hosts[0].message


def test_the_last_healthy_worker_is_never_taken_out(profile: Any, router: MemRouter) -> None:
    router.workers = {"http://127.0.1.1:30000": True, "http://127.0.1.2:30000": False}  # h2 unhealthy already
    router.healthy_after = 10**6
    door = FakeHosts({"h1": Host()})
    report = apply(profile, hosts(1), door, Options())  # type: ignore[arg-type]
    (o,) = report.hosts
    assert o.status != "applied" and "last healthy" in (o.message or "")
    assert not any(c.startswith("remove") for c in router.calls)
    assert door.log == [] or all(not line.startswith("play apply.yml") for line in door.log)
    assert door.hosts["h1"].current == 3


def test_a_stop_timeout_shorter_than_the_drain_is_refused_before_anything(router: MemRouter) -> None:
    bad = hosts(1)[0].model_copy(update={"timeout_stop_s": 5, "drain_timeout_s": 30})
    with pytest.raises(UsageError, match=r"^host h1: knob_serve_timeout_stop_s \(5\) must exceed knob_drain_timeout"):
        router_slots([bad])
    assert router.calls == []


def test_hosts_without_a_router_get_no_slots() -> None:
    assert router_slots([HostVars(host="h1")]) is None


def test_rollback_drains_restores_and_readmits_one_host_at_a_time(router: MemRouter) -> None:
    from knobfleet.ops.history import rollback

    hv = hosts(2)
    door = FakeHosts({h.host: Host() for h in hv})
    seen: list[str] = []
    door.during_play = lambda: seen.append(",".join(sorted(router.workers)))
    outcomes = rollback(hv, door, 2)  # type: ignore[arg-type]
    assert [o.host for o in outcomes] == ["h1", "h2"]
    assert [c for c in router.calls if c != "list"] == [
        "remove http://127.0.1.1:30000",
        "add http://127.0.1.1:30000",
        "remove http://127.0.1.2:30000",
        "add http://127.0.1.2:30000",
    ]
    assert seen == ["http://127.0.1.2:30000,http://127.0.1.3:30000", "http://127.0.1.1:30000,http://127.0.1.3:30000"]


def test_rollback_leaves_a_host_the_router_will_not_give_up_in_service(router: MemRouter) -> None:
    from knobfleet.ops.history import rollback

    router.workers = {"http://127.0.1.1:30000": True}  # the only worker: the capacity guard keeps it
    router.healthy_after = 10**6
    door = FakeHosts({"h1": Host()})
    (o,) = rollback(hosts(1), door, 2)  # type: ignore[arg-type]
    assert not o.ok and o.generation is None
    assert o.message.endswith("it stays in service on its current generation") and "last healthy" in o.message
    assert door.log == [] and "http://127.0.1.1:30000" in router.workers


def test_a_signal_during_a_routed_rollback_finishes_that_host_and_touches_no_other(router: MemRouter) -> None:
    """SIGTERM (the handler's own code) while h1's restore plays: h1 is restored and put back in its router, h2
    is not touched, and the rollback ends interrupted with what each host runs."""
    from knobfleet.ops import interrupts
    from knobfleet.ops.history import NOT_TOUCHED, rollback

    hv = hosts(2)
    door = FakeHosts({h.host: Host() for h in hv})
    door.during_play = lambda: interrupts.request() if door.log.count("play restore.yml h1") == 1 else None
    with pytest.raises(interrupts.Interrupted, match=r"1 host\(s\) rolled back, 1 not touched") as exc:
        rollback(hv, door, 2)  # type: ignore[arg-type]
    outcomes = {o.host: o for o in exc.value.report}
    assert outcomes["h1"].ok and outcomes["h2"].message == NOT_TOUCHED
    assert door.hosts["h1"].current == 2 and door.hosts["h2"].current == 3
    assert [c for c in router.calls if c != "list"] == ["remove http://127.0.1.1:30000", "add http://127.0.1.1:30000"]
    assert not interrupts.pending()


@pytest.mark.exhaustive
def test_a_signal_anywhere_in_a_routed_rollback_ends_in_the_state_it_reports(router: MemRouter) -> None:
    """The signal handler's code run at every ~line of a routed rollback of three hosts (a tracer over ops/): each
    run ends with no host locked, every worker back in its router, and each host on the generation its outcome
    names (rolled back, or untouched on the one it ran)."""
    from knobfleet.ops import interrupts
    from knobfleet.ops.history import NOT_TOUCHED, rollback
    from tests.unit.signal_at import signal_at

    def once(k: int) -> tuple[FakeHosts, list[Any] | None, int]:
        router.workers = {f"http://127.0.1.{i}:30000": True for i in range(1, 4)}
        door = FakeHosts({h.host: Host() for h in hosts(3)})
        with signal_at(k) as tracer:
            try:
                got: list[Any] | None = rollback(hosts(3), door, 2)  # type: ignore[arg-type]
            except interrupts.Interrupted as exc:
                got = list(exc.report)
            except KeyboardInterrupt:
                got = None  # before the rollback began: nothing may have changed
        return door, got, tracer.n

    once(10**9)  # imports what a rollback imports: the count below is the same whatever ran before this test
    _, _, total = once(10**9)
    problems = []
    for k in range(1, total + 2, max(1, total // 150)):
        door, got, _ = once(k)
        if sorted(router.workers) != [f"http://127.0.1.{i}:30000" for i in range(1, 4)]:
            problems.append(f"line {k}: workers {sorted(router.workers)}")
        for name, host in door.hosts.items():
            if host.lock is not None:
                problems.append(f"line {k}: {name} locked")
            o = next((o for o in got or [] if o.host == name), None)
            want = 2 if o is not None and o.ok else 3
            if got is None and host.current != 3:
                problems.append(f"line {k}: no report but {name} runs {host.current}")
            elif got is not None and host.current != want:
                problems.append(f"line {k}: {name} reported {o and (o.ok, o.message)} but runs {host.current}")
            if o is not None and o.message == NOT_TOUCHED and any(name in line for line in door.log):
                problems.append(f"line {k}: {name} reported not touched but saw {door.log}")
    assert problems == [], "\n".join(problems[:10])


def test_behind_smg_nothing_restarts_until_the_router_has_let_the_worker_go(
    profile: Any, router: MemRouter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The settle step (a class and a line in router_slots): SMG lists a removed worker as draining for its
    drain_settle_secs; the play waits until it is gone, so the re-add never meets the old registration. A router
    that lets go only after the settle's bound fails the host before anything changed on it; the drain's undo waits
    for the draining registration to go, then adds the worker again."""
    from tests.unit.fleet.test_router import DrainingRouter

    smg = DrainingRouter({f"http://127.0.1.{i}:30000": True for i in range(1, 3)}, url=ROUTER, settle_polls=4)
    monkeypatch.setattr(router_kinds, "router_for", lambda kind, url: smg)
    hv = hosts(2)
    door = FakeHosts({h.host: Host() for h in hv})
    listed_at_play: list[list[str]] = []
    door.during_play = lambda: listed_at_play.append(sorted(w.url for w in smg.list_workers()))
    report = apply(profile, hv, door, Options(serial="1"))  # type: ignore[arg-type]
    assert [o.status for o in report.hosts] == ["applied", "applied"]
    assert listed_at_play == [["http://127.0.1.2:30000"], ["http://127.0.1.1:30000"]]  # the drained one: gone
    slow = DrainingRouter({f"http://127.0.1.{i}:30000": True for i in range(1, 3)}, url=ROUTER, settle_polls=60)
    monkeypatch.setattr(router_kinds, "router_for", lambda kind, url: slow)
    door = FakeHosts({h.host: Host() for h in hv})
    report = apply(profile, hv[:1], door, Options())  # type: ignore[arg-type]
    assert report.hosts[0].status == "failed" and "still listed by" in report.hosts[0].message
    assert door.log == [] and door.hosts["h1"] == Host()  # no play: nothing changed on the host
    assert [c for c in slow.calls if c != "list"] == ["remove http://127.0.1.1:30000", "add http://127.0.1.1:30000"]
    assert {w.url: w.healthy for w in slow.list_workers()}["http://127.0.1.1:30000"]


def test_the_route_slots_drain_settle_and_readmit_the_routed_hosts_only_and_undo_in_reverse() -> None:
    """The slots of the hosts a route covers, as the rollout runs them: drain, settle, then (after the play) the
    re-add; a host no route covers passes by every step; undone newest first, the re-add is taken back (evict) and
    the drain put back (readmit), the settle has nothing to undo."""
    router = MemRouter({"http://h1:1": True, "http://h2:1": True})
    clock = FakeClock()
    slots = route_slots({"h1": Route("h1", router, "http://h1:1", clock, lambda: 0, drain_timeout_s=5, poll_s=1)})
    assert [s.name for s in slots.before] == ["drain", "settle"] and [s.name for s in slots.after] == ["readmit"]
    failed: dict[str, str] = {}
    batch = Batch(1, ["h1", "h9"], Journal(), on_fail=lambda b, h, why: failed.__setitem__(h, why))
    steps = [*slots.before, *slots.after]
    drive(steps, batch, lambda _: None)
    assert failed == {} and batch.going == ["h1", "h9"]
    assert batch.journal.names("h1") == ["drain", "settle", "readmit"] and batch.journal.names("h9") == []
    assert router.workers == {"http://h1:1": False, "http://h2:1": True}  # back in, healthy on the next listing
    router.calls.clear()
    assert undo_walk(steps, batch, ["h1", "h9"]) == []
    # the re-add's undo takes the worker out; the drain's undo puts it back and waits until it is healthy
    assert router.calls[0] == "remove http://h1:1" and "add http://h1:1" in router.calls
    assert "http://h1:1" in router.workers

"""fleet.router: parsed router and engine documents, the capacity guard, and the drain/readmit steps driven
with an in-memory router and a fake clock (the HTTP side is proven against the real router in
tests/integration/test_router.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from knobfleet.fleet.router import (
    Generation,
    Outcome,
    Route,
    RouterError,
    RouterResult,
    Worker,
    capacity_refusal,
    drain,
    evict,
    max_out,
    parse_inflight,
    parse_workers,
    readmit,
    routed,
    settle,
    workers_out,
)

# GET /workers of sglang-router 0.3.2, recorded in front of a stand-in engine.
V032 = {
    "workers": [
        {
            "id": "06293bfb-713e-4b6b-8cb7-1e1000895378",
            "url": "http://127.0.0.1:31001",
            "model_id": "/tmp/tok",
            "priority": 50,
            "cost": 1.0,
            "worker_type": "regular",
            "is_healthy": True,
            "load": 3,
            "connection_mode": "HTTP",
            "metadata": {"model_path": "/tmp/tok"},
            "disable_health_check": False,
        }
    ],
    "total": 1,
    "stats": {"prefill_count": 0, "decode_count": 0, "regular_count": 1},
}


@pytest.mark.parametrize(
    ("doc", "generation", "workers"),
    [
        (V032, Generation.V03, [Worker("http://127.0.0.1:31001", True, "06293bfb-713e-4b6b-8cb7-1e1000895378", 3)]),
        ({"workers": [], "total": 0}, Generation.V03, []),
        (
            {"workers": [{"url": "http://a:1/", "is_healthy": False}]},
            Generation.V02,
            [Worker("http://a:1", False)],
        ),
        (
            {"workers": ["http://a:1", "http://b:2"]},
            Generation.V02,
            [Worker("http://a:1", True), Worker("http://b:2", True)],
        ),
    ],
)
def test_parse_workers(doc: object, generation: Generation, workers: list[Worker]) -> None:
    assert parse_workers(doc) == (generation, workers)


@pytest.mark.parametrize("doc", [[], {"workers": None}, {"workers": [{"id": "x"}]}, {"workers": [3]}, "x"])
def test_parse_workers_rejects(doc: object) -> None:
    with pytest.raises(ValueError):
        parse_workers(doc)


SGLANG_METRICS = """# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 7
sglang:num_queue_reqs{model_name="m"} 2.0
sglang:gen_throughput 123.4
"""
VLLM_METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
vllm:num_requests_running{engine="1",model_name="tiny"} 1.0
vllm:num_requests_waiting{engine="0",model_name="tiny"} 0.0
vllm:num_requests_waiting_by_reason{reason="capacity"} 9.0
"""


@pytest.mark.parametrize(
    ("text", "engine", "count"),
    [
        (SGLANG_METRICS, "sglang", 9),
        (VLLM_METRICS, "vllm", 4),
        ("sglang:num_running_reqs 0\n", "sglang", 0),
        # OpenMetrics with escaping=underscores (real SGLang 0.5.23 when the scrape asks for OpenMetrics 1.0)
        (SGLANG_METRICS.replace("sglang:", "sglang_"), "sglang", 9),
        ('sglang_num_running_reqs{tp_rank="0"} 2.0\nsglang_num_queue_reqs{tp_rank="0"} 1.0\n', "sglang", 3),
    ],
)
def test_parse_inflight(text: str, engine: str, count: int) -> None:
    assert parse_inflight(text, gauges(engine)) == count


@pytest.mark.parametrize(
    ("text", "engine", "message"),
    [
        ("sglang:gen_throughput 1\n", "sglang", "none of sglang:num_running_reqs, sglang:num_queue_reqs"),
        ("sglang:num_running_reqs NaN\n", "sglang", "not a count"),
        ("sglang:num_running_reqs -1\n", "sglang", "not a count"),
    ],
)
def test_parse_inflight_rejects(text: str, engine: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_inflight(text, gauges(engine))


def gauges(engine: str) -> tuple[str, str]:
    """The in-flight gauges the engine's catalog names (serve.metrics)."""
    from knobfleet.engines.adapter import engine as adapter

    running, queued = adapter(engine).metrics("the router drain")
    return running, queued


@given(st.lists(st.integers(0, 10_000), max_size=5), st.lists(st.integers(0, 10_000), max_size=5))
def test_parse_inflight_sums_every_label_set(running: list[int], queued: list[int]) -> None:
    lines = [f'sglang:num_running_reqs{{dp="{i}"}} {v}' for i, v in enumerate(running)]
    lines += [f'sglang:num_queue_reqs{{dp="{i}"}} {v}' for i, v in enumerate(queued)]
    if not lines:
        return
    assert parse_inflight("\n".join(lines), gauges("sglang")) == sum(running) + sum(queued)


@pytest.mark.parametrize(
    ("value", "total", "count"),
    [(1, 4, 1), ("2", 4, 2), ("25%", 4, 1), ("50%", 4, 2), ("10%", 4, 1), ("100%", 3, 3), (" 3 ", 8, 3)],
)
def test_max_out(value: int | str, total: int, count: int) -> None:
    assert max_out(value, total) == count


@pytest.mark.parametrize("value", [0, "0", "-1", "x", "0%", "101%", "a%", True])
def test_max_out_rejects(value: int | str) -> None:
    with pytest.raises(ValueError, match="max_unavailable"):
        max_out(value, 4)


def w(n: int, healthy: bool = True) -> Worker:
    return Worker(f"http://h{n}:1", healthy, f"id-{n}")


@pytest.mark.parametrize(
    ("workers", "out", "take", "limit", "reason"),
    [
        ([w(1), w(2), w(3)], set(), "http://h1:1", 1, None),
        ([w(2), w(3)], {"http://h1:1"}, "http://h1:1", 1, None),  # already out: nothing more taken
        (
            [w(2), w(3)],
            {"http://h1:1"},
            "http://h2:1",
            1,
            "r: taking http://h2:1 out would leave 2 of 3 workers out; max_unavailable is 1 (1): put http://h1:1 "
            "back first",
        ),
        ([w(2), w(3), w(4)], {"http://h1:1"}, "http://h2:1", "50%", None),
        (
            [w(1), w(2, healthy=False)],
            set(),
            "http://h1:1",
            2,
            "r: http://h1:1 is the last healthy worker; taking it out would stop all traffic",
        ),
        (
            [w(1)],
            set(),
            "http://h1:1",
            "100%",
            "r: http://h1:1 is the last healthy worker; taking it out would stop all traffic",
        ),
    ],
)
def test_capacity_refusal(
    workers: list[Worker], out: set[str], take: str, limit: int | str, reason: str | None
) -> None:
    assert capacity_refusal(workers, out, take, limit, "r") == reason


def test_workers_out_names_hosts_missing_from_the_router() -> None:
    expected = {"lab1": "http://h1:1/", "lab2": "http://h2:1", "lab3": "http://h3:1"}
    assert workers_out(expected, [w(1), w(3, healthy=False)]) == ["lab2"]


# --- steps, with an in-memory router and a fake clock ---------------------------------------------------------


@dataclass
class FakeClock:
    t: float = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


@dataclass
class MemRouter:
    """Keeps workers in a dict; ``healthy_after`` polls before an added worker turns healthy; ``fail`` raises."""

    workers: dict[str, bool]
    url: str = "http://router:30080"
    healthy_after: int = 0
    fail: dict[str, RouterError] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    _polls: int = 0

    def list_workers(self) -> list[Worker]:
        self.calls.append("list")
        if "list" in self.fail:
            raise self.fail["list"]
        self._polls += 1
        return [Worker(u, ok or self._polls > self.healthy_after) for u, ok in self.workers.items()]

    def remove(self, worker_url: str) -> None:
        self.calls.append(f"remove {worker_url}")
        if "remove" in self.fail:
            raise self.fail["remove"]
        del self.workers[worker_url]

    def add(self, worker_url: str) -> None:
        self.calls.append(f"add {worker_url}")
        if "add" in self.fail:
            raise self.fail["add"]
        self.workers[worker_url] = False
        self._polls = 0


def counts(*values: int):  # type: ignore[no-untyped-def]
    seq = list(values)
    return lambda: seq.pop(0) if len(seq) > 1 else seq[0]


def test_drain_waits_for_zero_twice_then_undo_puts_it_back() -> None:
    router = MemRouter({"http://h1:1": True, "http://h2:1": True})
    clock = FakeClock()
    route = Route("lab1", router, "http://h1:1/", clock, counts(5, 2, 0, 1, 0, 0), drain_timeout_s=30, poll_s=1)
    res = drain(route)
    assert (res.outcome, res.inflight, res.in_router, res.seconds) == (Outcome.OK, 0, False, 5.0)
    assert "http://h1:1" not in router.workers and route.out == {"http://h1:1"}
    back = readmit(route)
    assert back.outcome is Outcome.OK and back.in_router and route.out == set()
    assert router.workers["http://h1:1"] is False and router.calls[-3:] == ["list", "add http://h1:1", "list"]


def test_drain_timeout_is_one_line_and_puts_the_worker_back() -> None:
    router = MemRouter({"http://h1:1": True, "http://h2:1": True})
    route = Route("lab1", router, "http://h1:1", FakeClock(), counts(3), drain_timeout_s=2, poll_s=0.5)
    res = drain(route)
    assert res.outcome is Outcome.DRAIN_TIMEOUT and res.in_router and res.inflight == 3 and res.step == "drain"
    assert res.message == (
        "http://h1:1: 3 request(s) still in flight after the drain timeout (2s); raise knob_drain_timeout or use "
        "--force-restart"
    )
    assert "http://h1:1" in router.workers and route.out == set(), "a failed drain puts its worker back itself"
    assert readmit(route).ok and "http://h1:1" in router.workers


def test_force_restart_goes_on_after_the_timeout_and_counts_what_it_drops() -> None:
    router = MemRouter({"http://h1:1": True, "http://h2:1": True})
    clock = FakeClock()
    route = Route("lab1", router, "http://h1:1", clock, counts(4, 3), drain_timeout_s=2, poll_s=0.5, force=True)
    res = drain(route)
    assert (res.outcome, res.forced, res.inflight, res.in_router) == (Outcome.OK, True, 3, False)
    assert res.message == (
        "http://h1:1: 3 request(s) still in flight after the drain timeout (2s); restarted anyway (--force-restart): "
        "3 dropped"
    )
    assert "http://h1:1" not in router.workers and route.out == {"http://h1:1"}  # readmitted after the restart


def test_force_restart_changes_nothing_when_the_drain_finishes() -> None:
    router = MemRouter({"http://h1:1": True, "http://h2:1": True})
    res = drain(Route("lab1", router, "http://h1:1", FakeClock(), counts(1, 0, 0), drain_timeout_s=30, force=True))
    assert (res.outcome, res.forced, res.inflight) == (Outcome.OK, False, 0)


@pytest.mark.parametrize(
    ("router", "worker", "outcome", "message"),
    [
        (
            MemRouter({"http://h2:1": True}),
            "http://h9:1",
            Outcome.UNKNOWN_WORKER,
            "http://router:30080: http://h9:1 is not among its workers; add it to the router or fix knob_router_url",
        ),
        (
            MemRouter({"http://h1:1": True}),
            "http://h1:1",
            Outcome.CAPACITY,
            "http://router:30080: http://h1:1 is the last healthy worker; taking it out would stop all traffic",
        ),
        (
            MemRouter({"http://h1:1": True, "http://h2:1": True}, fail={"remove": RouterError(Outcome.REFUSED, "no")}),
            "http://h1:1",
            Outcome.REFUSED,
            "no",
        ),
        (
            MemRouter({}, fail={"list": RouterError(Outcome.UNREACHABLE, "router down")}),
            "http://h1:1",
            Outcome.UNREACHABLE,
            "router down",
        ),
    ],
)
def test_drain_refusals_leave_the_worker_in(router: MemRouter, worker: str, outcome: Outcome, message: str) -> None:
    route = Route("lab1", router, worker, FakeClock(), counts(0))
    res = drain(route)
    assert (res.outcome, res.message, res.in_router, res.step) == (outcome, message, True, "drain")
    assert route.out == set() and not any(
        c.startswith("remove") and outcome is not Outcome.REFUSED for c in router.calls
    )


def test_drain_engine_metrics_unreadable() -> None:
    def broken() -> int:
        raise RouterError(Outcome.ENGINE_METRICS, "http://h1:1/metrics: unreachable")

    router = MemRouter({"http://h1:1": True, "http://h2:1": True})
    res = drain(Route("lab1", router, "http://h1:1", FakeClock(), broken))
    assert res.outcome is Outcome.ENGINE_METRICS and res.in_router and "http://h1:1" in router.workers


def test_a_failed_drain_that_cannot_put_its_worker_back_says_so() -> None:
    router = MemRouter({"http://h1:1": True, "http://h2:1": True})
    router.fail["add"] = RouterError(Outcome.UNREACHABLE, "http://r: unreachable")
    res = drain(Route("lab1", router, "http://h1:1", FakeClock(), counts(3), drain_timeout_s=1, poll_s=0.5))
    assert res.outcome is Outcome.DRAIN_TIMEOUT and not res.in_router
    assert res.message.endswith("; putting it back failed too: http://r: unreachable")


def test_drain_respects_the_rollouts_shared_out_set() -> None:
    router = MemRouter({"http://h2:1": True, "http://h3:1": True})
    res = drain(Route("lab2", router, "http://h2:1", FakeClock(), counts(0), out={"http://h1:1"}))
    assert res.outcome is Outcome.CAPACITY and "put http://h1:1 back first" in res.message


def test_readmit_waits_until_healthy_or_times_out() -> None:
    router = MemRouter({"http://h2:1": True}, healthy_after=3)
    clock = FakeClock()
    res = readmit(Route("lab1", router, "http://h1:1", clock, healthy_timeout_s=10, poll_s=1, out={"http://h1:1"}))
    assert res.ok and res.seconds == 3.0
    slow = MemRouter({"http://h2:1": True}, healthy_after=100)
    route = Route("lab1", slow, "http://h1:1", FakeClock(), healthy_timeout_s=2, poll_s=1)
    res = readmit(route)
    assert res.outcome is Outcome.NOT_HEALTHY and res.in_router
    assert res.message.startswith("http://h1:1: listed but not healthy in http://router:30080 after 2s")
    undone = evict(route)
    assert undone.ok and not undone.in_router and "http://h1:1" not in slow.workers


def test_readmit_add_refused() -> None:
    router = MemRouter({"http://h2:1": True}, fail={"add": RouterError(Outcome.REFUSED, "add refused")})
    res = readmit(Route("lab1", router, "http://h1:1", FakeClock()))
    assert (res.outcome, res.message, res.in_router) == (Outcome.REFUSED, "add refused", False)


@dataclass
class DrainingRouter(MemRouter):
    """SMG's removal: the worker stays listed, draining (not healthy), for ``settle_polls`` listings."""

    settle_polls: int = 3
    draining: dict[str, int] = field(default_factory=dict)

    def list_workers(self) -> list[Worker]:
        listed = super().list_workers()
        for url in list(self.draining):
            self.draining[url] -= 1
            if self.draining[url] < 0:
                del self.draining[url]
        return listed + [Worker(u, False) for u in self.draining]

    def remove(self, worker_url: str) -> None:
        super().remove(worker_url)
        self.draining[worker_url] = self.settle_polls


def test_settle_waits_until_the_router_lets_the_worker_go() -> None:
    router = DrainingRouter({"http://h1:1": True, "http://h2:1": True}, settle_polls=3)
    clock = FakeClock()
    route = Route("lab1", router, "http://h1:1", clock, counts(0), poll_s=1)
    assert drain(route).ok
    listed_at_drain_end = [w.url for w in router.list_workers()]
    assert "http://h1:1" in listed_at_drain_end  # removed, but still listed (draining)
    res = settle(Route("lab1", router, "http://h1:1/", clock, drain_timeout_s=30, poll_s=1))
    assert (res.outcome, res.in_router) == (Outcome.OK, False) and res.seconds == 2.0
    assert res.message == "http://h1:1 gone from http://router:30080"
    assert "http://h1:1" not in [w.url for w in router.list_workers()]


def test_settle_timeout_is_one_line_naming_the_fix() -> None:
    router = DrainingRouter({"http://h1:1": True}, settle_polls=100)
    router.remove("http://h1:1")
    res = settle(Route("lab1", router, "http://h1:1", FakeClock(), drain_timeout_s=2, poll_s=0.5))
    assert res.outcome is Outcome.DRAIN_TIMEOUT and res.seconds == 2.0
    assert res.message == (
        "http://h1:1: still listed by http://router:30080 2s after its removal (SMG keeps a removed worker draining "
        "for its drain_settle_secs); lower that or raise knob_drain_timeout"
    )
    assert "\n" not in res.message and res.step == "settle"


def test_settle_with_an_unreachable_router_fails_the_step() -> None:
    err = RouterError(Outcome.UNREACHABLE, "http://router:30080: unreachable")
    router = MemRouter({"http://h1:1": True}, fail={"list": err})
    res = settle(Route("lab1", router, "http://h1:1", FakeClock()))
    assert res.outcome is Outcome.UNREACHABLE and not res.ok
    assert (res.step, res.message) == ("settle", "http://router:30080: unreachable")


def test_a_router_result_is_ok_exactly_when_its_outcome_is() -> None:
    assert routed("drain", "lab1", Outcome.OK, "").ok
    assert not routed("drain", "lab1", Outcome.CAPACITY, "full").ok
    with pytest.raises(ValueError, match="ok=True disagrees with outcome router_refused"):
        RouterResult(step="drain", host="lab1", ok=True, message="", outcome=Outcome.REFUSED)

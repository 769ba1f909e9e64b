"""The stand-in's multi-node rendezvous over real TCP on loopback: ready only when every rank joined with the
same settings; a mismatch hangs (or exits with the checker); rank 0 reports who joined; followers notice rank 0
going away."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from knobfleet.lab.sim.cluster import ConsensusError, Follower, Rendezvous, difference, fingerprint

ENV = {"SGLANG_SM120_MMA_TARGET_CTAS": "512", "NCCL_SOCKET_IFNAME": "eth0", "PATH": "/usr/bin"}
ARGS = {"model_path": "/m", "tp_size": 4, "nnodes": 3, "node_rank": 0, "host": "127.0.1.1", "port": 30000}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def stop() -> Iterator[threading.Event]:
    ev = threading.Event()
    yield ev
    ev.set()


def test_fingerprint_leaves_out_what_differs_by_design() -> None:
    a = fingerprint(ENV, ARGS)
    b = fingerprint({**ENV, "NCCL_SOCKET_IFNAME": "eth1"}, {**ARGS, "node_rank": 2, "host": "127.0.1.3"})
    assert a == b and "env:PATH" not in a
    c = fingerprint({**ENV, "SGLANG_SM120_MMA_TARGET_CTAS": "768"}, ARGS)
    assert difference(a, c) == "SGLANG_SM120_MMA_TARGET_CTAS: 512 != 768"
    assert difference(a, fingerprint(ENV, {**ARGS, "tp_size": 8})) == "tp_size: 4 != 8"


def test_ready_when_all_ranks_joined_with_the_same_settings(stop: threading.Event) -> None:
    port = _port()
    fp = fingerprint(ENV, ARGS)
    r0 = Rendezvous("127.0.0.1", port, 3, fp)
    try:
        f1 = Follower("127.0.0.1", port, 1, fp)
        assert f1.join(stop, timeout_s=10) and f1.accepted
        assert not r0.wait_ready(_stopped_after(0.5))
        assert [p["joined"] for p in r0.report()] == [True, False]
        f2 = Follower("127.0.0.1", port, 2, fp)
        assert f2.join(stop, timeout_s=10)
        assert r0.wait_ready(stop)
        assert [(p["rank"], p["joined"]) for p in r0.report()] == [(1, True), (2, True)]
        f2.close()
        _wait(lambda: r0.report()[1]["joined"] is False)
    finally:
        r0.close()
    assert f1.lost.wait(5), "a follower notices rank 0 going away"


def _stopped_after(seconds: float) -> threading.Event:
    ev = threading.Event()
    threading.Timer(seconds, ev.set).start()
    return ev


def _wait(cond: object, timeout: float = 5.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_mismatched_rank_hangs_rank_0_in_init(stop: threading.Event) -> None:
    port = _port()
    r0 = Rendezvous("127.0.0.1", port, 2, fingerprint(ENV, ARGS))
    logged: list[str] = []
    try:
        f1 = Follower("127.0.0.1", port, 1, fingerprint({**ENV, "SGLANG_SM120_MMA_TARGET_CTAS": "768"}, ARGS))
        assert f1.join(stop, timeout_s=10) and f1.accepted is False
        assert not r0.wait_ready(_stopped_after(1.0), log=logged.append)
        assert logged == [
            "init: waiting in the first collective: rank 1 (127.0.0.1) SGLANG_SM120_MMA_TARGET_CTAS: 512 != 768 "
            "(ranks disagree; this hangs)"
        ]
    finally:
        r0.close()


def test_the_consensus_checker_exits_with_the_difference(stop: threading.Event) -> None:
    port = _port()
    r0 = Rendezvous("127.0.0.1", port, 2, fingerprint(ENV, ARGS), consensus_exit=True)
    try:
        Follower("127.0.0.1", port, 1, fingerprint(ENV, {**ARGS, "tp_size": 2})).join(stop, timeout_s=10)
        with pytest.raises(ConsensusError, match=r"^rank settings differ: rank 1 \(127.0.0.1\) tp_size: 4 != 2$"):
            r0.wait_ready(stop)
    finally:
        r0.close()


def test_a_rank_out_of_range_or_taken_is_refused(stop: threading.Event) -> None:
    port = _port()
    fp = fingerprint(ENV, ARGS)
    r0 = Rendezvous("127.0.0.1", port, 2, fp)
    try:
        assert Follower("127.0.0.1", port, 1, fp).join(stop, timeout_s=10)
        second = Follower("127.0.0.1", port, 1, fp)
        assert second.join(stop, timeout_s=10) and second.accepted is False
        third = Follower("127.0.0.1", port, 5, fp)
        assert third.join(stop, timeout_s=10) and third.accepted is False
    finally:
        r0.close()


def test_the_engine_version_is_part_of_the_fingerprint() -> None:
    assert fingerprint(ENV, ARGS) == fingerprint(ENV, ARGS, None)  # without a version: as before
    a, b = fingerprint(ENV, ARGS, "0.5.0-sim"), fingerprint(ENV, ARGS, "0.5.1-sim")
    assert difference(a, b) == "engine_version: 0.5.0-sim != 0.5.1-sim"
    assert difference(a, fingerprint(ENV, ARGS)) == "engine_version: 0.5.0-sim != <unset>"


def test_stop_accepting_refuses_new_ranks_and_keeps_the_joined_ones(stop: threading.Event) -> None:
    port = _port()
    fp = fingerprint(ENV, ARGS)
    r0 = Rendezvous("127.0.0.1", port, 3, fp)
    try:
        f1 = Follower("127.0.0.1", port, 1, fp)
        assert f1.join(stop, timeout_s=10) and f1.accepted
        r0.stop_accepting()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        assert not f1.lost.is_set() and r0.report()[0]["joined"] is True
    finally:
        r0.close()
    assert f1.lost.wait(5)
    f1.close()

"""A rollout behind a router follows the capacity guard by itself (no --serial needed); an explicit --serial the
guard cannot honour is refused before anything changes."""

from __future__ import annotations

import pytest

from knobfleet.errors import UsageError
from knobfleet.fleet.hostvars import HostVars
from knobfleet.ops.routing import paced_serial

R1, R2 = "http://127.0.0.1:30080", "http://127.0.0.1:30081"


def hv(i: int, router: str | None = R1, max_unavailable: str = "1") -> HostVars:
    return HostVars(
        host=f"h{i}", listen_host=f"127.0.1.{i}", port=30000, router_url=router,
        router_max_unavailable=max_unavailable, drain_timeout_s=5, timeout_stop_s=60,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("hosts", "serial", "paced"),
    [
        ([hv(i) for i in range(1, 5)], None, "1"),
        ([hv(i, max_unavailable="2") for i in range(1, 5)], None, "2"),
        ([hv(i, max_unavailable="50%") for i in range(1, 5)], None, "2"),
        ([hv(i, max_unavailable="25%") for i in range(1, 4)], None, "1"),  # at least one
        ([hv(1), hv(2), hv(3, R2, "2"), hv(4, R2, "2")], None, "1"),  # the strictest router paces the batches
        ([hv(i, None) for i in range(1, 5)], None, None),  # no router: one batch, as before
        ([hv(i) for i in range(1, 5)], "1", "1"),
        ([hv(i, max_unavailable="2") for i in range(1, 5)], "2", "2"),
        ([hv(1), hv(2, R2), hv(3), hv(4, R2)], "2", "2"),  # each batch takes one worker of each router
    ],
)
def test_paced_serial(hosts: list[HostVars], serial: str | None, paced: str | None) -> None:
    assert paced_serial(hosts, serial) == paced


def test_a_serial_the_guard_cannot_honour_is_refused() -> None:
    with pytest.raises(UsageError) as exc:
        paced_serial([hv(i) for i in range(1, 5)], "3")
    assert str(exc.value) == (
        "--serial 3: a batch would take 3 workers of http://127.0.0.1:30080 out at once (h1, h2, h3); its "
        "knob_router_max_unavailable allows 1: use --serial 1, or leave --serial out and the rollout follows the "
        "guard; nothing was changed"
    )
    with pytest.raises(UsageError, match="use --serial 1"):
        paced_serial([hv(i) for i in range(1, 5)], "50%")

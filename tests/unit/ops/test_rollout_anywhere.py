"""A signal at any point of a rollout, not just at its step boundaries: the signal handler's own code
(``interrupts.request``, what SIGINT/SIGTERM run) is called at the k-th line the rollout executes in ops/ (a
tracer), for every k of the run, with router slots in front and a failing host included. Whatever k, the run
ends in the state its report names:

- no host is left locked;
- a host reported applied runs the new generation, every other host runs its previous one (never changed, or
  restored), and a host reported not touched has seen no play at all;
- every worker a drain took out was put back (the slot's undo, or its re-add);
- the command ends interrupted (exit 130) or, when the signal came after the last step, as the run did.

Through the fake door of tests/unit/ops/rollout_fakes.py (no host, no Ansible)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rollout_fakes import FakeHosts, Host
from test_rollout import hostvars, slots

from knobfleet.ops import interrupts
from knobfleet.ops.apply import apply
from knobfleet.ops.precheck import Options
from knobfleet.profiles.store import ProfileStore
from tests.unit.signal_at import signal_at

OPS = str(Path(interrupts.__file__).parent)


@pytest.fixture
def profile(profiles_dir: Path):  # type: ignore[no-untyped-def]
    return ProfileStore(profiles_dir).resolve("ctas512")


def run(profile: Any, k: int | None) -> tuple[FakeHosts, Any, bool]:
    names = ["h1", "h2", "h3"]
    door = FakeHosts({"h1": Host(), "h2": Host(fail_at="ready"), "h3": Host()})
    interrupted = False
    with signal_at(k or 10**9) as tracer:
        try:
            report = apply(profile, hostvars(names), door, Options(serial="1", max_fail_percent=50),
                           slots=slots(door.log))  # type: ignore[arg-type]  # fmt: skip
        except interrupts.Interrupted as exc:
            report, interrupted = exc.report, True
        except KeyboardInterrupt:  # before the rollout began: nothing may have been touched
            report, interrupted = None, True
    return door, report, interrupted and tracer.fired


def lines_of_a_whole_run(profile: Any) -> int:
    door = FakeHosts({"h1": Host(), "h2": Host(fail_at="ready"), "h3": Host()})
    with signal_at(10**9) as tracer:
        apply(profile, hostvars(["h1", "h2", "h3"]), door, Options(serial="1", max_fail_percent=50),
              slots=slots(door.log))  # type: ignore[arg-type]  # fmt: skip
    return tracer.n


def points(total: int) -> Iterator[int]:
    step = max(1, total // 250)  # ~250 points spread over the whole run
    yield from range(1, total + 2, step)


@pytest.mark.exhaustive
def test_a_signal_anywhere_ends_in_the_state_the_report_names(profile: Any) -> None:
    lines_of_a_whole_run(profile)  # imports what a rollout imports: the count below is the same whatever ran before
    total = lines_of_a_whole_run(profile)
    assert total > 200
    problems: list[str] = []
    for k in points(total):
        door, report, _ = run(profile, k)
        if report is None:
            if door.log or any(h != Host() for h in door.hosts.values() if h.fail_at is None):
                problems.append(f"signal at line {k} of {total}: no report, but hosts were touched: {door.log}")
            continue
        status = {o.host: o for o in report.hosts}
        for name, host in door.hosts.items():
            o = status.get(name)
            where = f"signal at line {k} of {total}: {name}"
            if host.lock is not None:
                problems.append(f"{where}: left locked")
            if o is None:
                problems.append(f"{where}: missing from the report")
                continue
            want = 4 if o.status == "applied" else 3
            if host.current != want:
                problems.append(f"{where}: reported {o.status} ({o.message}) but runs generation {host.current}")
            if o.status == "not-run" and any(line.startswith("play") and name in line for line in door.log):
                problems.append(f"{where}: reported not touched but a play ran on it")
            drains = door.log.count(f"drain {name}")
            back = (
                door.log.count(f"undo drain {name}")
                + door.log.count(f"readd {name}")
                - door.log.count(f"undo readd {name}")
            )
            if drains != back:
                problems.append(f"{where}: taken out of its router {drains}x, put back {back}x ({door.log})")
    assert problems == [], "\n".join(problems[:15]) + f"\n({len(problems)} problems)"

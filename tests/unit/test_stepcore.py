"""stepcore: the one step shape every rollout uses (apply's batch, the restores, the router's drain and re-add),
driven with steps that log what they do: the order of the steps and their checkpoints, how a failed host stops,
and that the undo walk puts back exactly what was done, newest first, whatever fails on the way."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from knobfleet.stepcore import Batch, Journal, PerHost, Step, StepResult, drive, undo_walk


def logged(name: str, log: list[str], fails: frozenset[str] = frozenset(), revert_fails: str = "") -> PerHost:
    """A per-host step whose act fails on ``fails`` and whose revert fails (returns not ok) on ``revert_fails``."""

    def act(h: str) -> StepResult:
        log.append(f"{name} {h}")
        return StepResult(name, h, h not in fails, "no" if h in fails else "")

    def revert(h: str) -> StepResult:
        log.append(f"undo {name} {h}")
        return StepResult(name, h, h != revert_fails, "router down" if h == revert_fails else "")

    return PerHost(name, act, revert)


def batch(*hosts: str, failed: dict[str, str] | None = None) -> Batch:
    """A batch whose rollout records each failure in ``failed`` (its own words: here, the line as given)."""
    record = failed if failed is not None else {}
    return Batch(1, list(hosts), Journal(), on_fail=lambda b, h, why: record.__setitem__(h, why))


def test_drive_runs_each_step_for_the_hosts_still_going_with_a_checkpoint_before_each() -> None:
    log: list[str] = []
    seen: list[str] = []
    failed: dict[str, str] = {}
    b = batch("h1", "h2", failed=failed)
    drive([logged("drain", log, frozenset({"h1"})), logged("install", log)], b, seen.append)
    assert seen == ["drain", "install", "end"]
    assert log == ["drain h1", "drain h2", "install h2"]
    assert b.going == ["h2"] and failed == {"h1": "drain: no"}
    assert b.journal.names("h1") == ["drain"] and b.journal.names("h2") == ["drain", "install"]


def test_the_undo_walk_is_newest_first_and_only_for_what_worked() -> None:
    log: list[str] = []
    b = batch("h1", "h2")
    steps = [logged("drain", log), logged("install", log, frozenset({"h2"})), logged("readmit", log)]
    drive(steps, b, lambda _: None)
    log.clear()
    assert undo_walk(steps, b, ["h1", "h2"]) == []
    # h2's install failed (nothing to undo there), so only its drain is put back
    assert log == ["undo readmit h1", "undo install h1", "undo drain h1", "undo drain h2"]


def test_an_undo_that_fails_is_one_line_per_host_and_the_older_undos_still_run() -> None:
    log: list[str] = []
    b = batch("h1")
    steps = [logged("drain", log), logged("readmit", log, revert_fails="h1")]
    drive(steps, b, lambda _: None)
    assert undo_walk(steps, b, ["h1"]) == ["h1: undo of readmit failed: router down"]
    assert log[-2:] == ["undo readmit h1", "undo drain h1"]


@dataclass
class Raising:
    """A step whose undo raises (a restore that failed)."""

    name: str = "install"
    undone: list[str] = field(default_factory=list)

    def do(self, batch: Batch) -> None:
        batch.journal.add(*(StepResult(self.name, h, True) for h in batch.going))

    def undo(self, batch: Batch, hosts: list[str]) -> list[str]:
        raise RuntimeError("restore failed")


def test_an_undo_that_raises_is_raised_once_the_older_steps_are_undone() -> None:
    log: list[str] = []
    b = batch("h1")
    steps: list[Step] = [logged("drain", log), Raising()]
    drive(steps, b, lambda _: None)
    with pytest.raises(RuntimeError, match="restore failed"):
        undo_walk(steps, b, ["h1"])
    assert log[-1] == "undo drain h1"


def test_a_per_host_step_that_raises_fails_that_host_in_one_line() -> None:
    def act(h: str) -> StepResult:
        if h == "h1":
            raise ConnectionError("http://router:30080: connection refused")
        return StepResult("drain", h, True)

    failed: dict[str, str] = {}
    b = batch("h1", "h2", failed=failed)
    step = PerHost("drain", act)
    step.do(b)
    assert failed == {"h1": "drain: http://router:30080: connection refused"} and b.going == ["h2"]
    assert [r.ok for r in b.journal.steps["h1"]] == [False]
    assert step.undo(b, ["h1", "h2"]) == []  # no revert: nothing to put back


def test_a_per_host_step_passes_by_the_hosts_it_does_not_cover() -> None:
    log: list[str] = []
    step = logged("drain", log)
    step.covers = {"h2"}
    b = batch("h1", "h2")
    step.do(b)
    assert log == ["drain h2"] and b.going == ["h1", "h2"] and not b.journal.reached("h1", "drain")


def test_a_batch_without_a_rollout_hook_still_stops_the_failed_host() -> None:
    b = Batch(1, ["h1", "h2"], Journal())
    b.fail("h1", "drain: no")
    assert b.going == ["h2"] and b.outcomes == {}


@given(
    plan=st.lists(
        st.tuples(st.sampled_from(["h1", "h2", "h3"]), st.integers(min_value=0, max_value=3)),
        max_size=6,
        unique_by=lambda t: t[0],
    )
)
def test_undoing_a_batch_puts_back_exactly_the_acts_that_worked_in_reverse(plan: list[tuple[str, int]]) -> None:
    """Each host fails at a step index of its own (3: at none); walking all hosts back undoes, per host, exactly
    the steps whose act worked, newest first."""
    hosts = ["h1", "h2", "h3"]
    fails_at = dict(plan)
    log: list[str] = []
    names = ["drain", "settle", "readmit"]
    steps = [logged(n, log, frozenset(h for h in hosts if fails_at.get(h, 3) == i)) for i, n in enumerate(names)]
    b = batch(*hosts)
    drive(steps, b, lambda _: None)
    log.clear()
    undo_walk(steps, b, hosts)
    for h in hosts:
        worked = names[: fails_at.get(h, 3)]
        assert [line.split()[1] for line in log if line.endswith(f" {h}")] == list(reversed(worked))

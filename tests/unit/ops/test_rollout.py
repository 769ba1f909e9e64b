"""The rollout's steps, batching, max-fail, restore, rollback and interrupts, through a fake ``Hosts`` door (no host,
no Ansible): what each step does, what a failure in each undoes and in which order, and that an interrupt
between any two steps leaves every host unlocked and back on its previous generation."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from rollout_fakes import FakeHosts, Host, slot

from knobfleet.errors import KnobfleetError
from knobfleet.fleet.hostvars import HostVars
from knobfleet.ops import interrupts
from knobfleet.ops.apply import apply
from knobfleet.ops.precheck import Options
from knobfleet.ops.steps import STEPS, Slots, read_play
from knobfleet.profiles.store import ProfileStore

NAMES = ["h1", "h2", "h3", "h4"]


@pytest.fixture
def profile(profiles_dir: Path):  # type: ignore[no-untyped-def]
    return ProfileStore(profiles_dir).resolve("ctas512")


def hostvars(names: list[str]) -> list[HostVars]:
    return [HostVars(host=h, listen_host=f"127.0.1.{i}", port=30000) for i, h in enumerate(names, start=1)]


def fleet(names: list[str], **per_host: Host) -> FakeHosts:
    return FakeHosts({h: per_host.get(h, Host()) for h in names})


def slots(log: list[str], before_fails: set[str] = frozenset(), after_fails: set[str] = frozenset()) -> Slots:  # type: ignore[assignment]
    return Slots(
        before=(slot("drain", log, set(before_fails)),),
        after=(slot("readd", log, set(after_fails)),),
    )


def test_every_host_goes_through_the_steps_in_order(profile) -> None:  # type: ignore[no-untyped-def]
    door = fleet(["h1", "h2"])
    report = apply(profile, hostvars(["h1", "h2"]), door, Options(), slots=slots(door.log))  # type: ignore[arg-type]
    assert [o.status for o in report.hosts] == ["applied", "applied"]
    assert door.log == ["drain h1", "drain h2", "play apply.yml h1,h2", "readd h1", "readd h2"]
    assert all(h.lock is None and h.current == 4 and h.status[4] == "good" for h in door.hosts.values())


@pytest.mark.parametrize(
    ("failure", "host", "log", "status"),
    [
        # a slot before the restart fails: nothing of knobfleet's changed on that host, its drain is not undone
        # (it did not happen), the other host goes on
        (
            "slot-before",
            Host(),
            ["drain h1", "drain h2", "play apply.yml h2", "readd h2"],
            {"h1": 3, "h2": 4},
        ),
        # the role refuses the host (a foreign drop-in): nothing changed, no restore; the drain is undone
        ("refused", Host(fail_at="begin"), ["drain h1", "play apply.yml h1", "undo drain h1"], {"h1": 3}),
        # install fails on the host: nothing committed, no restore; the drain is undone
        ("install", Host(fail_at="install"), ["drain h1", "play apply.yml h1", "undo drain h1"], {"h1": 3}),
        *[
            (
                step,
                Host(fail_at=step),
                ["drain h1", "play apply.yml h1", "play restore.yml h1", "probe h1", "undo drain h1"],
                {"h1": 3},
            )
            for step in ("restart", "ready", "finish")
        ],
        # the ready engine does not match the profile: restore, then undo the drain
        (
            "verify",
            Host(bad_probe=True),
            ["drain h1", "play apply.yml h1", "play restore.yml h1", "probe h1", "undo drain h1"],
            {"h1": 3},
        ),
        # the re-add fails after a good apply: back to the previous generation, then out of the router's way
        (
            "slot-after",
            Host(),
            ["drain h1", "play apply.yml h1", "readd h1", "play restore.yml h1", "probe h1", "undo drain h1"],
            {"h1": 3},
        ),
    ],
)
def test_a_failure_in_each_step_is_undone_in_reverse(profile, failure, host, log, status) -> None:  # type: ignore[no-untyped-def]
    names = ["h1", "h2"] if failure == "slot-before" else ["h1"]
    door = fleet(names, h1=host)
    hooks = slots(door.log, {"h1"} if failure == "slot-before" else set(), {"h1"} if failure == "slot-after" else set())
    report = apply(profile, hostvars(names), door, Options(max_fail_percent=100), slots=hooks)  # type: ignore[arg-type]
    assert door.log == log
    assert report.hosts[0].status == ("refused" if failure == "refused" else "failed") and report.exit_code == 1
    assert {h: door.hosts[h].current for h in names} == status
    assert all(h.lock is None for h in door.hosts.values())
    if failure not in ("slot-before", "install", "refused"):
        assert door.hosts["h1"].status[4] == "failed"  # the generation left says why
        assert report.hosts[0].restored is not None and report.hosts[0].restored.ok


def test_a_failing_pre_check_changes_nothing(profile) -> None:  # type: ignore[no-untyped-def]
    class Broken(FakeHosts):
        def quick(self, hosts):  # type: ignore[no-untyped-def]
            return True

        def probe(self, hosts, on_event=None, *, quick=False):  # type: ignore[no-untyped-def]
            raise KnobfleetError("inventory: host vars unreadable")

    door = Broken({"h1": Host()})
    with pytest.raises(KnobfleetError, match="unreadable"):
        apply(profile, hostvars(["h1"]), door, Options(), slots=slots(door.log))  # type: ignore[arg-type]
    assert door.log == [] and door.hosts["h1"] == Host()


@pytest.mark.parametrize(
    ("serial", "max_fail", "failing", "statuses"),
    [
        ("1", 0.0, {"h2"}, ["applied", "failed", "not-run", "not-run"]),
        ("1", 50.0, {"h2"}, ["applied", "failed", "applied", "applied"]),  # 1/2 is not more than 50 %
        ("1", 40.0, {"h2"}, ["applied", "failed", "not-run", "not-run"]),
        ("1", 50.0, {"h2", "h3"}, ["applied", "failed", "failed", "not-run"]),  # 2/3 > 50 %
        ("2", 50.0, {"h1"}, ["failed", "applied", "applied", "applied"]),
        ("2", 0.0, {"h4"}, ["applied", "applied", "applied", "failed"]),
        (None, 0.0, {"h1"}, ["failed", "applied", "applied", "applied"]),  # one batch: nothing left to stop
    ],
)
def test_max_fail_cuts_the_rollout_off(profile, serial, max_fail, failing, statuses) -> None:  # type: ignore[no-untyped-def]
    door = fleet(NAMES, **{h: Host(fail_at="ready") for h in failing})
    report = apply(profile, hostvars(NAMES), door, Options(serial=serial, max_fail_percent=max_fail))  # type: ignore[arg-type]
    assert [o.status for o in report.hosts] == statuses
    untouched = [h for h, s in zip(NAMES, statuses, strict=True) if s == "not-run"]
    assert all(door.hosts[h] == Host() for h in untouched)
    assert all(door.hosts[h].current == 3 for h in failing)  # restored
    assert all(h.lock is None for h in door.hosts.values())


def test_rollback_fleet_restores_earlier_batches_after_the_failing_one(profile) -> None:  # type: ignore[no-untyped-def]
    door = fleet(NAMES, h3=Host(fail_at="ready"))
    report = apply(profile, hostvars(NAMES), door, Options(serial="1", rollback_fleet=True))  # type: ignore[arg-type]
    assert [o.status for o in report.hosts] == ["rolled-back", "rolled-back", "failed", "not-run"]
    plays = [line for line in door.log if line.startswith("play")]
    # the failing host is restored first (its batch), then the earlier batches together
    assert plays == [
        "play apply.yml h1",
        "play apply.yml h2",
        "play apply.yml h3",
        "play restore.yml h3",
        "play restore.yml h1,h2",
    ]
    assert [door.hosts[h].current for h in NAMES] == [3, 3, 3, 3]
    assert door.hosts["h1"].status[4] == "rolled-back" and door.hosts["h3"].status[4] == "failed"


# the checkpoint names each step (the slots' steps by their own names: the fake drain and re-add here)
BOUNDARIES = ["drain", "install", "verify", "readd", "end"]


@pytest.mark.parametrize("at", BOUNDARIES)
def test_an_interrupt_between_two_steps_restores_and_releases(profile, at: str) -> None:  # type: ignore[no-untyped-def]
    """KeyboardInterrupt at each step boundary of the second batch: the first batch stays applied, the second
    is restored where it changed (and its slots undone), the third is not touched; every lock is free."""
    door = fleet(["h1", "h2", "h3"])
    seen: list[str] = []

    def checkpoint(step: str) -> None:
        seen.append(step)
        if step == at and len([s for s in seen if s == at]) == 2:
            raise KeyboardInterrupt

    with pytest.raises(interrupts.Interrupted) as exc:
        apply(
            profile,
            hostvars(["h1", "h2", "h3"]),
            door,
            Options(serial="1"),
            slots=slots(door.log),
            checkpoint=checkpoint,
        )  # type: ignore[arg-type]
    assert exc.value.exit_code == 130
    report = exc.value.report
    statuses = {o.host: o.status for o in report.hosts}
    assert statuses["h1"] == "applied" and statuses["h3"] == "not-run"
    assert door.hosts["h1"].current == 4
    assert door.hosts["h2"].current == 3  # never changed, or restored
    assert door.hosts["h3"] == Host()
    assert all(h.lock is None for h in door.hosts.values())
    h2 = [line for line in door.log if line.endswith("h2") or " h2," in line]
    if at == "drain":
        assert h2 == [] and statuses["h2"] == "not-run"
    elif at == "install":
        assert h2 == ["drain h2", "undo drain h2"]
    elif at in ("verify", "readd"):  # after the play: its restore, then the drain's undo
        assert h2 == ["drain h2", "play apply.yml h2", "play restore.yml h2", "probe h2", "undo drain h2"]
    else:  # after the re-add: the re-add is undone first, then the restore, then the drain
        assert h2 == [
            "drain h2",
            "play apply.yml h2",
            "readd h2",
            "undo readd h2",
            "play restore.yml h2",
            "probe h2",
            "undo drain h2",
        ]
    if at != "drain":
        assert statuses["h2"] == "failed" and "interrupted after" in report.hosts[1].message


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_the_play_waits_for_it_then_restores(profile, signum: int) -> None:  # type: ignore[no-untyped-def]
    """A real SIGINT/SIGTERM while the role runs: the play ends (the role releases the lock), then the rollout
    restores what it changed before the command exits 130."""
    door = fleet(["h1", "h2"])
    door.during_play = lambda: os.kill(os.getpid(), signum) if door.log.count("play apply.yml h1") == 1 else None
    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    with interrupts.handled(), pytest.raises(interrupts.Interrupted) as exc:
        apply(profile, hostvars(["h1", "h2"]), door, Options(serial="1"))  # type: ignore[arg-type]
    assert [line for line in door.log if line.startswith("play")] == ["play apply.yml h1", "play restore.yml h1"]
    assert door.hosts["h1"].current == 3 and door.hosts["h1"].lock is None and door.hosts["h2"] == Host()
    assert exc.value.report.hosts[0].restored.ok
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before  # handlers put back


def test_outside_a_shield_a_signal_interrupts_at_once() -> None:
    with interrupts.handled(), pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs between bytecodes
            pass
    with interrupts.handled():
        with interrupts.shielded(raise_at_end=False):
            interrupts.request()
        assert interrupts.pending()
        with pytest.raises(KeyboardInterrupt):
            interrupts.checkpoint()
        assert not interrupts.pending()


@pytest.mark.parametrize(
    ("results", "success", "steps"),
    [
        ({}, False, ["install"]),
        ({"begin": {"refused": True, "msg": "foreign drop-in"}}, False, ["install"]),
        ({"commit": {"changed": True}, "ready": {"failed": True}}, False, ["install", "restart", "ready"]),
        ({"commit": {"changed": False}, "ready": {"done": []}, "finish": {}}, True, [*STEPS[1:4], "finish"]),
    ],
)
def test_read_play_types_the_remote_steps(results, success, steps) -> None:  # type: ignore[no-untyped-def]
    got = read_play("h1", results, success)
    assert [r.step for r in got] == [s for s in steps if s != "verify"]
    assert got[-1].ok is success or not success


def test_an_interrupt_during_the_speculative_pre_check_stops_the_play_at_its_gate(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import json as _json

    from knobfleet.ops import apply_ahead

    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path))
    gate_doc: dict[str, object] = {}

    def start(gate: Path, cancel) -> object:  # type: ignore[no-untyped-def]
        while not gate.exists():  # the role waits at its gate (bounded by the pre-check, which returns at once)
            pass
        gate_doc.update(_json.loads(gate.read_text()))
        assert cancel()
        return object()

    def decide() -> dict[str, object]:
        interrupts.request()  # Ctrl-C arrives while the pre-check probes (the play is shielded meanwhile)
        return {}

    with interrupts.shielded(raise_at_end=False):
        decided, ahead = apply_ahead.run_ahead(start, "run-x", 2, decide)  # type: ignore[arg-type]
    assert gate_doc == {"abort": "knobfleet was interrupted during its pre-check; nothing was changed"}
    assert ahead is None and decided == {}
    with pytest.raises(KeyboardInterrupt):
        interrupts.checkpoint()


def test_a_plan_runs_no_slot(profile) -> None:  # type: ignore[no-untyped-def]
    door = fleet(["h1"])
    apply(profile, hostvars(["h1"]), door, Options(check=True), slots=slots(door.log))  # type: ignore[arg-type]
    assert door.log == ["play apply.yml h1"]  # the playbook in check mode; no drain, no re-add, no restore


def test_an_install_killed_on_the_host_is_reported_as_such_and_the_host_restored(profile) -> None:  # type: ignore[no-untyped-def]
    """The on-host install (one knob_generation call) is SIGKILLed after it moved `current` to a new generation:
    Ansible reports only MODULE FAILURE. It used to read as "nothing was changed" with no restore, leaving the
    untested generation current (marked 'installing') for the next restart. Now the host goes back to the generation
    the pre-check saw (the probe's: 1), breaking the dead run's lock, and the generation left becomes interrupted."""
    import json

    from rollout_fakes import CLEAN

    from knobfleet.fleet.transports.base import Outcome

    door = fleet(["h1"], h1=Host(current=1, status={1: "good"}, fail_at="killed"))
    doc = json.loads(CLEAN.read_text())  # the pre-check's probe: generation 1 is current
    door.probe = lambda hosts, on_event=None, *, quick=False: {hv.host: Outcome(hv.host, doc=doc) for hv in hosts}  # type: ignore[method-assign]
    report = apply(profile, hostvars(["h1"]), door, Options())  # type: ignore[arg-type]
    o = report.hosts[0]
    assert o.status == "failed" and o.died and o.committed and report.exit_code == 1
    assert o.message == (
        "the on-host install died before it reported (MODULE FAILURE, exit status 137: killed (SIGKILL)); what it "
        "changed is unknown, so generation 0001 is restored"
    )
    assert o.restored is not None and o.restored.ok
    h1 = door.hosts["h1"]
    assert (h1.current, h1.lock, h1.status) == (1, None, {1: "good", 2: "interrupted"})
    assert "play restore.yml h1" in door.log


@pytest.mark.parametrize(
    ("res", "died"),
    [
        ({"failed": True, "rc": 137, "msg": "MODULE FAILURE\nSee stdout/stderr"}, "exit status 137: killed (SIGKILL)"),
        ({"failed": True, "rc": -15, "msg": "MODULE FAILURE"}, "exit status -15: terminated (SIGTERM)"),
        ({"failed": True, "rc": 1, "msg": "MODULE FAILURE", "module_stderr": "Traceback"}, "exit status 1: crashed"),
        ({"failed": True, "rc": "x", "msg": "MODULE FAILURE"}, "exit status x: crashed"),
        # the module's own refusals and Ansible's argument checks are results, not a death
        ({"failed": True, "msg": "Unsupported parameters for (knob_generation) module: x"}, ""),
        ({"failed": True, "msg": "MODULE FAILURE", "failed_step": "commit"}, ""),
        ({"failed": True, "msg": "MODULE FAILURE", "steps": {}}, ""),
        ({"changed": True}, ""),
        (None, ""),
    ],
)
def test_module_died_tells_a_dead_module_from_its_own_failures(res, died) -> None:  # type: ignore[no-untyped-def]
    from knobfleet.ops.steps import module_died

    got = module_died(res)
    assert died in got and bool(got) is bool(died)
    typed = read_play("h1", {"knob_generation": res} if res is not None else {}, False)[0]
    assert typed.committed is bool(died) and typed.died == got  # type: ignore[attr-defined]


def test_a_killed_install_with_no_pre_check_probe_says_so_and_restores_nothing_it_cannot_name(profile) -> None:  # type: ignore[no-untyped-def]
    """Without a pre-check probe (a transport that answers only through the playbook), nothing names the generation
    to go back to: the host is left as it is and the message says what is known."""
    door = fleet(["h1"], h1=Host(current=1, status={1: "good"}, fail_at="killed"))
    report = apply(profile, hostvars(["h1"]), door, Options())  # type: ignore[arg-type]
    o = report.hosts[0]
    assert o.status == "failed" and o.died and not o.committed and o.restored is None
    assert o.message.endswith("killed (SIGKILL)); the pre-check saw no generation to restore: see `knobfleet drift`")
    from knobfleet.report_rollout import apply_summary

    assert "nothing was changed" not in apply_summary(report)

"""Hung streams in the canary (issue #57 item 5): the judge's rule on the probes' counts (the 5xx guardrail's
two-proportion test, canaries against the baseline), the windows' counts from the probes, and the canary use case
rolling back a side whose streams hang while every metric and status looks healthy."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest

from knobfleet.experiment.canary import RECORDED, Settings, Window, judge
from knobfleet.experiment.canary_probe import HostProbes
from knobfleet.experiment.canary_run import CanaryOptions, canary
from knobfleet.experiment.canary_windows import measure
from knobfleet.fleet.hostvars import HostVars
from tests.unit.experiment.test_canary_run import Door, FakeProm, hosts, runs_profile
from tests.unit.ops.rollout_fakes import Host

D = Settings(design="did")  # one period, the subsets compared directly: the rule alone decides


def _w(hung: Mapping[str, int], base_hung: Mapping[str, int], streams: tuple[int, int]) -> Window:
    """An identical profile's window (every metric equal on both sides) with the probes' counts."""
    canary_hosts = sorted(hung) or ["lab1"]
    return Window(
        {"tput": dict.fromkeys(canary_hosts, 100.0), "itl": dict.fromkeys(canary_hosts, 0.01)},
        {"tput": {"lab2": 100.0}, "itl": {"lab2": 0.01}},
        200,
        200,
        canary_streams=streams[0],
        baseline_streams=streams[1],
        canary_hung=dict(hung),
        baseline_hung=dict(base_hung),
    )


@pytest.mark.parametrize(
    ("hung", "base_hung", "streams", "windows", "reason"),
    [
        # half the canary's probe streams hang, none of the baseline's: 12 of 24 is far past z = 3.95
        ({"lab1": 4}, {"lab2": 0}, (8, 8), 3,
         "hung streams: 12 of 24 probe streams on the canaries (lab1 12) went 20s without a token, status 200, "
         "against 0 of 24 on the baseline"),
        # every stream hangs: one window of 8 is enough (z = 4.0)
        ({"lab1": 8}, {"lab2": 0}, (8, 8), 1,
         "hung streams: 8 of 8 probe streams on the canaries (lab1 8) went 20s without a token, status 200, "
         "against 0 of 8 on the baseline"),
        # two canary hosts: each named with its own count; one without a hang is not named
        ({"lab1": 4, "lab3": 2, "lab5": 0}, {"lab2": 0}, (16, 16), 3,
         "hung streams: 18 of 48 probe streams on the canaries (lab1 12, lab3 6) went 20s without a token, "
         "status 200, against 0 of 48 on the baseline"),
        ({"lab1": 1}, {"lab2": 0}, (8, 8), 3, None),  # 3 of 24 against 0: not significant at this look
        ({"lab1": 4}, {"lab2": 4}, (8, 8), 3, None),  # the baseline hangs as much: not the profile's doing
        ({"lab1": 0}, {"lab2": 6}, (8, 8), 3, None),  # one-sided: a hanging baseline never rolls the canary back
        ({"lab1": 0}, {"lab2": 0}, (0, 0), 3, None),  # probing off (--probes 0): nothing to judge
    ],
)  # fmt: skip
def test_the_hung_stream_rule(
    hung: dict[str, int], base_hung: dict[str, int], streams: tuple[int, int], windows: int, reason: str | None
) -> None:
    v = judge([_w(hung, base_hung, streams) for _ in range(windows)], D)
    if reason is None:
        assert not v.reason.startswith("hung streams"), v.reason
        assert v.verdict != "rollback", v.reason
    else:
        assert (v.verdict, v.reason) == ("rollback", reason)


def test_the_rule_reads_the_bound_it_was_given_and_counts_uncounted_windows() -> None:
    """The reason says the bound in force; a window with too little traffic for the metrics still counts its hung
    streams (like the 5xx guardrail's counts), so a profile that hangs its traffic away is not waved through."""
    quiet = replace(_w({"lab1": 8}, {"lab2": 0}, (8, 8)), canary_requests=3, baseline_requests=3)
    v = judge([quiet, quiet], replace(D, hang_s=3.0))
    assert v.verdict == "rollback" and "went 3s without a token" in v.reason


def test_the_settings_bound_the_probes_and_the_record_keeps_them() -> None:
    assert Settings(probes=33).check() is not None and Settings(hang_s=0).check() is not None
    assert Settings(probes=0).check() is None and Settings(probes=32, hang_s=600).check() is None
    assert {"probes", "hang_s"} <= set(RECORDED)


def _hv(name: str, last: int) -> HostVars:
    return HostVars(host=name, listen_host=f"127.0.1.{last}", port=30000, router_url="http://127.0.0.1:30080")


class _Done:
    def __init__(self, counts: dict[str, HostProbes]) -> None:
        self.counts = counts

    def result(self) -> dict[str, HostProbes]:
        return self.counts


def test_a_window_carries_each_sides_streams_and_hung_counts() -> None:
    prom = FakeProm(1.0)
    prom.on_new = lambda h: h == "h1"
    probes = _Done({"h1": HostProbes(8, 3, 1), "h2": HostProbes(8, 0, 2)})
    row, window = measure(prom, [_hv("h1", 1)], [_hv("h2", 2)], 1, 1000.0, 60.0, 0.0, probes)  # type: ignore[arg-type]
    assert window is not None
    # streams: the probes that got a stream (a failed probe got none: refused, reset, an error status)
    assert (window.canary_streams, window.baseline_streams) == (7, 6)
    assert (dict(window.canary_hung), dict(window.baseline_hung)) == ({"h1": 3}, {"h2": 0})
    assert row["probes"] == {"h1": {"sent": 8, "hung": 3, "failed": 1}, "h2": {"sent": 8, "hung": 0, "failed": 2}}
    row, window = measure(prom, [_hv("h1", 1)], [_hv("h2", 2)], 1, 1000.0, 60.0, 0.0)  # type: ignore[arg-type]
    assert window is not None and "probes" not in row and window.canary_streams == 0


def _run(profile: Any, hang: Mapping[str, int], kept: list[dict[str, Any]]) -> tuple[Any, Door, list[Sequence[str]]]:
    """A canary of h1 against h2 on identical metrics, whose probes find ``hang[host]`` of 8 streams hung on a host
    while it runs the profile."""
    hv = hosts(4)
    door = Door({h.host: Host() for h in hv})
    prom = FakeProm(1.0)
    prom.on_new = lambda h: runs_profile(door, h)
    probed: list[Sequence[str]] = []

    def prober(targets: Sequence[HostVars], s: Settings) -> _Done:
        probed.append([t.host for t in targets])
        on = {t.host: runs_profile(door, t.host) for t in targets}
        return _Done({t.host: HostProbes(s.probes, hang.get(t.host, 0) if on[t.host] else 0, 0) for t in targets})

    clock = iter(float(t) for t in range(1000, 100000, 60))
    opts = CanaryOptions(hosts=1, window_s=60, settings=Settings(hang_s=5.0), prober=prober)
    report = canary(profile, hv, door, prom, opts, sleep=lambda s: None, clock=lambda: next(clock),  # type: ignore[arg-type]
                    keep=lambda r: kept.append(json.loads(json.dumps(r.as_json()))))  # fmt: skip
    return report, door, probed


def test_a_canary_whose_streams_hang_is_rolled_back_while_its_metrics_look_the_same(profile: Any, router: Any) -> None:
    kept: list[dict[str, Any]] = []
    report, door, probed = _run(profile, {"h1": 4, "h2": 4}, kept)
    assert report.verdict.verdict == "rollback" and report.exit_code == 1
    assert report.verdict.reason.startswith("hung streams: ") and "on the canaries (h1 " in report.verdict.reason
    assert "went 5s without a token, status 200, against 0 of" in report.verdict.reason
    assert "play restore.yml h1" in door.log and report.followup.startswith("canaries rolled back")
    assert all(p == ["h1", "h2"] for p in probed)  # the canary and the baseline, every window, the pre-period too
    doc = kept[-1]
    assert doc["settings"]["probes"] == 8 and doc["settings"]["hang_s"] == 5.0
    assert doc["pre_period"][0]["probes"]["h1"] == {"sent": 8, "hung": 0, "failed": 0}
    assert doc["windows"][0]["probes"]["h1"]["hung"] == 4 and doc["windows"][0]["router"]["errors"] == 0


def test_streams_hanging_on_both_sides_alike_do_not_roll_the_canary_back(profile: Any, router: Any) -> None:
    """A profile that hangs nowhere is not rolled back for it, through the crossover's swap, with the probes running
    in every window (the pre-period's, the first period's and the second's)."""
    report, _, probed = _run(profile, {}, [])
    assert report.verdict.verdict != "rollback", report.verdict.reason
    assert len(probed) >= 3 + 6 + 3 and any(report.canary_apply and w.get("crossed") for w in report.windows)


@pytest.fixture
def profile(profiles_dir: Any) -> Any:
    from knobfleet.profiles.store import ProfileStore

    return ProfileStore(profiles_dir).resolve("ctas512")


@pytest.fixture
def router(monkeypatch: pytest.MonkeyPatch) -> Any:
    from knobfleet.fleet import router_kinds
    from tests.unit.experiment.test_canary_run import ROUTER
    from tests.unit.fleet.test_router import MemRouter

    mem = MemRouter({f"http://127.0.1.{i}:30000": True for i in range(1, 5)}, url=ROUTER)
    monkeypatch.setattr(router_kinds, "router_for", lambda kind, url: mem)
    monkeypatch.setattr(router_kinds, "engine_inflight", lambda url, engine: lambda: 0)
    return mem


def test_the_report_page_shows_each_windows_hung_streams_per_side(profile: Any, router: Any) -> None:
    from knobfleet.experiment import html

    kept: list[dict[str, Any]] = []
    _run(profile, {"h1": 4}, kept)
    rec = {"schema_version": 1, "kind": "canary", **kept[-1]}
    judged = [d for d in html.window_differences(rec) if not d["pre"]]
    assert judged and all(d["hung"] == "4/8 · 0/8" for d in judged)  # new (h1), then current (h2)
    page = html.render(rec)
    assert "hung streams (new · current)" in page and "<td>4/8 · 0/8</td>" in page and ">probes<" in page
    assert "<td>hang_s</td><td>5.0</td>" in page.replace("<td class=l>", "<td>")
    assert (
        html.window_differences({"windows": [{"probes": {"h1": {"hung": "x"}}}], "canaries": ["h1"]})[0]["hung"]
        == "0/0 · 0/0"
    )  # a hand-edited record's odd value is not a number: not counted


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--probes", "33"], "argument --probes: 33: must be 0..32"),
        (["--probes", "-1"], "argument --probes: -1: must be 0..32"),
        (["--hang", "0s"], "argument --hang: '0s': expected a positive duration"),
    ],
)
def test_the_canary_refuses_probe_options_that_cannot_work_while_parsing(
    capsys: pytest.CaptureFixture[str], option: list[str], message: str
) -> None:
    from knobfleet import cli

    with pytest.raises(SystemExit) as exc:
        cli.run(["canary", "ctas512", *option, "--yes"])
    assert exc.value.code == 64 and message in capsys.readouterr().err


def test_a_hang_bound_past_ten_minutes_is_one_line() -> None:
    import argparse

    from knobfleet.cli.telemetry import _canary_settings
    from knobfleet.errors import UsageError

    args = argparse.Namespace(max_regression=0.05, max_windows=16, min_windows=3, pre_windows=3, window=60.0,
                              design="crossover", swap_after=6, probes=8, hang=601.0, warmup_windows=2,
                              warmup_tol=0.05)  # fmt: skip
    with pytest.raises(UsageError, match=r"^canary: probes 8, hang bound 601s: choose 0\.\.32 probes per host"):
        _canary_settings(args)
    assert _canary_settings(argparse.Namespace(**{**vars(args), "hang": 3.0})).hang_s == 3.0

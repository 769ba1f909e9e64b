"""The self-contained HTML report: a real canary record (the fake fleet of test_canary_run) and an A/B report
rendered to pages that load nothing from any URL, hold a plot element per window / bucket / round, and say the
decision; ``knobfleet report`` and ``--report`` refuse a path that is a folder, FIFO, device or symlink (made in
the test's own temp dir) before anything runs; a corrupt or newer record is one line."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from knobfleet.experiment import html, html_ab
from tests.unit.experiment import test_canary_run as fleet
from tests.unit.experiment.test_canary_run import FakeProm, run

profile, router = fleet.profile, fleet.router  # the fake fleet's fixtures

URL = re.compile(r"""(?:src|href|xlink:href|action|poster|data)\s*=\s*["'](?!#)""", re.I)


def assert_self_contained(page: str) -> None:
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<script" not in page.lower() and "<link" not in page.lower() and "@import" not in page
    assert not URL.search(page), URL.search(page)
    assert "url(" not in page.replace("url(#", "")  # CSS and SVG paint servers may only point inside the page
    # the SVG namespace names are identifiers, not fetched; nothing else may name a network address
    rest = page.replace("http://www.w3.org/2000/svg", "").replace("http://www.w3.org/1999/xlink", "")
    assert "http://" not in rest and "https://" not in rest and "//" not in re.sub(r"<[^>]*>", "", rest).replace(
        "://", "")  # fmt: skip


def canary_record(profile: Any, ratio: float) -> dict[str, Any]:
    kept: list[dict[str, Any]] = []
    run(profile, FakeProm(ratio), kept=kept)
    return {"schema_version": 1, "kind": "canary", **kept[-1]}


@pytest.mark.parametrize(("ratio", "verdict"), [(0.55, "rollback"), (1.0, "promote")])
def test_a_canary_page_says_the_decision_and_plots_every_window(
    profile: Any, router: Any, ratio: float, verdict: str
) -> None:
    rec = canary_record(profile, ratio)
    assert rec["verdict"] == verdict
    page = html.render(rec)
    assert_self_contained(page)
    assert f'class="decision {verdict}"' in page and "Canary of ctas512 on h1 against h2" in page
    diffs = html.window_differences(rec)
    judged = [d for d in diffs if not d["pre"]]
    assert len(diffs) == len(rec["pre_period"]) + len(rec["windows"]) and judged
    if ratio == 0.55:
        assert all(abs(d["tput"] - (-0.45)) < 0.02 for d in judged)  # the canary's 45% loss, window by window
        # the running estimate the page plots, from the second window: the first is held until the next agrees
        # with it (canary_warm), so no estimate exists after it alone
        assert not judged[0]["interval"] and rec["windows"][0]["warmup"].startswith("counted")
        assert all("tput" in d["interval"] for d in judged[1:])
    assert "Warm-up after the restarts:\n0 window(s) and 0 requests set aside." in page
    svg = page[page.index("<svg") : page.index("</svg>")]
    markers = len(re.findall(r"<use ", svg))  # matplotlib draws each data point as a <use> of one marker
    assert markers >= 2 * len([d for d in diffs if d["tput"] is not None])  # tput and itl, a point per window
    assert page.count("<tr>") >= len(diffs) + 1  # the raw table has every window


def test_a_crossover_page_shows_the_new_profile_against_the_current_on_both_sides_of_the_swap(
    profile: Any, router: Any
) -> None:
    """After the swap the baseline runs the new profile: each window's difference is still new vs current, so a
    profile 10% faster reads +10% before and after the swap, and the page marks the second period."""
    rec = canary_record(profile, 1.1)
    assert rec["verdict"] == "promote"
    judged = [d for d in html.window_differences(rec) if not d["pre"]]
    assert [d["crossed"] for d in judged] == [False] * 6 + [True] * (len(judged) - 6)
    assert all(abs(d["tput"] - 0.10) < 0.02 for d in judged)
    page = html.render(rec)
    assert page.count("<td class=l>after swap</td>") == len(judged) - 6  # the raw table names the period


def ab_doc() -> dict[str, Any]:
    runs = {48: ([100.0, 101.0, 99.0, 100.5], [104.0, 105.0, 103.5, 104.5]), 64: ([120.0, 119.0, 121.0, 120.5],
            [125.0, 124.0, 126.5, 125.5])}  # fmt: skip
    return {
        "a": "default@1", "b": "ctas512@2", "host": "lab1", "verdict": "promote", "winner": "B", "rounds": 4,
        "reason": "B is faster in every bucket", "weighted_gain": {"estimate": 0.042, "low": 0.031, "high": 0.053},
        "buckets": [{"concurrency": c, "weight": 0.5, "a_mean": sum(a) / 4, "b_mean": sum(b) / 4, "ratio": 0.04,
                     "low": 0.03, "high": 0.05, "class": "faster", "runs": {"A": a, "B": b}}
                    for c, (a, b) in runs.items()],
        "settings": {"weights": {"48": 0.5, "64": 0.5}, "min_effect": 0.01, "max_regression": 0.03, "max_rounds": 15,
                     "min_rounds": 3, "alpha": 0.05, "futility": 0.05},
    }  # fmt: skip


def test_an_ab_page_plots_each_bucket_and_the_estimate_round_by_round() -> None:
    doc = ab_doc()
    page = html.render(doc)
    assert_self_contained(page)
    assert 'class="decision promote"' in page and "A/B of default@1 (A) and ctas512@2 (B) on lab1: promote" in page
    seq = html_ab.sequential(doc)
    assert [p["round"] for p in seq] == [1, 2, 3, 4]
    assert 0.03 < seq[-1]["estimate"] < 0.06 and seq[-1]["low"] < seq[-1]["estimate"] < seq[-1]["high"]
    assert page.count("<svg") == 2  # the buckets, and the rounds


def test_a_record_that_is_neither_kind_or_incomplete_is_one_line() -> None:
    from knobfleet.errors import KnobfleetError

    with pytest.raises(KnobfleetError, match=r"^r\.json: neither a canary record nor an A/B report"):
        html.render({"kind": "kernel"}, "r.json")
    with pytest.raises(KnobfleetError, match=r"^r\.json: not a complete record \(KeyError"):
        html.render({"a": "x", "b": "y", "buckets": [{"concurrency": 1}]}, "r.json")


def cli(*argv: str) -> tuple[int, str, str]:
    import contextlib
    import io

    from knobfleet.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def test_knobfleet_report_renders_a_stored_record_and_refuses_hostile_outputs(tmp_path: Path) -> None:
    record = tmp_path / "ab.json"
    record.write_text(json.dumps(ab_doc()))
    code, out, _ = cli("report", str(record))
    assert code == 0 and (tmp_path / "ab.html").read_text().startswith("<!DOCTYPE html>"), out
    fifo, folder, link = tmp_path / "fifo.html", tmp_path / "dir.html", tmp_path / "link.html"
    os.mkfifo(fifo)
    folder.mkdir()
    link.symlink_to(tmp_path / "elsewhere.html")
    for bad, what in ((fifo, "a FIFO"), (folder, "a directory"), (link, "a symlink")):
        code, _, err = cli("report", str(record), "--out", str(bad))
        assert code == 64 and what in err and len(err.strip().splitlines()) == 1, (bad, err)
    assert not (tmp_path / "elsewhere.html").exists() and fifo.is_fifo()  # nothing followed, nothing replaced
    code, _, err = cli("report", str(record), "--out", str(tmp_path / "page.txt"))
    assert code == 64 and "name an .html file" in err


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("{not json", "not a knobfleet record"),
        (json.dumps({"schema_version": 99, "kind": "canary"}), "record schema 99 is newer than this knobfleet reads"),
        (json.dumps([1, 2]), "not a knobfleet record"),
    ],
)
def test_a_corrupt_or_newer_record_is_one_line(tmp_path: Path, body: str, error: str) -> None:
    record = tmp_path / "r.json"
    record.write_text(body)
    code, _, err = cli("report", str(record))
    assert code != 0 and error in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_record_that_is_a_fifo_is_refused_without_reading_it(tmp_path: Path) -> None:
    fifo = tmp_path / "r.json"
    os.mkfifo(fifo)
    code, _, err = cli("report", str(fifo))  # a FIFO never opened: this would block forever otherwise
    assert code != 0 and "FIFO" in err


def test_canary_report_is_checked_before_anything_runs(tmp_path: Path) -> None:
    folder = tmp_path / "out.html"
    folder.mkdir()
    code, _, err = cli("canary", "ctas512", "--report", str(folder), "--yes")
    assert code == 64 and "a directory" in err


def test_canary_prom_is_checked_before_anything_runs(tmp_path: Path) -> None:
    fifo = tmp_path / "canary.prom"
    os.mkfifo(fifo)
    code, _, err = cli("canary", "ctas512", "--prom", str(fifo), "--yes")
    assert code == 64 and "FIFO" in err and len(err.strip().splitlines()) == 1


def fleet_doc() -> dict[str, Any]:
    from knobfleet.live.verify import Finding, HostVerdict, summary
    from knobfleet.module_utils.knob_rules import Kind

    hosts = [
        HostVerdict("lab1", "in_sync", "ctas512", 2, "sha256:" + "a" * 64, 3, engine_version="0.5.23"),
        HostVerdict("lab2", "drift", "ctas512", 2, "sha256:" + "a" * 64, 3, engine_version="0.5.22",
                    findings=[Finding(Kind.ENV_MISMATCH, "SGLANG_X is 768, the profile says 512", name="SGLANG_X")]),
        HostVerdict("lab3", "in_sync", "default", 1, "sha256:" + "b" * 64, 1, engine_version="0.5.23"),
        HostVerdict("lab4", "unreachable", error="ssh: connection refused"),
    ]  # fmt: skip
    return {"hosts": [h.as_json() for h in hosts], "summary": summary(hosts)}


def test_the_fleet_page_shows_each_host_its_findings_and_the_profile_spread() -> None:
    page = html.fleet_page(fleet_doc(), "drift: inventories/lab")
    assert_self_contained(page)
    assert "4 hosts: 2 in sync, 1 drifted, 1 unreachable, 0 error; 2 profile(s), engine version skew." in page
    assert 'class="decision rollback"' in page and "SGLANG_X is 768, the profile says 512" in page
    assert page.count("<svg") == 1 and "ssh: connection refused" in page
    for host in ("lab1", "lab2", "lab3", "lab4"):
        assert f"<td class=l>{host}</td>" in page


def test_drift_report_is_refused_at_a_hostile_path_before_any_host_is_read(tmp_path: Path) -> None:
    fifo = tmp_path / "fleet.html"
    os.mkfifo(fifo)
    code, _, err = cli("drift", "-i", str(tmp_path / "no-such-inventory"), "--report", str(fifo))
    assert code == 64 and "FIFO" in err and fifo.is_fifo()


def bench_doc() -> dict[str, Any]:
    return {"kind": "bench", "host": "lab1", "profile": "ctas512@2", "repeats": 3, "errors": 0, "tool": "knobfleet",
            "engine_version": "0.5.23", "generations": {"lab1": 4}, "buckets": [
                {"concurrency": 48, "mean": 5000.0, "low": 4900.0, "high": 5100.0, "runs": [4950.0, 5000.0, 5050.0]},
                {"concurrency": 64, "mean": 6000.0, "low": None, "high": None, "runs": [6000.0]}]}  # fmt: skip


def test_a_bench_page_plots_each_bucket_with_its_interval() -> None:
    page = html.render(bench_doc())
    assert_self_contained(page)
    assert "bench of ctas512@2, generation 0004 on lab1: 2 bucket(s), 3 run(s) each, 0 request error(s)" in page
    assert "4900.0 to 5100.0" in page and page.count("<svg") == 1

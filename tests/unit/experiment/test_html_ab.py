"""The A/B page's content, number by number: each bucket's latency of A and B with its interval where the document
keeps per-run latency (and a plain note where it does not); the futility bound round by round, the same rule as
``design.decide`` (at the bound, B's chance of promotion is exactly the futility threshold, and the rule keeps A
from the first round the estimate falls below it); what ran (content hashes, engine version)."""

from __future__ import annotations

import math
import re
from typing import Any

from knobfleet.experiment import design, html, html_ab, html_core, stats
from knobfleet.experiment.html_core import mean_interval
from tests.unit.experiment.test_html import ab_doc, assert_self_contained

ITL = {48: ([0.040, 0.042, 0.041, 0.043], [0.036, 0.037, 0.035, 0.036]),
       64: ([0.050, 0.052, 0.051, 0.049], [0.045, 0.046, 0.044, 0.045])}  # fmt: skip
TTFT = {48: ([0.20, 0.22, 0.21, 0.19], [0.18, 0.19, 0.18, 0.17]), 64: ([0.30, 0.31, 0.29, 0.30], [0.27, 0.26, 0.28,
        0.27])}  # fmt: skip


def ab_doc_with_latency() -> dict[str, Any]:
    doc = ab_doc()
    for b in doc["buckets"]:
        c = b["concurrency"]
        b["latency"] = {arm: {"itl": ITL[c][i], "ttft": TTFT[c][i]} for i, arm in enumerate(("A", "B"))}
    return doc


def svgs(page: str) -> list[str]:
    return re.findall(r"<svg.*?</svg>", page, flags=re.S)


def markers(page: str, gid: str) -> int:
    """The data points of one plotted line: matplotlib draws each as a <use> of the line's marker, inside the line's
    own group (the page names its lines: ``ab-KEY-ARM``, ``ab-rounds-estimate``, ``ab-rounds-futility``)."""
    if f'<g id="{gid}">' not in page:
        return 0
    group = page.split(f'<g id="{gid}">', 1)[1].split('<g id="', 1)[0]
    return len(re.findall(r'<use xlink:href="#m', group))


def test_latency_of_a_and_b_is_plotted_per_bucket_with_its_interval_next_to_throughput() -> None:
    doc = ab_doc_with_latency()
    page = html.render(doc)
    assert_self_contained(page)
    plots = svgs(page)
    assert len(plots) == 4  # throughput, ITL, TTFT (no end-to-end in this document), the rounds
    head = page.index("Throughput per bucket") < page.index("Latency per bucket") < page.index("sequential estimate")
    assert head
    # each latency plot: a point per bucket per arm, with its two interval caps
    for key in ("tput", "itl", "ttft"):  # a point per bucket per arm (each with its interval's bar and caps)
        assert markers(page, f"ab-{key}-A") == markers(page, f"ab-{key}-B") == 2
    assert markers(page, "ab-e2e-A") == 0
    # the raw latency table: every run's median in ms, A and B
    assert "<td class=l>itl</td><td>48</td><td>40.0 42.0 41.0 43.0</td><td>36.0 37.0 35.0 36.0</td>" in page
    assert "<td class=l>ttft</td><td>64</td><td>300.0 310.0 290.0 300.0</td><td>270.0 260.0 280.0 270.0</td>" in page
    # the interval drawn is the Student-t 95% interval of the runs (t(0.975, 3) = 3.182)
    mean, half = mean_interval(ITL[48][0])
    sd = math.sqrt(sum((v - 0.0415) ** 2 for v in ITL[48][0]) / 3)
    assert math.isclose(mean, 0.0415) and math.isclose(half, 3.182 * sd / 2)
    assert html_ab.latency_runs(doc["buckets"][0], "B", "itl") == ITL[48][1]
    assert html_ab.latency_runs(doc["buckets"][0], "B", "e2e") == []


def test_an_ab_document_without_latency_says_so_and_keeps_its_two_plots() -> None:
    page = html.render(ab_doc())
    assert "This document keeps throughput only: each run's latency (ITL, TTFT, end-to-end)" in page
    assert len(svgs(page)) == 2


def futile_doc(futility: float = 0.05) -> dict[str, Any]:
    """B is 0.4% slower, round after round, with about 1% noise: no promotion is ever in reach."""
    noise = [0.011, -0.009, 0.013, -0.004, -0.012, 0.002, -0.026, 0.009]
    a = [100.0 + i for i in range(8)]
    b = [x * (1 - 0.004 + e) for x, e in zip(a, noise, strict=True)]
    doc = ab_doc()
    doc["buckets"] = [dict(doc["buckets"][0], runs={"A": a, "B": b})]
    doc["settings"] = dict(doc["settings"], weights={"48": 1.0}, futility=futility)
    doc["verdict"] = "keep"
    return doc


def test_the_futility_bound_is_the_rule_that_decide_applies_round_by_round() -> None:
    doc = futile_doc()
    seq = html_ab.sequential(doc)
    s = design.Settings(weights={48: 1.0}, futility=0.05)
    per = [stats.log_ratio(x, y) for x, y in zip(doc["buckets"][0]["runs"]["A"], doc["buckets"][0]["runs"]["B"],
                                                   strict=True)]  # fmt: skip
    assert [p["futility"] is None for p in seq][:2] == [True, True]  # before min_rounds the rule does not look
    first_keep = None
    for p in seq:
        r = p["round"]
        d = design.decide({48: per[:r]}, s)
        assert p["verdict"] == d.verdict and math.isclose(p["chance"], d.promote_chance or 0.0)
        if p["futility"] is None:
            continue
        # at the bound, B's predictive chance of promotion is exactly the futility threshold
        g = d.gain
        assert g is not None
        at = stats.Interval(math.log1p(p["futility"]), g.low, g.high, g.n, g.sigma)
        assert math.isclose(design.promotion_chance(at, s), 0.05, rel_tol=1e-6)
        # and the rule keeps A for futility exactly when the estimate is below it (nothing else ends this one)
        below = p["estimate"] < p["futility"]
        assert below == (d.verdict == "keep" and "cannot reach promotion" in d.reason)
        if below and first_keep is None:
            first_keep = r
    assert first_keep is not None and 3 <= first_keep < 8
    page = html.render(doc)
    # a point per round, and a futility bound per round the rule looked at it
    assert markers(page, "ab-rounds-estimate") == len(seq) == 8
    assert markers(page, "ab-rounds-futility") == sum(p["futility"] is not None for p in seq) == 6
    row = next(p for p in seq if p["round"] == first_keep)
    assert f"<td class=l>{first_keep}</td><td>{html_core.pct(row['estimate'])}</td>" in page
    assert f"<td>{html_core.pct(row['futility'])}</td><td>{row['chance']:.1%}</td><td>keep</td></tr>" in page


def test_with_the_futility_stop_off_no_bound_is_drawn() -> None:
    doc = futile_doc(futility=0.0)
    seq = html_ab.sequential(doc)
    assert all(p["futility"] is None for p in seq)
    page = html.render(doc)
    assert "The futility bound (turned off: futility 0)" in page
    assert markers(page, "ab-rounds-estimate") == len(seq) and markers(page, "ab-rounds-futility") == 0


def test_what_ran_shows_each_profiles_content_hash_and_the_engine_version() -> None:
    doc = ab_doc() | {"profile_hashes": {"default@1": "sha256:" + "d" * 64}, "engine_version": "0.5.23"}
    doc["locked_hashes"] = {"ctas512@2": "sha256:" + "c" * 64}
    page = html.render(doc)
    assert (
        "<td class=l>A: default@1</td><td class=l>sha256:" + "d" * 64 + "</td><td class=l>recorded by the run" in page
    )
    assert (
        "<td class=l>B: ctas512@2</td><td class=l>sha256:" + "c" * 64 + "</td><td class=l>profiles/profiles.lock"
        in page
    )
    assert "<td class=l>engine</td><td class=l>0.5.23</td><td class=l>reported by the engine</td>" in page
    bare = html.render(ab_doc())
    assert "<td class=l>A: default@1</td><td class=l>-</td><td class=l>not recorded by the run</td>" in bare
    assert (
        "<td class=l>engine</td><td class=l>-</td><td class=l>not recorded: the engine reported no version when the "
        "run ended</td>" in bare
    )
    assert "<td class=l>generation</td><td class=l>-</td><td class=l>not recorded by this record</td>" in bare
    lab1 = html.render(ab_doc() | {"generations": {"lab1": 7}, "engine_versions": {"lab1": "0.5.23"}})
    assert "<td class=l>generation on lab1</td><td class=l>0007</td><td class=l>read from the host" in lab1
    assert "<td class=l>engine on lab1</td><td class=l>0.5.23</td>" in lab1


def test_a_record_of_1500_rounds_replays_a_bounded_number_and_says_so() -> None:
    """Issue 56: the replay's work grows with the square of the rounds; 1,500 recorded rounds took minutes."""
    n = 1500
    a = [100.0 + (i % 7) * 0.3 for i in range(n)]
    b = [x * 1.001 for x in a]
    doc = ab_doc()
    doc["buckets"] = [dict(doc["buckets"][0], runs={"A": a, "B": b})]
    doc["settings"] = dict(doc["settings"], weights={"48": 1.0}, max_rounds=n)
    seq = html_ab.sequential(doc)
    assert len(seq) <= html_ab.MAX_REPLAYED_ROUNDS and seq[-1]["round"] <= html_ab.MAX_REPLAYED_ROUNDS
    page = html.render(doc)
    assert f"The record holds {n} rounds; the replay below stops at round {html_ab.MAX_REPLAYED_ROUNDS}" in page

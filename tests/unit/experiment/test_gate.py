"""The decision of ``apply --gate`` (experiment/gate.judge), as pure logic: the new profile's benchmark runs
against the baseline's — request errors fail it, any bucket slower than the regression limit rejects it."""

from __future__ import annotations

from typing import Any

import pytest

from knobfleet.experiment.gate import judge


def run(tok_s: dict[int, float], errors: dict[int, int] | None = None) -> dict[str, Any]:
    """One benchmark result document, shaped like bench.run's (one bucket per concurrency)."""
    return {
        "buckets": [
            {"concurrency": c, "agg_tok_s": v, "errors": (errors or {}).get(c, 0)} for c, v in sorted(tok_s.items())
        ]
    }


BASE = [run({48: 1000.0, 64: 2000.0}), run({48: 1000.0, 64: 2000.0})]


def test_within_the_limit_passes_listing_every_bucket() -> None:
    new = [run({48: 1010.0, 64: 1960.0})]
    passed, reason, ratios = judge(BASE, new, 0.05, "ctas512@1", "stored")
    assert passed
    assert ratios == {48: pytest.approx(0.01), 64: pytest.approx(-0.02)}
    assert reason == "consistent, no request errors, every bucket within 5% of ctas512@1 (C48 +1.0%, C64 -2.0%)"


def test_a_bucket_beyond_the_limit_is_rejected_naming_the_worst_one() -> None:
    new = [run({48: 960.0, 64: 1800.0})]  # -4% and -10%
    passed, reason, ratios = judge(BASE, new, 0.05, "ctas512@1", "measured")
    assert not passed
    assert ratios == {48: pytest.approx(-0.04), 64: pytest.approx(-0.10)}
    assert reason == (
        "throughput at concurrency 64 is -10.0% vs ctas512@1 (measured results), beyond the 5% regression limit"
    )


def test_exactly_at_the_limit_passes() -> None:
    new = [run({48: 937.5, 64: 2000.0})]  # -6.25%, exact in binary
    assert judge(BASE, new, 0.0625, "b@1", "stored")[0] is True
    assert judge(BASE, [run({48: 937.0, 64: 2000.0})], 0.0625, "b@1", "stored")[0] is False


def test_one_regressing_bucket_among_gaining_ones_is_rejected() -> None:
    base = [run({48: 1000.0, 64: 1000.0, 80: 1000.0, 96: 1000.0})]
    new = [run({48: 1200.0, 64: 1200.0, 80: 1200.0, 96: 900.0})]
    passed, reason, _ = judge(base, new, 0.05, "b@1", "stored")
    assert not passed and "concurrency 96 is -10.0%" in reason


def test_means_over_the_repeats_are_compared() -> None:
    new = [run({48: 900.0, 64: 2000.0}), run({48: 1100.0, 64: 2000.0})]
    passed, _, ratios = judge(BASE, new, 0.05, "b@1", "stored")
    assert passed and ratios == {48: pytest.approx(0.0), 64: pytest.approx(0.0)}
    # a slow repeat of the baseline makes the new profile look better by the same mean
    base = [run({48: 800.0, 64: 2000.0}), run({48: 1200.0, 64: 2000.0})]
    assert judge(base, [run({48: 900.0, 64: 2000.0})], 0.05, "b@1", "stored")[2][48] == pytest.approx(-0.1)


def test_request_errors_fail_the_gate_whatever_the_throughput() -> None:
    new = [run({48: 2000.0, 64: 4000.0}, errors={48: 2}), run({48: 2000.0, 64: 4000.0}, errors={64: 1})]
    assert judge(BASE, new, 0.05, "b@1", "stored") == (False, "3 requests failed during the benchmark", {})


def test_buckets_the_baseline_lacks_are_not_compared() -> None:
    new = [run({48: 1000.0, 64: 2000.0, 128: 10.0})]
    passed, _, ratios = judge(BASE, new, 0.05, "b@1", "stored")
    assert passed and set(ratios) == {48, 64}
    zero = [run({48: 0.0, 64: 2000.0})]
    assert set(judge(zero, new, 0.05, "b@1", "stored")[2]) == {64}


def test_nothing_to_compare_is_a_rejection_not_a_crash() -> None:
    passed, reason, _ = judge([run({48: 0.0})], [run({48: 1000.0})], 0.05, "b@1", "stored")
    assert not passed and reason

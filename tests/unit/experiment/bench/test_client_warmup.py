"""bench client's warm-up until the engine has converged: the rule (pure) and the loop against a target whose
ITL and TTFT improve over its first requests, as a restarted engine's do."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import pytest

from knobfleet.experiment.bench import client

CASES = [
    # (case, chunks of (median ITL, median TTFT), tol, warmed)
    ("one chunk is never enough", [(0.010, 0.1)], 0.05, False),
    ("still 10% faster chunk over chunk", [(0.011, 0.1), (0.0099, 0.1)], 0.05, False),
    ("TTFT still improving", [(0.010, 0.13), (0.010, 0.10)], 0.05, False),
    ("within the tolerance", [(0.0102, 0.101), (0.0100, 0.100)], 0.05, True),
    ("worse than before ends it too", [(0.010, 0.1), (0.012, 0.12)], 0.05, True),
    ("a chunk with no figure does not hold it", [(None, None), (0.010, 0.1)], 0.05, True),
]


@pytest.mark.parametrize(("case", "chunks", "tol", "expected"), CASES)
def test_warmed(case: str, chunks: list[tuple[float | None, float | None]], tol: float, expected: bool) -> None:
    assert client.warmed(chunks, tol) is expected, case


class Warming:
    """A target whose requests get faster over the first ~``n`` served: the published shape (TTFT +27%, ITL +7%
    at the start, decaying as exp(-served / (n / 3)))."""

    def __init__(self, n: int) -> None:
        self.n, self.served, self.lock = n, 0, threading.Lock()

    def complete(self, prompt: str, max_tokens: int, deadline: float) -> dict[str, Any]:
        with self.lock:
            k = self.served
            self.served += 1
        p = math.exp(-k / (self.n / 3))
        return {"error": None, "tokens": max_tokens, "latency": 0.1, "ttft": 0.05 * (1 + 0.27 * p),
                "itl": 0.01 * (1 + 0.07 * p), "texts": [], "finish_reason": "length"}  # fmt: skip


def test_a_warming_engine_is_warmed_up_until_it_converges_within_the_bound() -> None:
    t = Warming(30)
    w = client.warm_up(t, 8, 8, 128, 0.03, seed=0, max_tokens=4, deadline=time.time() + 30)  # type: ignore[arg-type]
    assert w["converged"] is True and w["requests"] == 64 == t.served, w  # chunks of 8, 8, 16, 32
    assert len(w["itl_p50"]) == len(w["ttft_p50"]) == 4


def test_the_published_shape_takes_the_whole_bound() -> None:
    """Converged after ~90 requests (TTFT +27% at the start): 128, vLLM's CI's own figure, and not converged by
    the rule's measure at that bound, which the record says."""
    t = Warming(90)
    w = client.warm_up(t, 8, 8, 128, 0.03, seed=0, max_tokens=4, deadline=time.time() + 30)  # type: ignore[arg-type]
    assert w["requests"] == 128 and w["converged"] is False, w


def test_the_bound_holds_when_it_never_converges() -> None:
    class Faster(Warming):  # 3% faster every 8 requests, for ever
        def complete(self, prompt: str, max_tokens: int, deadline: float) -> dict[str, Any]:
            out = super().complete(prompt, max_tokens, deadline)
            out["itl"] = 0.01 * 0.97 ** (self.served / 8)
            return out

    t = Faster(1)
    w = client.warm_up(t, 8, 8, 40, 0.01, seed=0, max_tokens=4, deadline=time.time() + 30)  # type: ignore[arg-type]
    assert w["requests"] == 40 == t.served and w["converged"] is False, w


def test_without_a_bound_above_the_fixed_warm_up_it_is_the_fixed_warm_up() -> None:
    t = Warming(90)
    w = client.warm_up(t, 8, 8, 0, 0.05, seed=0, max_tokens=4, deadline=time.time() + 30)  # type: ignore[arg-type]
    assert w["requests"] == 8 and w["converged"] is None


def test_a_warm_engine_is_done_after_two_chunks() -> None:
    t = Warming(1)  # converged after its first request
    w = client.warm_up(t, 8, 8, 128, 0.03, seed=0, max_tokens=4, deadline=time.time() + 30)  # type: ignore[arg-type]
    assert w["requests"] == 16 and w["converged"] is True

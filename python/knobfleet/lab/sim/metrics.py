"""The stand-in's Prometheus metrics, under SGLang's names, types and bucket boundaries (SGLang's
``TokenizerMetricsCollector`` / ``SchedulerMetricsCollector`` defaults), so the queries, recording rules and canary
judgements written against the lab work unchanged against SGLang.

Every value is recorded from what the engine did: a request's first token, each later token, its end. Nothing is
computed from the model for the report. Standard library only (the stand-in runs on the lab hosts' python3).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)
ITL_BUCKETS = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100, 0.200,
    0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
)  # fmt: skip


def _num(v: float) -> str:
    """Prometheus's float text: integers without a fraction, others with repr's precision."""
    if v == int(v) and abs(v) < 1e15:
        return f"{int(v)}.0"
    return repr(float(v))


def _le(bound: float) -> str:
    return repr(float(bound)) if bound != int(bound) else f"{int(bound)}.0"


class Histogram:
    """A cumulative histogram: ``observe`` adds to the first bucket whose bound holds the value."""

    def __init__(self, name: str, doc: str, buckets: Sequence[float]) -> None:
        if list(buckets) != sorted(set(buckets)):
            raise ValueError(f"{name}: bucket bounds must increase")
        self.name, self.doc, self.bounds = name, doc, tuple(float(b) for b in buckets)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float, n: int = 1) -> None:
        """``n`` observations of ``value`` (SGLang observes a multi-token step's interval once per token)."""
        i = next((k for k, b in enumerate(self.bounds) if value <= b), len(self.bounds))
        with self._lock:
            self.counts[i] += n
            self.sum += value * n

    def lines(self, labels: str) -> list[str]:
        with self._lock:
            counts, total = list(self.counts), self.sum
        sep = "," if labels else ""
        out = [f"# HELP {self.name} {self.doc}", f"# TYPE {self.name} histogram"]
        running = 0
        for bound, c in zip((*self.bounds, float("inf")), counts, strict=True):
            running += c
            le = "+Inf" if bound == float("inf") else _le(bound)
            out.append(f'{self.name}_bucket{{{labels}{sep}le="{le}"}} {_num(running)}')
        out.append(f"{self.name}_sum{{{labels}}} {_num(total)}")
        out.append(f"{self.name}_count{{{labels}}} {_num(running)}")
        return out


def process_start_time() -> float:
    """This process's start (Unix seconds), as prometheus_client's process collector reports it: what tells a
    window that spans a restart (counters reset there) from one that does not."""
    import os

    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat", encoding="ascii") as fh:
            btime = next(int(line.split()[1]) for line in fh if line.startswith("btime "))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        import time

        return time.time()


class Metrics:
    """What the stand-in records while it serves; ``exposition`` renders it with the engine's gauges."""

    def __init__(self) -> None:
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS
        )
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", E2E_BUCKETS
        )
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.requests = 0
        self.started = process_start_time()
        self._lock = threading.Lock()

    def request_started(self, prompt_tokens: int) -> None:
        with self._lock:
            self.prompt_tokens += prompt_tokens

    def token(self, since_previous_s: float, first: bool) -> None:
        """One generated token: its time since the request arrived (first) or since its previous token."""
        (self.ttft if first else self.itl).observe(since_previous_s)
        with self._lock:
            self.generation_tokens += 1

    def request_finished(self, e2e_s: float) -> None:
        self.e2e.observe(e2e_s)
        with self._lock:
            self.requests += 1

    def exposition(self, model_name: str, running: int, queued: int, gen_throughput: float, token_usage: float) -> str:
        labels = 'model_name="{}"'.format(model_name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n"))
        with self._lock:
            prompt, generated, requests = self.prompt_tokens, self.generation_tokens, self.requests

        def metric(name: str, kind: str, doc: str, value: float) -> list[str]:
            return [f"# HELP {name} {doc}", f"# TYPE {name} {kind}", f"{name}{{{labels}}} {_num(value)}"]

        out = [
            *metric("sglang:num_running_reqs", "gauge", "The number of running requests.", running),
            *metric("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", queued),
            *metric("sglang:gen_throughput", "gauge", "The generation throughput (token/s).", gen_throughput),
            *metric("sglang:token_usage", "gauge", "The token usage.", token_usage),
            *metric("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.", prompt),
            *metric("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.", generated),
            *metric("sglang:num_requests_total", "counter", "Number of requests processed.", requests),
            "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.",
            "# TYPE process_start_time_seconds gauge",
            f"process_start_time_seconds {self.started:.2f}",
            *self.ttft.lines(labels),
            *self.itl.lines(labels),
            *self.e2e.lines(labels),
        ]
        return "\n".join(out) + "\n"

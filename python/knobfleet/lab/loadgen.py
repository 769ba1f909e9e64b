"""A bounded load generator for the lab: constant-rate OpenAI completions through a router, every outcome kept.

Loopback only (a URL outside 127.0.0.0/8 is refused), and it stops by itself: after ``max_requests`` requests
or ``max_seconds``, whichever comes first, plus at most ``timeout_s`` for the last ones to end. Request ``i``
starts at ``i / rate`` seconds whatever the answers do (an open loop: a slow server does not slow the load);
every other request streams (``stream_every``). Each request ends in one outcome:

- ``ok``: a 200 with a complete body; a stream ends with ``data: [DONE]``;
- ``http_error``: any other status (the status is kept);
- ``connection_reset``: the connection failed or was reset before a response began;
- ``truncated``: a stream (or body) cut before its end (``[DONE]``);
- ``timeout``: no end within ``timeout_s``.

Streams record TTFT (time to the first token chunk). ``python -m knobfleet.lab.loadgen --url … --model …``
prints a summary and can write every record as JSON lines.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace

from knobfleet.lab.router_lab import is_loopback

OUTCOMES = ("ok", "http_error", "connection_reset", "truncated", "timeout")
MAX_REQUESTS = 100_000
MAX_SECONDS = 3600.0


@dataclass(frozen=True)
class LoadSpec:
    url: str
    model: str
    rate: float = 8.0
    max_requests: int = 1000
    max_seconds: float = 300.0
    max_tokens: int = 256
    stream_every: int = 2  # every Nth request is non-streaming (1: none stream, 0: all stream)
    timeout_s: float = 120.0
    prompt: str = "Roll the profile through the fleet"

    def check(self) -> None:
        if not is_loopback(self.url):
            raise ValueError(f"loadgen: {self.url} is not a loopback address; the lab's load never leaves 127/8")
        if not 0 < self.rate <= 1000:
            raise ValueError(f"loadgen: rate {self.rate}: choose 0 < rate <= 1000 requests/s")
        if not 1 <= self.max_requests <= MAX_REQUESTS:
            raise ValueError(f"loadgen: max_requests {self.max_requests}: choose 1..{MAX_REQUESTS}")
        if not 0 < self.max_seconds <= MAX_SECONDS:
            raise ValueError(f"loadgen: max_seconds {self.max_seconds}: choose 0 < T <= {MAX_SECONDS:.0f}")

    def streams(self, index: int) -> bool:
        return self.stream_every != 1 and (self.stream_every == 0 or index % self.stream_every != 0)


@dataclass(frozen=True)
class Record:
    index: int
    start: float  # seconds since the load began
    stream: bool
    outcome: str
    status: int | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    chunks: int = 0
    detail: str = ""


def classify_stream(lines: Iterable[bytes]) -> tuple[str, int, bool]:
    """Read SSE lines of a completion stream: (outcome so far, token chunks seen, first token seen). Pure over
    its input; the outcome is ``ok`` only once ``data: [DONE]`` arrives."""
    chunks = 0
    for raw in lines:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return "ok", chunks, chunks > 0
        chunks += 1
    return "truncated", chunks, chunks > 0


def _one(spec: LoadSpec, index: int, t0: float) -> Record:
    stream = spec.streams(index)
    parts = urllib.parse.urlsplit(spec.url)
    body = {
        "model": spec.model,
        "prompt": f"{spec.prompt} #{index}",
        "max_tokens": spec.max_tokens,
        "ignore_eos": True,
        "stream": stream,
    }
    start = time.monotonic()
    base = Record(index, start - t0, stream, outcome="")

    def done(outcome: str, **fields: object) -> Record:
        return replace(base, outcome=outcome, e2e_s=time.monotonic() - start, **fields)  # type: ignore[arg-type]

    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=spec.timeout_s)
    try:
        try:
            conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
        except (ConnectionError, http.client.HTTPException, OSError) as exc:
            kind = "timeout" if isinstance(exc, socket.timeout | TimeoutError) else "connection_reset"
            return done(kind, detail=type(exc).__name__)
        if resp.status != 200:
            detail = resp.read(300).decode("utf-8", "replace").replace("\n", " ")
            return done("http_error", status=resp.status, detail=detail)
        if not stream:
            try:
                doc = json.loads(resp.read())
                ok = isinstance(doc, dict) and bool(doc.get("choices"))
            except (ConnectionError, http.client.HTTPException, OSError, ValueError) as exc:
                return done("truncated", status=200, detail=type(exc).__name__)
            return done("ok" if ok else "truncated", status=200)
        ttft: list[float] = []
        chunks = 0

        def lines() -> Iterable[bytes]:
            nonlocal chunks
            while True:
                line = resp.readline(1 << 16)
                if not line:
                    return
                if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                    chunks += 1
                    if not ttft:
                        ttft.append(time.monotonic() - start)
                yield line

        try:
            outcome, _, _ = classify_stream(lines())
            detail = ""
        except (ConnectionError, http.client.HTTPException, OSError) as exc:
            outcome = "timeout" if isinstance(exc, socket.timeout | TimeoutError) else "truncated"
            detail = type(exc).__name__
        return done(outcome, status=200, ttft_s=ttft[0] if ttft else None, chunks=chunks, detail=detail)
    finally:
        conn.close()


def run(
    spec: LoadSpec, on_start: Callable[[float], None] | None = None, stop: threading.Event | None = None
) -> list[Record]:
    """Send the load; return one Record per request sent, in index order. ``on_start(t0)`` is called with the
    monotonic start time; ``stop`` ends the sending early (requests in flight still finish)."""
    spec.check()
    stop = stop or threading.Event()
    t0 = time.monotonic()
    if on_start:
        on_start(t0)
    workers = min(512, max(8, int(spec.rate * (spec.timeout_s / 4 + 4))))
    futures = []
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="loadgen") as pool:
        for i in range(spec.max_requests):
            due = t0 + i / spec.rate
            if due - t0 >= spec.max_seconds:
                break
            if stop.wait(max(0.0, due - time.monotonic())):
                break
            futures.append(pool.submit(_one, spec, i, t0))
    return sorted((f.result() for f in futures), key=lambda r: r.index)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation; None for no values. Pure."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(records: Sequence[Record], windows: dict[str, tuple[float, float]] | None = None) -> dict[str, object]:
    """Counts per outcome, and TTFT p50/p99 overall and per named window (``{"during": (t_a, t_b)}``, seconds
    since the load began; a request belongs to the window it started in). Pure."""
    counts = {k: sum(r.outcome == k for r in records) for k in OUTCOMES}
    out: dict[str, object] = {"sent": len(records), **counts, "failed": len(records) - counts["ok"]}

    def ttft(rs: Iterable[Record]) -> dict[str, float | int | None]:
        vals = [r.ttft_s for r in rs if r.ttft_s is not None and r.outcome == "ok"]
        return {"n": len(vals), "p50_s": percentile(vals, 50), "p99_s": percentile(vals, 99)}

    out["ttft"] = ttft(records)
    for name, (a, b) in (windows or {}).items():
        inside = [r for r in records if a <= r.start < b]
        out[name] = {
            "sent": len(inside),
            "failed": sum(r.outcome != "ok" for r in inside),
            "ttft": ttft(inside),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m knobfleet.lab.loadgen", description=__doc__.split("\n")[0])
    ap.add_argument("--url", required=True, help="the router (or engine) base URL, loopback only")
    ap.add_argument("--model", required=True, help="the model name the router knows (the workers' model path)")
    ap.add_argument("--rate", type=float, default=8.0, help="requests per second (default 8)")
    ap.add_argument("--requests", type=int, default=1000, help="stop after this many requests (default 1000)")
    ap.add_argument("--seconds", type=float, default=300.0, help="stop sending after this long (default 300)")
    ap.add_argument("--max-tokens", type=int, default=256, help="tokens per completion (default 256)")
    ap.add_argument("--records", default=None, help="write every request's record here (JSON lines)")
    ns = ap.parse_args(argv)
    spec = LoadSpec(ns.url, ns.model, ns.rate, ns.requests, ns.seconds, ns.max_tokens)
    try:
        records = run(spec)
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 64
    if ns.records:
        with open(ns.records, "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(asdict(r), sort_keys=True) + "\n" for r in records)
    print(json.dumps(summarize(records), indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The stand-in's hung-stream fault: ``SGLANG_SIM_HANG=<fraction>`` of streamed requests stop sending tokens while
their status stays 200 (issue #57: Dynamo's churn test left 1.6% of requests hanging for minutes, every status 200).

A streamed completion or chat request is picked with probability ``fraction`` from a seeded generator
(``SGLANG_SIM_SEED``; the same seed picks the same requests in the same order). A picked stream sends its 200, its
headers and the first 0, 1 or 2 tokens (seeded too), then nothing: the connection is held open, without a token, a
keep-alive or ``[DONE]``, until the client goes away, the server drains (SIGTERM) or ``SGLANG_SIM_HANG_MAX_S``
(default 300) has passed, so no held stream outlives its bound; then the connection closes with the stream cut. The
engine itself finishes the request as usual (its counters and latency histograms look healthy): only a client
waiting for the next token can tell. Non-streamed requests are never held.
"""

from __future__ import annotations

import random
import select
import socket
import threading
import time

DEFAULT_MAX_S = 300.0
MAX_MAX_S = 3600.0


class Hang:
    """Which streams hang (``at``) and how a hung one is held (``hold``)."""

    def __init__(self, fraction: float, max_s: float = DEFAULT_MAX_S, seed: int | None = None) -> None:
        self.fraction = fraction
        self.max_s = max_s
        self._rng = random.Random(f"hang:{seed}")
        self._lock = threading.Lock()

    def at(self, max_tokens: int) -> int | None:
        """The number of tokens a new stream sends before it hangs (0, 1 or 2, fewer than ``max_tokens``), or None
        when it does not hang. Every call draws twice, so the picks depend on the order of requests only."""
        with self._lock:
            pick, after = self._rng.random(), self._rng.randrange(3)
        if pick >= self.fraction:
            return None
        return min(after, max(0, max_tokens - 1))

    def hold(self, conn: socket.socket, stop: threading.Event) -> float:
        """Hold ``conn`` open without writing until the client closes it, ``stop`` is set or ``max_s`` passes;
        the seconds held."""
        started = time.monotonic()
        deadline = started + self.max_s
        while not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                readable, _, _ = select.select([conn], [], [], min(0.2, left))
                if readable and not conn.recv(1, socket.MSG_PEEK):
                    break  # the client closed its end
                if readable:  # bytes the client sent after its request: not read, not a reason to spin
                    stop.wait(min(0.2, left))
            except (OSError, ValueError):  # reset by the client, or already closed
                break
        return time.monotonic() - started


def from_env(env: dict[str, str]) -> Hang | None:
    """``SGLANG_SIM_HANG`` (a fraction in 0..1; unset or 0: no fault) and ``SGLANG_SIM_HANG_MAX_S`` (0 < s <= 3600);
    a bad value is a ``ValueError`` naming it (the launcher ends the start with it, like a bad knob)."""
    raw = env.get("SGLANG_SIM_HANG", "").strip()
    try:
        fraction = float(raw or "0")
    except ValueError:
        fraction = float("nan")
    if not 0.0 <= fraction <= 1.0:  # NaN fails too
        raise ValueError(f"SGLANG_SIM_HANG={raw!r}: expected the fraction of streamed requests that hang, 0..1")
    raw_max = env.get("SGLANG_SIM_HANG_MAX_S", str(DEFAULT_MAX_S)).strip()
    try:
        max_s = float(raw_max)
    except ValueError:
        max_s = float("nan")
    if not 0.0 < max_s <= MAX_MAX_S:
        raise ValueError(f"SGLANG_SIM_HANG_MAX_S={raw_max!r}: expected the seconds a hung stream is held, 0<s <=3600")
    if fraction == 0.0:
        return None
    seed = int(env["SGLANG_SIM_SEED"]) if env.get("SGLANG_SIM_SEED") else None
    return Hang(fraction, max_s, seed)

"""Continuous batching scheduler of the stand-in engine: one decode step advances every running request."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import model
from .metrics import Metrics

KV_TOKENS_PER_REQUEST = 1024  # generated tokens a request may hold beyond its context in the modelled KV pool
if TYPE_CHECKING:
    from knobfleet.waves import Calibration


@dataclass
class Request:
    prompt: str
    max_tokens: int
    ignore_eos: bool
    seq: int
    tokens: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    corrupt_at: int | None = None
    shared_batch: bool = False
    cond: threading.Condition = field(default_factory=threading.Condition)
    arrived: float = field(default_factory=time.monotonic)
    last_token_at: float | None = None
    first_not_before: float = 0.0  # a warming engine holds a new request's first token until then

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class EngineConfig:
    knobs: model.KernelKnobs
    sms: int
    time_scale: float
    noise: float
    overlap: bool
    max_running: int
    seed: int | None
    calibration: Calibration | None = None  # measured GPU terms for this GPU, when stored
    warmup: bool = False  # SGLANG_SIM_WARMUP: slower right after its start (model.Warmup)


class Engine:
    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self._lock = threading.Condition()
        self._waiting: list[Request] = []
        self._running: list[Request] = []
        self._seq = 0
        self._drift = model.Drift(cfg.noise, random.Random(cfg.seed))
        self._speed = model.HostSpeed()
        self._warm = model.Warmup.drawn(random.Random(f"{cfg.seed}-warmup")) if cfg.warmup else None
        self.last_gen_throughput = 0.0
        self.generated_tokens = 0
        self.metrics = Metrics()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._stop = True
            self._lock.notify_all()

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def token_usage(self) -> float:
        """Tokens the running requests hold in the modelled KV pool (``max_running`` requests at the longest
        context the lab serves), as SGLang's ``token_usage``: used / total."""
        batch = list(self._running)
        used = sum(model.BASE_CONTEXT + len(r.tokens) for r in batch)
        return min(1.0, used / (self.cfg.max_running * (model.BASE_CONTEXT + KV_TOKENS_PER_REQUEST)))

    def submit(self, prompt: str, max_tokens: int, ignore_eos: bool) -> Request:
        with self._lock:
            self._seq += 1
            req = Request(prompt, max(1, max_tokens), ignore_eos, self._seq)
            self.metrics.request_started(len(prompt.split()))
            self._waiting.append(req)
            self._lock.notify_all()
        return req

    def stream(self, req: Request, timeout_s: float = 3600.0) -> Iterator[str]:
        """Yield the request's tokens as they are produced."""
        sent = 0
        deadline = time.monotonic() + timeout_s
        while True:
            with req.cond:
                while sent >= len(req.tokens) and not req.done:
                    if not req.cond.wait(timeout=max(0.0, deadline - time.monotonic())):
                        raise TimeoutError("request timed out")
                new = req.tokens[sent:]
                done = req.done
            yield from new
            sent += len(new)
            if done and sent >= len(req.tokens):
                return

    def _token(self, req: Request, index: int) -> str:
        if req.corrupt_at is not None and index >= req.corrupt_at:
            return model.corrupted_token(req.prompt, index, req.corrupt_at)
        return model.greedy_token(req.prompt, index)

    def _loop(self) -> None:
        # Steps run on a clock: a step's own CPU time and a late wake-up (GIL, a busy core) come out of the
        # modelled step time instead of adding to it, and up to one step of lateness is caught up; only an
        # engine that needs more CPU than a step lasts falls behind (then it is CPU-bound, not modelled).
        next_at = 0.0
        while True:
            with self._lock:
                while not self._running and not self._waiting and not self._stop:
                    self._lock.wait()
                if self._stop:
                    return
                room = self.cfg.max_running - len(self._running)
                joined, self._waiting = self._waiting[:room], self._waiting[room:]
                self._running.extend(joined)
                batch = list(self._running)
            if self.cfg.overlap and len(batch) > 1:
                for req in batch:
                    if not req.shared_batch:
                        req.shared_batch = True
                        req.corrupt_at = model.corruption_start(req.prompt, req.seq, req.max_tokens)
            context = model.BASE_CONTEXT + sum(len(r.tokens) for r in batch) / len(batch)
            step = model.step_seconds(len(batch), self.cfg.knobs, self.cfg.sms, context, self.cfg.calibration)
            step *= self._drift.factor(step) / self._speed.factor()
            if self._warm is not None:
                step *= self._warm.step_factor()
            dt = step * self.cfg.time_scale
            now = time.monotonic()
            if next_at < now - dt:  # idle before, or more than a step behind: start the clock afresh
                next_at = now
            next_at += dt
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            finished = []
            produced = time.monotonic()
            made = 0
            for req in batch:
                first = req.last_token_at is None
                if first and self._warm is not None:
                    if not req.first_not_before:
                        req.first_not_before = req.arrived + self._warm.first_token_delay(dt)
                    if produced < req.first_not_before:
                        continue  # a warming engine: this request's first token comes later
                made += 1
                self.metrics.token(produced - (req.arrived if first else req.last_token_at or produced), first)
                req.last_token_at = produced
                with req.cond:
                    req.tokens.append(self._token(req, len(req.tokens)))
                    if len(req.tokens) >= req.max_tokens:
                        req.finish_reason = "length"
                    elif not req.ignore_eos and len(req.tokens) >= model.eos_position(req.prompt):
                        req.finish_reason = "stop"
                    if req.done:
                        finished.append(req)
                        if self._warm is not None:
                            self._warm.served += 1
                        self.metrics.request_finished(produced - req.arrived)
                    req.cond.notify_all()
            self.generated_tokens += made
            self.last_gen_throughput = made / step if step > 0 else 0.0
            if finished:
                with self._lock:
                    self._running = [r for r in self._running if not r.done]

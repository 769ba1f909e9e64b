"""The stand-in engine's performance and output model (pure apart from its seeded RNG).

Decode step time for a batch of B running requests with mean context L tokens:

    step = FLOOR_S + PER_REQ_S * B + ATTN_S * (attention_cost + combine_cost)

* ``FLOOR_S + PER_REQ_S * B``: the MoE / dense part, flat plus linear in the batch.
* ``attention_cost``: from ``waves.row`` — whole waves times the context slice each CTA covers, a
  CTA's time being a KV-load share that does not shrink with BLOCK_H plus a compute share that does.
* ``combine_cost``: merging split partials (zero without split-K).

With a calibration (``waves.calibration_for(gpu)``, measured by the kernel bench on a real GPU), the
attention term follows the calibrated prediction instead, scaled so that the two models agree at the
reference point (B=64, default knobs, L=4096): the shape across batch sizes and knobs is then the
measured GPU's (resident CTAs per SM, per-CTA fixed cost, BLOCK_H factor, combine), the magnitude the
engine's. ``engine_calibration`` picks it for an engine from its environment.

Fit (time scale 1, noise off, mean context 4096 + 128 generated): solving the three default-knob
equations at C48/C64/C80 for FLOOR_S, PER_REQ_S, ATTN_S and checking C96 gives aggregate tok/s of
685 / 720 / 833 / 793 at C48 / C64 / C80 / C96 (target 685 / 720 / 833 / 799 ±5%): C96 sits below C80
because its third wave is 4% full. With the same constants TARGET_CTAS=512 gains +10.2% at C64 and
+4.7% at C96 and rises monotonically (678 / 794 / 826 / 830); 768 beats 512 at C96 by +2.2% and loses
4.4% at C64; BLOCK_H=16 (KV share 0.16) is 9.1% worse at C48 and 5.4% worse at C64.
``tests/unit/lab/sim/test_model.py`` checks these.

Noise: a slow Ornstein-Uhlenbeck drift of the log step time (sd ``NOISE``, correlation time
``DRIFT_TAU_S`` of model time) plus per-step jitter, so consecutive identical sweeps differ by a few
percent, up to ~6.5%, like a shared GPU. ``SGLANG_SIM_NOISE=0`` turns both off.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from knobfleet import waves
else:
    try:  # installed on a lab host as sglang_sim/_waves.py
        from . import _waves as waves
    except ImportError:  # inside the knobfleet package
        from knobfleet import waves

KernelKnobs = waves.KernelKnobs
load_gpus = waves.load_gpus
KNOB_DEFAULTS = waves.DEFAULTS

FLOOR_S = 0.024511
PER_REQ_S = 0.000436
ATTN_S = 0.034696
HEADS = 64
BASE_CONTEXT = 4096
DEFAULT_NOISE = 0.025
JITTER = 0.01
DRIFT_TAU_S = 120.0

_WORDS = (
    "the of and to in is for on that with as by at from it an be this are or was which its has "
    "model kernel wave split token cache batch head block decode prefill throughput latency "
    "memory tensor stream graph layer expert router softmax matrix vector scale shard rank "
    "signal result value order sample prompt answer reason check state table index"
)
VOCAB: tuple[str, ...] = tuple(_WORDS.split())


REF_BATCH = 64


def _attention(batch: int, knobs: waves.KernelKnobs, sms: int, ctx: int, cal: waves.Calibration | None) -> float:
    r = waves.row(batch, knobs, sms, HEADS, ctx, cal)
    return r.cost + waves.combine_cost(batch, r.nsplit, HEADS, cal)


def step_seconds(
    batch: int,
    knobs: waves.KernelKnobs,
    sms: int,
    context: float,
    calibration: waves.Calibration | None = None,
) -> float:
    """Noise-free decode step time in model seconds (calibrated attention when ``calibration`` is given)."""
    if batch <= 0:
        return 0.0
    ctx = max(1, int(context))
    if calibration is None:
        attn = _attention(batch, knobs, sms, ctx, None)
    else:
        ref_units = _attention(REF_BATCH, waves.KernelKnobs(), sms, waves.L_REF, None)
        ref_us = _attention(REF_BATCH, waves.KernelKnobs(), calibration.sms, waves.L_REF, calibration)
        attn = ref_units * _attention(batch, knobs, calibration.sms, ctx, calibration) / ref_us
    return FLOOR_S + PER_REQ_S * batch + ATTN_S * attn


def aggregate_tok_s(
    batch: int,
    knobs: waves.KernelKnobs,
    sms: int,
    max_tokens: int = 256,
    calibration: waves.Calibration | None = None,
) -> float:
    """Closed-loop steady-state aggregate throughput at concurrency ``batch`` (noise off)."""
    return batch / step_seconds(batch, knobs, sms, BASE_CONTEXT + max_tokens / 2, calibration)


def weighted_log_tok_s(knobs: waves.KernelKnobs, weights: dict[int, float], sms: int, max_tokens: int = 256) -> float:
    """The traffic-weighted mean log throughput of ``knobs`` (noise off): the truth a tuning campaign on the lab is
    judged against (tests, perf/tune_quality.py), never an input of its decisions."""
    total = sum(weights.values())
    return sum(w / total * math.log(aggregate_tok_s(b, knobs, sms, max_tokens)) for b, w in weights.items() if w)


def engine_calibration(env: dict[str, str]) -> waves.Calibration | None:
    """The calibration an engine uses: the stored one for ``SGLANG_SIM_GPU`` unless
    ``SGLANG_SIM_CALIBRATION=0``. None (the uncalibrated model) when there is none or the file is absent."""
    if env.get("SGLANG_SIM_CALIBRATION", "1") == "0":
        return None
    try:
        return waves.calibration_for(env.get("SGLANG_SIM_GPU", "rtx-pro-6000"))
    except ValueError:
        return None


@dataclass
class Drift:
    """Multiplicative slow drift (Ornstein-Uhlenbeck on the log) plus per-step jitter."""

    sd: float
    rng: random.Random
    x: float = 0.0

    def factor(self, dt_model_s: float) -> float:
        if self.sd <= 0:
            return 1.0
        a = math.exp(-max(dt_model_s, 0.0) / DRIFT_TAU_S)
        self.x = a * self.x + math.sqrt(1 - a * a) * self.sd * self.rng.gauss(0, 1)
        return math.exp(self.x + self.rng.gauss(0, JITTER))


def _h(*parts: object) -> int:
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def greedy_token(prompt: str, index: int) -> str:
    """Deterministic greedy output: token ``index`` depends on the prompt only, never on batching."""
    return VOCAB[_h("tok", prompt, index) % len(VOCAB)]


def eos_position(prompt: str) -> int:
    """Where greedy decoding of ``prompt`` would emit EOS (only honoured without ignore_eos)."""
    return 16 + _h("eos", prompt) % 240


def corruption_start(prompt: str, request_seq: int, max_tokens: int) -> int | None:
    """With multi-stream overlap on, about a third of requests served in a batch of >1 diverge from
    their serial output after some token and then loop. Returns that token index or None."""
    h = _h("corrupt", prompt, request_seq)
    if h % 3 != 0 or max_tokens < 4:
        return None
    return 2 + (h >> 8) % max(1, max_tokens - 3)


def corrupted_token(prompt: str, index: int, start: int) -> str:
    loop = ("expert", "router", "expert", "router", "shard")
    return loop[(index - start) % len(loop)]


# A lab host can be made slower than the others by a fixed factor, the way a GPU of the same SKU runs a few percent
# slower: a host-level file outside anything knobfleet manages (not the profile, the serve script, the unit or its
# drop-ins), written by `knobfleet lab speed HOST FACTOR`. It holds the host's relative speed (0.92 = 8% slower)
# and is read again at most once a second, so a change takes effect without a restart.
HOST_SPEED_FILE = "/etc/knobfleet-lab/host-speed"
HOST_SPEED_RANGE = (0.1, 10.0)


WARMUP_TPUT = 0.066  # throughput per request-second lost right after a restart (SGLang on 8xH200: -6.6%)
WARMUP_TTFT = 0.27  # time to first token added right after a restart (the same measurement: +27%)


@dataclass
class Warmup:
    """A restarted engine is not yet the engine you measured (``SGLANG_SIM_WARMUP=1``): right after its start its
    decode steps are ``WARMUP_TPUT`` slower and its first tokens ``WARMUP_TTFT`` later, the penalty decaying with
    the requests it has served as exp(-served / (n / 3)), down to 5% after ``n`` requests; ``n`` is drawn per start
    uniformly from 50..100 (the published ~50-100 requests), seeded by SGLANG_SIM_SEED."""

    n: float
    served: int = 0

    @classmethod
    def drawn(cls, rng: random.Random) -> Warmup:
        return cls(rng.uniform(50.0, 100.0))

    def penalty(self) -> float:
        return math.exp(-self.served / (self.n / 3.0))

    def step_factor(self) -> float:
        """What a decode step takes now, relative to the converged engine."""
        return 1.0 / (1.0 - WARMUP_TPUT * self.penalty())

    def first_token_delay(self, step_s: float) -> float:
        """Seconds a new request's first token waits beyond the converged engine's (a step's worth is its TTFT)."""
        return WARMUP_TTFT * self.penalty() * step_s


class HostSpeed:
    """The host's speed factor from ``HOST_SPEED_FILE`` (1.0 when absent or unreadable), re-read every second."""

    def __init__(self, path: str = HOST_SPEED_FILE, clock: Callable[[], float] | None = None) -> None:
        import time

        self.path = path
        self.clock = clock or time.monotonic
        self.value = 1.0
        self._read_at = float("-inf")

    def factor(self) -> float:
        now = self.clock()
        if now - self._read_at >= 1.0:
            self._read_at = now
            self.value = parse_speed(self._read())
        return self.value

    def _read(self) -> str:
        try:
            with open(self.path, encoding="ascii") as fh:
                return fh.read(64)
        except (OSError, ValueError):
            return ""


def parse_speed(text: str) -> float:
    """The factor a host-speed file holds; 1.0 for anything that is not one finite number in range."""
    try:
        value = float(text.strip())
    except ValueError:
        return 1.0
    lo, hi = HOST_SPEED_RANGE
    return value if math.isfinite(value) and lo <= value <= hi else 1.0

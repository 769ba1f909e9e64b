"""The sweep grid sent to the kernel bench: points with nsplit computed by knobfleet's own rule."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from knobfleet import waves

BATCHES: tuple[int, ...] = tuple(range(8, 161, 8))
TARGET_CTAS: tuple[int, ...] = (128, 256, 384, 512, 768, 1024, 1536)
BLOCK_H: tuple[int, ...] = (16, 32, 64)
HEADS: tuple[int, ...] = (64, 128)
CONTEXTS: tuple[int, ...] = (2048, 4096)
NUM_WARPS: dict[int, int] = {16: 4, 32: 4, 64: 8}


@dataclass(frozen=True)
class Grid:
    batches: tuple[int, ...] = BATCHES
    target_ctas: tuple[int, ...] = TARGET_CTAS
    block_h: tuple[int, ...] = BLOCK_H
    heads: tuple[int, ...] = HEADS
    contexts: tuple[int, ...] = CONTEXTS
    nsplit_max: int = waves.DEFAULTS["SGLANG_SM120_MMA_NSPLIT_MAX"]
    min_chunk: int = waves.DEFAULTS["SGLANG_SM120_MMA_MIN_CHUNK"]
    num_warps: dict[int, int] = field(default_factory=lambda: dict(NUM_WARPS))

    def points(self) -> list[tuple[int, int, int, int, int, int]]:
        """(B, H, L, BLOCK_H, TARGET_CTAS, nsplit) for every grid cell, nsplit by ``waves.nsplit_for``."""
        out = []
        for h in self.heads:
            for length in self.contexts:
                for bh in self.block_h:
                    for b in self.batches:
                        for tc in self.target_ctas:
                            knobs = waves.KernelKnobs(tc, bh, self.nsplit_max, self.min_chunk)
                            out.append((b, h, length, bh, tc, waves.nsplit_for(b, knobs, h, length)))
        return out

    def as_json(self) -> dict[str, Any]:
        return {
            "points": [list(p) for p in self.points()],
            "num_warps": {str(k): v for k, v in self.num_warps.items()},
            "axes": {
                "batches": list(self.batches),
                "target_ctas": list(self.target_ctas),
                "block_h": list(self.block_h),
                "heads": list(self.heads),
                "contexts": list(self.contexts),
                "nsplit_max": self.nsplit_max,
                "min_chunk": self.min_chunk,
            },
        }


def parse_ints(text: str) -> tuple[int, ...]:
    """``"8,16,32"`` or ``"8..160:8"`` (inclusive range with step) → a sorted tuple of positive ints."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if ".." in part:
            lo, _, rest = part.partition("..")
            hi, _, step = rest.partition(":")
            out.update(range(int(lo), int(hi) + 1, int(step or 1)))
        else:
            out.add(int(part))
    if not out or min(out) < 1:
        raise ValueError(f"{text!r}: expected positive integers like 8,16 or 8..160:8")
    return tuple(sorted(out))

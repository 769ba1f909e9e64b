from __future__ import annotations

import pytest

from knobfleet import waves
from knobfleet.waves import KernelKnobs, row


def test_hand_computed_c96_default_on_188_sms() -> None:
    r = row(96, KernelKnobs(target_ctas=256, block_h=32), sms=188, heads=64)
    assert (r.n_hg, r.nsplit, r.ctas, r.waves, r.waves_ceil, r.last_wave_ctas) == (2, 2, 384, 2.0426, 3, 8)
    assert r.last_wave_fill == pytest.approx(0.04, abs=0.005)


def test_hand_computed_c96_ctas512() -> None:
    r = row(96, KernelKnobs(target_ctas=512, block_h=32), sms=188, heads=64)
    assert (r.nsplit, r.ctas, r.waves_ceil) == (3, 576, 4)


@pytest.mark.parametrize(
    ("batch", "knobs", "context", "nsplit"),
    [
        (1, KernelKnobs(256, 32, 16, 32), 4096, 16),  # NSPLIT_MAX caps 128
        (1, KernelKnobs(256, 32, 64, 32), 4096, 64),
        (1, KernelKnobs(256, 32, 64, 32), 1000, 31),  # MIN_CHUNK: 1000 // 32
        (1, KernelKnobs(256, 32, 64, 2048), 1000, 1),  # never below 1
        (48, KernelKnobs(256, 16), 4096, 2),  # n_hg 4: ceil(256 / 192)
        (200, KernelKnobs(256, 64), 4096, 2),  # n_hg 1: ceil(256 / 200)
    ],
)
def test_nsplit_limits(batch: int, knobs: KernelKnobs, context: int, nsplit: int) -> None:
    assert row(batch, knobs, 188, 64, context).nsplit == nsplit


def test_cost_counts_whole_waves_and_split_work() -> None:
    # default at B64: 2 waves x (L / 2) -> 1.0 ; ctas512 at B64: 3 waves x (L / 4) -> 0.75
    assert row(64, KernelKnobs(256), 188).cost == pytest.approx(1.0)
    assert row(64, KernelKnobs(512), 188).cost == pytest.approx(0.75)
    # BLOCK_H 16 halves only the compute share of a CTA
    assert row(64, KernelKnobs(256, 16), 188).cost == pytest.approx(2 * (0.16 + 0.84 * 0.5))


def test_cliffs_flag_c96_for_default() -> None:
    rows = waves.table([48, 64, 80, 96], KernelKnobs(256), 188)
    assert 96 in waves.cliffs(rows)
    assert 80 not in waves.cliffs(rows)


def test_from_env_validates() -> None:
    assert KernelKnobs.from_env({"SGLANG_SM120_MMA_TARGET_CTAS": "512"}).target_ctas == 512
    with pytest.raises(ValueError, match="expected an integer"):
        KernelKnobs.from_env({"SGLANG_SM120_MMA_TARGET_CTAS": "abc"})
    with pytest.raises(ValueError, match="must be >= 1"):
        KernelKnobs.from_env({"SGLANG_SM120_MMA_BLOCK_H": "0"})


def test_gpu_catalog() -> None:
    gpus = waves.load_gpus()
    assert gpus["rtx-pro-6000"] == 188 and gpus["h200"] == 132 and gpus["b200"] == 148
    assert gpus["l40s"] == 142 and gpus["a100"] == 108 and gpus["h100"] == 132


def test_weighted_cost_prefers_ctas512_over_default_for_the_campaign_mix() -> None:
    w = {48: 0.3, 64: 0.3, 80: 0.3, 96: 0.1}
    assert waves.weighted_cost(KernelKnobs(512), w, 188) < waves.weighted_cost(KernelKnobs(256), w, 188)

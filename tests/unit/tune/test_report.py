"""The campaign's page has plots, not only tables: every candidate's predicted cost against the current profile's
(kept ones marked, the GPU's measurement next to it where the kernel stage measured), each engine A/B's weighted
gain with its interval; and what ran: the space file's hash, the base profile's content hash (from the lock, when
the page is written through ``knobfleet report``)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from knobfleet.tune.report import engine_points, model_points, tune_page
from tests.unit.tune.tune_fixtures import seed_record

REPO = Path(__file__).resolve().parents[3]


def markers(page: str, gid: str) -> int:
    if f'<g id="{gid}">' not in page:
        return 0
    return len(re.findall(r'<use xlink:href="#m', page.split(f'<g id="{gid}">', 1)[1].split('<g id="', 1)[0]))


def test_the_model_plot_is_every_candidates_prediction_against_the_current_profile(tmp_path: Path) -> None:
    doc = seed_record(tmp_path)
    m = doc["stages"]["model"]
    points = model_points(doc)
    assert len(points) == m["candidates"] == 15
    by_name = {f"c{r['index']}": r for r in m["rows"]}
    for p in points:
        r = by_name[p["name"].removesuffix(" (current)")]
        assert math.isclose(p["predicted"], r["cost"] / m["current_cost"] - 1) and p["kept"] == r["kept"]
        assert p["measured"] is None  # the seed space skips the kernel stage
    assert [p["predicted"] for p in points] == sorted(p["predicted"] for p in points)
    assert {p["name"] for p in points if p["kept"]} == {f"c{i}" for i in m["kept"]}
    current = [p for p in points if p["name"].endswith(" (current)")]
    assert len(current) == 1 and abs(current[0]["predicted"]) < 1e-12  # the current profile's own knobs: 0%
    page = tune_page(doc)
    assert page.count("<svg") == 2 and page.index("1. Model") < page.index("<svg") < page.index("2. Kernel")


def test_the_engine_plot_is_each_ab_gain_with_its_interval(tmp_path: Path) -> None:
    doc = seed_record(tmp_path)
    results = doc["stages"]["engine"]["results"]
    points = engine_points(doc)
    assert points and len(points) == len([r for r in results if "ab" in r])
    for p, r in zip(points, [r for r in results if "ab" in r], strict=True):
        g = r["ab"]["weighted_gain"]
        assert (p["name"], p["estimate"], p["low"], p["high"], p["verdict"]) == (
            r["name"], g["estimate"], g["low"], g["high"], r["ab"]["verdict"])  # fmt: skip
        assert p["low"] <= p["estimate"] <= p["high"]
    page = tune_page(doc)
    for p in points:  # one point (with its interval) per candidate
        assert markers(page, f"tune-engine-{p['name']}") == 1
    assert "promote" in {p["verdict"] for p in points}


def test_a_measured_kernel_stage_is_plotted_next_to_the_prediction(tmp_path: Path) -> None:
    doc = seed_record(tmp_path)
    kept = doc["stages"]["model"]["kept"]
    doc["stages"]["kernel"] = {
        "done": True, "source": "sweep.json", "points": 12, "kept": kept,
        "rows": [{"index": i, "knobs": {}, "us_per_req": 1.0 + n, "vs_current": -0.05 * (n + 1), "kept": True,
                  "reason": "kept"} for n, i in enumerate(kept)],
    }  # fmt: skip
    points = model_points(doc)
    got = {p["name"]: p["measured"] for p in points if p["measured"] is not None}
    assert got == {f"c{i}": pytest.approx(-0.05 * (n + 1)) for n, i in enumerate(kept)}
    page = tune_page(doc)
    assert markers(page, "tune-measured") == len(kept)
    assert "2. Kernel: 12 points from sweep.json" in page


def test_knobfleet_report_shows_the_base_profiles_locked_hash_and_the_space_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from knobfleet import cli

    doc = seed_record(tmp_path)
    lock = dict(
        line.split(": ", 1) for line in (REPO / "profiles" / "profiles.lock").read_text().splitlines()
        if line and not line.startswith("#")
    )  # fmt: skip
    assert cli.run(["report", str(tmp_path / "seed.json"), "-o", str(tmp_path / "seed.html")]) == 0
    page = (tmp_path / "seed.html").read_text()
    base = doc["base"]
    assert base in lock
    assert (
        f"<td class=l>current (base): {base}</td><td class=l>{lock[base]}</td><td class=l>profiles/profiles.lock"
        in page
    )
    decided = doc["decision"]["profile"]
    assert (
        f"<td class=l>decision: {decided}</td><td class=l>-</td><td class=l>not recorded by the run, and not a " in page
    )
    assert f"<td class=l>{doc['space']['sha256']}</td><td class=l>recorded by the run</td>" in page
    assert "http://" not in page and "https://" not in page

"""The campaign's page is rendered in jinja2's autoescaping environment like every report page: a campaign record
whose every operator string (the space's name and path, the base and decided profiles, knob names and values,
candidates' names, reasons, verdicts, the GPU, the kernel sweep's source, the live stage's reason) holds
``<script>alert(1)</script>``, ``"onload=x`` and ``</textarea>``, and whose counts the page prints as they are
(candidates, SMs, the kernel's points) hold them too, renders to a page with the same elements as the same record's
with plain strings: no script, no textarea, no attribute the template does not write. On 0.2.4 the model stage's
heading wrote the candidates' count unescaped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings

from knobfleet.tune.report import tune_page
from tests.unit.experiment.hostile_pages import assert_escaped, elements, hostile, hostile_texts
from tests.unit.tune.tune_fixtures import seed_record

SEED: list[dict[str, Any]] = []  # the seed campaign's record, run once for every example


def campaign(tmp_path: Path) -> dict[str, Any]:
    """The seed campaign's record with a measured kernel stage (its table) and a live stage."""
    if not SEED:
        doc = seed_record(tmp_path)
        kept = doc["stages"]["model"]["kept"]
        doc["stages"]["kernel"] = {
            "done": True, "source": "sweep.json", "points": 12, "kept": kept,
            "rows": [{"index": i, "knobs": {"SGLANG_SM120_MMA_TARGET_CTAS": 512}, "us_per_req": 1.0 + n,
                      "vs_current": -0.05 * (n + 1), "kept": True, "reason": "kept"} for n, i in enumerate(kept)],
        }  # fmt: skip
        doc["profile_hashes"] = {doc["base"]: "sha256:" + "b" * 64}
        SEED.append(doc)
    return SEED[0]


def record(doc: dict[str, Any], text: str) -> dict[str, Any]:
    out = hostile(doc, text, (("knobs",), ("profile_hashes",)), stringify=(("knobs",),))
    out["stages"]["model"]["candidates"] = text or "n"
    out["stages"]["kernel"]["points"] = text or "n"
    return out | {"sms": text or "n", "calibration": text or "n"}


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=hostile_texts())
def test_operator_strings_in_a_campaign_record_are_text_never_markup(tmp_path: Path, text: str) -> None:
    doc = campaign(tmp_path)
    assert_escaped(tune_page(record(doc, text)), elements(tune_page(record(doc, ""))))

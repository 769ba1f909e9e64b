"""Every report page is rendered in jinja2's autoescaping environment (experiment/html_core.environment): a canary
record, an A/B report, a bench and a drift document whose every operator string (profile and host names, knob
names, reasons, verdicts, findings, settings, notes) holds ``<script>alert(1)</script>``, ``"onload=x`` and
``</textarea>`` render to a page with the same elements as the same record's with plain strings: no script, no
textarea, no attribute the template does not write, and the payloads shown as text. The tune page's test is
tests/unit/tune/test_report_escaping.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from knobfleet.experiment import html
from tests.unit.experiment import test_canary_run as fleet
from tests.unit.experiment.hostile_pages import assert_escaped, elements, hostile, hostile_texts
from tests.unit.experiment.test_html import canary_record, fleet_doc
from tests.unit.experiment.test_html_ab import ab_doc_with_latency
from tests.unit.experiment.test_html_pages import engine_bench_doc

profile, router = fleet.profile, fleet.router  # the fake fleet's fixtures

EXAMPLES = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
WHAT_RAN = {"generations": {"lab1": 7}, "engine_versions": {"lab1": "0.5.23"},
            "profile_hashes": {"ctas512@2": "sha256:" + "d" * 64}}  # fmt: skip
KEYS = (("generations",), ("engine_versions",), ("profile_hashes",), ("locked_hashes",))


def ab_record(text: str) -> dict[str, Any]:
    doc = hostile(ab_doc_with_latency() | WHAT_RAN, text, KEYS)
    doc["settings"][text or "note"] = text or "n"  # a settings key and value of its own (the rest are read by name)
    return doc | {"rounds": text or "n", "winner": text or "n"}


def bench_record(text: str) -> dict[str, Any]:
    doc = engine_bench_doc() | {"generations": {"lab1": 4}, "locked_hashes": {"ctas512@2": "sha256:" + "e" * 64}}
    doc = hostile(doc, text, (*KEYS, ("settings",), ("settings", "engine")))
    return doc | {"repeats": text or "n", "errors": text or "n"}


def fleet_record(text: str) -> dict[str, Any]:
    doc = hostile(fleet_doc(), text, (("summary", "profiles"),))
    doc["summary"] |= {k: text or "n" for k in ("hosts", "in_sync", "drift", "unreachable", "error")}
    return doc


CANARY: list[dict[str, Any]] = []  # the fake fleet's record, run once for every example


def canary(profile: Any) -> Callable[[str], dict[str, Any]]:
    if not CANARY:
        CANARY.append(canary_record(profile, 0.55))
    rec = CANARY[0]

    def record(text: str) -> dict[str, Any]:
        doc = hostile(rec, text, (*KEYS, ("values", "tput"), ("values", "itl")))
        doc["settings"][text or "note"] = text or "n"
        return doc | {"windows_counted": text or "n", "windows_pre": text or "n", "followup": text or "n",
                      "notes": [text or "n", "plain"]}  # fmt: skip

    return record


def check(record: Callable[[str], dict[str, Any]], page: Callable[[dict[str, Any]], str], text: str) -> None:
    """The page of ``record(text)`` against the page of ``record("")`` (plain strings)."""
    assert_escaped(page(record(text)), elements(page(record(""))))


@pytest.mark.parametrize(
    ("record", "page"),
    [(ab_record, html.render), (bench_record, html.render),
     (fleet_record, lambda doc: html.fleet_page(doc, "drift: " + str(doc["hosts"][0]["host"])))],
    ids=["ab", "bench", "fleet"],
)  # fmt: skip
@EXAMPLES
@given(text=hostile_texts())
def test_operator_strings_in_a_report_are_text_never_markup(
    record: Callable[[str], dict[str, Any]], page: Callable[[dict[str, Any]], str], text: str
) -> None:
    check(record, page, text)


@EXAMPLES
@given(text=hostile_texts())
def test_operator_strings_in_a_canary_record_are_text_never_markup(profile: Any, router: Any, text: str) -> None:
    check(canary(profile), html.render, text)


def test_the_check_catches_a_value_written_as_it_is() -> None:
    """The check itself: the A/B page with the payloads written into it unescaped (what a forgotten escape in an
    f-string did) is caught, in an element's text and in an attribute's value alike."""
    text = '<script>alert(1)</script>"onload=x</textarea>'
    benign = elements(html.render(ab_record("")))
    page = html.render(ab_record(text))
    assert_escaped(page, benign)
    for unescaped in (
        page.replace("<h1>", "<h1><script>alert(1)</script>", 1),
        page.replace('class="decision ', 'class="decision "onload=x ', 1),
        page.replace("<td class=l>A</td><td>", "<td class=l>A</td><td></textarea>", 1),
    ):
        assert unescaped != page
        with pytest.raises(AssertionError):
            assert_escaped(unescaped, benign)


def test_every_template_ships_in_the_wheel() -> None:
    """The pages' templates are package data: the wheel holds every one (hatchling's own file selection)."""
    from hatchling.builders.wheel import WheelBuilder

    from tests.conftest import REPO

    shipped = {f.distribution_path for f in WheelBuilder(str(REPO)).recurse_included_files()}
    templates = sorted((REPO / "python" / "knobfleet" / "experiment" / "templates").glob("*.html.j2"))
    assert len(templates) == 8  # ab, bench, canary, fleet, page, parts, restarts, tune
    assert {f"knobfleet/experiment/templates/{t.name}" for t in templates} <= shipped

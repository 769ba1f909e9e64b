"""``history --report``'s page (experiment/html.restarts_page): every measured restart of every host as a bar from
stop to API-ready split into the engine's phases, the median per host, and every restart as a row; a host with none
says so; the page is self-contained like every report."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from knobfleet.experiment import html
from tests.unit.experiment.test_html import assert_self_contained


def start(t: str, start_s: float, phases: list[tuple[str, float]], **kw: Any) -> dict[str, Any]:
    return {"event": "start", "time": t, "kind": "restart", "generation": 3, "profile": "ctas512", "version": 2,
            "engine_version": "0.5.23", "cache": "warm", "stop_s": 0.6, "start_s": start_s,
            "phases": [{"phase": p, "s": s} for p, s in phases], **kw}  # fmt: skip


DOC = {
    "hosts": [
        {"host": "lab1", "ledger": [
            {"event": "apply", "time": "2026-12-06T10:00:00"},  # not a restart: no bar, no row
            start("2026-12-06T10:00:05", 125.1, [("weights", 119.4), ("memory_pool", 0.9), ("serving", 4.6)]),
            start("2026-12-06T10:05:05", 31.0, [("weights", 25.0), ("cuda_graph", 4.0)], cache="cold"),
        ]},
        {"host": "lab2", "ledger": [start("2026-12-06T10:01:00", 2.2, [])]},
        {"host": "lab3", "ledger": []},
    ]
}  # fmt: skip


def test_the_page_has_a_bar_and_a_row_per_restart_and_the_median_per_host() -> None:
    page = html.restarts_page(DOC)
    assert_self_contained(page)
    assert "3 measured restart(s) on 2 of 3 host(s); median start to API-ready 31.0s." in page
    rows = re.findall(r"<tr>(.*?)</tr>", page, re.S)
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", r, re.S) for r in rows]
    per_host = [c for c in cells if len(c) == 5]
    assert [c[:4] for c in per_host] == [["lab1", "2", "78.0s", "0.6s"], ["lab2", "1", "2.2s", "0.6s"],
                                         ["lab3", "0", "unmeasured", "unmeasured"]]  # fmt: skip
    every = [c for c in cells if len(c) == 10]
    assert [c[0] for c in every] == ["lab1", "lab1", "lab2"]
    assert every[0][3:] == ["0003", "ctas512@2", "0.5.23", "warm", "0.6s", "125.1s",
                            "weights 119.4s memory_pool 0.9s serving 4.6s"]  # fmt: skip
    assert every[1][6] == "cold" and every[2][9] == "-"  # no phase logged: the start alone
    svg = page[page.index("<svg") : page.index("</svg>")]
    # stop + phases + the rest of the start per bar: 4 + 3 + 2 drawn bars (a zero-width rest is not drawn)
    assert len(re.findall(r"<g id=\"patch_", svg)) >= 9


def test_a_fleet_with_no_restart_measured_says_so() -> None:
    page = html.restarts_page({"hosts": [{"host": "lab1", "ledger": []}]})
    assert_self_contained(page)
    assert "0 measured restart(s) on 0 of 1 host(s); median start to API-ready unmeasured." in page
    assert "no measured restart in any host's ledger" in page


TEXT = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=8)


@settings(deadline=None, max_examples=30)  # each example draws a plot (matplotlib: ~0.1-0.3 s)
@given(st.lists(st.tuples(st.sampled_from(["lab1", "lab2", "<b>x</b>"]),
                          st.one_of(st.none(), st.floats(-5, 1e4), TEXT),
                          st.lists(st.tuples(TEXT, st.one_of(st.none(), st.floats(0, 100))),
                                   max_size=4)), max_size=6))  # fmt: skip
def test_any_ledger_renders_escaped_without_error(events: list[Any]) -> None:
    doc = {"hosts": [{"host": h, "ledger": [{"event": "start", "start_s": s, "stop_s": s,
                                             "phases": [{"phase": p, "s": x} for p, x in ph]}]}
                     for h, s, ph in events]}  # fmt: skip
    page = html.restarts_page(doc)
    assert "<b>x</b>" not in page


def test_a_phase_name_matplotlib_would_read_as_math_is_drawn_as_text() -> None:
    """Found by the test above under mutmut: a phase named ``$$`` (or ``$x^``) was parsed as mathtext and raised
    matplotlib's ParseException, taking the whole page down. Every plot's text is plain text now."""
    for name in ("$$", "$x^", "a$b$c", r"\frac"):
        doc = {"hosts": [{"host": "lab1", "ledger": [start("2026-12-06T10:00:05", 3.0, [(name, 1.0)])]}]}
        assert "<svg" in html.restarts_page(doc)

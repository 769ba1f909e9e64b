"""What ran, on the canary and bench pages: the profile with its content hash (where the record has it, and why not
where it does not), the engine version, and the settings the engine resolved (every leaf, folded); a bench
document as ``bench --json`` printed it renders as a bench page."""

from __future__ import annotations

from typing import Any

import pytest

from knobfleet.experiment import html
from knobfleet.experiment.html_core import MAX_SETTINGS_ROWS, flatten
from tests.unit.experiment import test_canary_run as fleet
from tests.unit.experiment.test_html import assert_self_contained, bench_doc, canary_record

profile, router = fleet.profile, fleet.router  # the fake fleet's fixtures

HASH = "sha256:" + "e" * 64


def test_a_canary_page_says_what_ran_and_what_its_record_does_not_hold(profile: Any, router: Any) -> None:
    rec = canary_record(profile, 0.55)
    # the canary records the content its canaries ran
    assert rec["profile_hashes"] == {"ctas512": profile.content_hash}
    page = html.render(rec)
    assert (
        f"<td class=l>profile: ctas512</td><td class=l>{profile.content_hash}</td><td class=l>recorded by the run</td>"
        in page
    )
    # a record without it (an older one) names the profile without its version: no hash can be claimed for it
    older = {k: v for k, v in rec.items() if k not in ("generations", "engine_versions")}
    page = html.render(older | {"profile_hashes": {}})
    assert (
        "<td class=l>profile: ctas512</td><td class=l>-</td><td class=l>not recorded: the record names the profile "
        "without its version</td>" in page
    )
    assert "<td class=l>engine</td><td class=l>-</td><td class=l>not recorded: the engine reported no version" in page
    # what each side ran while judged, read from the hosts after the canary apply (the fake fleet's probe)
    assert rec["generations"] == {"h1": 1, "h2": 1} and rec["engine_versions"] == {
        "h1": "0.5.23",
        "h2": "0.5.23",
    }
    page = html.render(rec)
    assert "<td class=l>generation on h1</td><td class=l>0001</td>" in page
    assert "<td class=l>engine on h2</td><td class=l>0.5.23</td>" in page
    # a record that holds them (a versioned profile, its hash, each host's engine) shows them
    rec |= {"profile": "ctas512@2", "profile_hashes": {"ctas512@2": HASH},
            "engine_versions": {"h1": "0.5.23", "h2": "0.5.22"}}  # fmt: skip
    page = html.render(rec)
    assert_self_contained(page)
    assert f"<td class=l>profile: ctas512@2</td><td class=l>{HASH}</td><td class=l>recorded by the run</td>" in page
    assert "<td class=l>engine on h1</td><td class=l>0.5.23</td>" in page
    assert "<td class=l>engine on h2</td><td class=l>0.5.22</td>" in page


def engine_bench_doc() -> dict[str, Any]:
    return bench_doc() | {
        "tool": "vllm bench serve",
        "engine_version": "0.11.0",
        "profile_hashes": {"ctas512@2": HASH},
        "settings": {"engine": {"max_num_seqs": 128, "enforce_eager": False, "nested": {"dtype": "bfloat16"}},
                     "served": ["m", None]},
        "time_scale": 0.25,
    }  # fmt: skip


def test_a_bench_page_renders_the_settings_the_engine_resolved_and_what_ran() -> None:
    page = html.render(engine_bench_doc())
    assert_self_contained(page)
    for path, value in (("engine.max_num_seqs", "128"), ("engine.enforce_eager", "false"),
                        ("engine.nested.dtype", "bfloat16"), ("served[0]", "m"), ("served[1]", "null")):  # fmt: skip
        assert f"<tr><td class=l>{path}</td><td class=l>{value}</td></tr>" in page
    assert "<details><summary>5 setting(s) as the engine reported them</summary>" in page
    assert f"<td class=l>profile: ctas512@2</td><td class=l>{HASH}</td><td class=l>recorded by the run</td>" in page
    assert "<td class=l>engine</td><td class=l>0.11.0</td>" in page
    assert "<td class=l>bench tool</td><td class=l>vllm bench serve</td>" in page
    assert "<td class=l>lab time scale</td><td class=l>0.25 (tok/s are 4x the modelled GPU&#39;s)</td>" in page
    builtin = html.render(bench_doc() | {"settings": None})
    assert "Not reported: the built-in client does not ask the engine" in builtin


def test_a_huge_settings_tree_is_cut_and_says_so() -> None:
    doc = engine_bench_doc() | {"settings": {f"k{i}": {"v": i} for i in range(1000)}}
    page = html.render(doc)
    assert page.count("<tr><td class=l>k") == MAX_SETTINGS_ROWS
    assert f"(the first {MAX_SETTINGS_ROWS}; the whole tree is in the record)" in page
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(30):
        node["d"] = {}
        node = node["d"]
    rest = "{}"
    for _ in range(30 - 12):  # what is left below 12 levels: one row, its JSON
        rest = '{"d": ' + rest + "}"
    assert flatten(deep) == [(".".join(["d"] * 12), rest[:200])]


def test_bench_json_output_as_printed_is_a_bench_page() -> None:
    printed = {k: v for k, v in bench_doc().items() if k != "kind"} | {"runs": [["C48 …"]], "settings": None,
                                                                        "time_scale": None}  # fmt: skip
    page = html.render(printed)
    assert "bench of ctas512@2, generation 0004 on lab1: 2 bucket(s), 3 run(s) each, 0 request error(s)" in page
    assert html.is_bench(printed) and not html.is_bench({"a": 1, "b": 2, "buckets": [], "host": "x"})


@pytest.mark.parametrize("doc", [{"host": "x", "repeats": 1, "buckets": [{"concurrency": 1}], "tool": "t"}])
def test_a_bench_shaped_document_without_means_is_not_taken_for_one(doc: dict[str, Any]) -> None:
    from knobfleet.errors import KnobfleetError

    with pytest.raises(KnobfleetError, match="nothing to render"):
        html.render(doc, "b.json")

"""``knobfleet report`` renders what ``bench --json`` printed; ``bench --report`` and ``ab --report`` pages carry the
content hashes of the profiles that ran (``ab``'s folder page too), with the use cases faked at their module."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from knobfleet.errors import EXIT_OK
from knobfleet.experiment import ab as use_case
from knobfleet.experiment import html_ab
from knobfleet.ops import profiles as app
from tests.unit.cli.test_bench_output import INV, bench_doc, call, fake_bench
from tests.unit.experiment.test_html import ab_doc, assert_self_contained

__all__ = ["fake_bench"]  # the fixture, used by name


def test_what_bench_json_printed_renders_through_knobfleet_report(
    capsys: pytest.CaptureFixture[str], fake_bench: list[dict[str, Any]], tmp_path: Path
) -> None:
    fake_bench[0]["docs"]["doc"] = bench_doc(tool="vllm bench serve")
    code, out, _ = call(capsys, "bench", "-i", INV, "--limit", "lab1", "--tool", "engine", "--json")
    assert code == EXIT_OK
    saved = tmp_path / "bench.json"
    saved.write_text(out)
    code, out, err = call(capsys, "report", str(saved))
    assert code == EXIT_OK, err
    page = (tmp_path / "bench.html").read_text()
    assert_self_contained(page)
    assert "bench of the current profile (not recorded) on lab1: 2 bucket(s), 2 run(s) each, 0 request error(s); " \
        "measured with vllm bench serve against engine 0.11.0." in page  # fmt: skip
    assert "<tr><td class=l>engine.nested.dtype</td><td class=l>bfloat16</td></tr>" in page
    assert "<tr><td class=l>engine.max_num_seqs</td><td class=l>128</td></tr>" in page
    assert "2701.5 to 2876.5" in page or "2701.5 to 2876.6" in page


def test_bench_report_names_the_profiles_content_hash(
    capsys: pytest.CaptureFixture[str], fake_bench: list[dict[str, Any]], tmp_path: Path
) -> None:
    ctas = app.store().resolve("ctas512")
    fake_bench[0]["docs"]["doc"] = bench_doc() | {"profile": ctas.ref}
    out = tmp_path / "b.html"
    code, _, err = call(capsys, "bench", "ctas512", "-i", INV, "--limit", "lab1", "--report", str(out))
    assert code == EXIT_OK, err
    page = out.read_text()
    assert (
        f"<td class=l>profile: {ctas.ref}</td><td class=l>{ctas.content_hash}</td><td class=l>recorded by the run"
        in (page)
    )


def test_ab_report_pages_name_both_profiles_content_hashes(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))
    st = app.store()
    a, b = st.resolve("ctas512"), st.resolve("ctas768")
    folders: list[Path] = []

    def fake_ab(a_: Any, b_: Any, hv: Any, inventory: Path, settings: Any, spec: Any, report_dir: Path,
                **_: Any) -> dict[str, Any]:  # fmt: skip
        doc = ab_doc() | {"a": a_.ref, "b": b_.ref, "consistency": {"A": "pass", "B": "pass"}}
        report_dir.mkdir(parents=True)
        (report_dir / "report.html").write_text(html_ab.ab_page(doc))  # what the use case writes: no hashes
        folders.append(report_dir)
        return doc

    monkeypatch.setattr(use_case, "ab", fake_ab)
    out = tmp_path / "ab.html"
    code, _, err = call(capsys, "ab", "ctas512", "ctas768", "-i", INV, "--limit", "lab1", "--yes", "--report", str(out))
    assert code == EXIT_OK, err
    for page in (out.read_text(), (folders[0] / "report.html").read_text()):
        assert_self_contained(page)
        for role, p in (("A", a), ("B", b)):
            assert (
                f"<td class=l>{role}: {p.ref}</td><td class=l>{p.content_hash}</td><td class=l>recorded by the run"
                in (page)
            )
    assert folders[0].is_relative_to(tmp_path / "state")  # the folder the experiment chose, its page rewritten

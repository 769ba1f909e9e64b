"""tune's stored `kernel bench` sweep (stages.kernel.sweep) is a file of the operator's: it is read through the
bounded reader and the finite-number JSON parser every such file goes through (safefile.read_text, loads_json),
and every row is checked for what the kernel ranking reads. A hostile or broken file is one line
(campaign.SweepRowError, a KnobfleetError) naming the space file and its field, the sweep file, the bad field
and the fix; never NaN ranked as a time, a RecursionError, a KeyError or a hang. Hostile nodes are made in the
test's own temp dir."""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from knobfleet.errors import KnobfleetError
from knobfleet.tune import campaign, stages
from knobfleet.tune.space import parse
from tests.unit.tune.tune_fixtures import SEED_SPACE

ROW = {"batch": 48, "target_ctas": 512, "block_h": 32, "heads": 64, "context": 4096, "total_us": 96.0}
FIELDS = ("batch", "target_ctas", "block_h", "heads", "context", "total_us")  # what the ranking reads of a row


def good_doc() -> dict[str, Any]:
    return {"schema": 1, "skipped": False, "check": {"ok": True}, "results": [dict(ROW), {**ROW, "batch": 96}]}


def read(tmp_path: Path, text: str | None) -> list[dict[str, Any]]:
    """kernel_rows of a space whose stages.kernel.sweep is sweep.json next to it (``text``: its content)."""
    if text is not None:
        (tmp_path / "sweep.json").write_text(text)
    space_text = SEED_SPACE.replace('{skip: "no GPU host in the lab"}', "{sweep: sweep.json}")
    sp = parse(yaml.safe_load(space_text), tmp_path / "s.yaml", space_text)
    return stages.HostStages(sp, tmp_path / "inventory").kernel_rows([512], [32], [48, 96])


def refused(tmp_path: Path, text: str | None) -> str:
    with pytest.raises(KnobfleetError) as err:
        read(tmp_path, text)
    msg = str(err.value)
    assert type(err.value).__name__ == "SweepRowError", msg
    assert "\n" not in msg and "\r" not in msg and len(msg) < 600, msg
    assert "s.yaml: stages.kernel.sweep: " in msg and "sweep.json" in msg, msg  # the space, its field, the file
    assert msg.endswith("point stages.kernel.sweep at the JSON `kernel bench --out` wrote"), msg  # the fix
    return msg


def with_row(**change: Any) -> str:
    doc = good_doc()
    doc["results"][1].update(change)
    return json.dumps(doc)


def without(field: str) -> str:
    doc = good_doc()
    del doc["results"][1][field]
    return json.dumps(doc)


def test_a_good_sweep_gives_its_rows(tmp_path: Path) -> None:
    assert read(tmp_path, json.dumps(good_doc())) == good_doc()["results"]
    assert read(tmp_path, json.dumps({**good_doc(), "results": []})) == []  # measured nothing: all unmeasured


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ('{"results": [{"batch": 48, "target_ctas": 512, "block_h": 32, "heads": 64, "context": 4096, '
         '"total_us": NaN}]}', "NaN is not a number JSON allows"),
        ('{"results": [{"batch": 48, "target_ctas": 512, "block_h": 32, "heads": 64, "context": 4096, '
         '"total_us": Infinity}]}', "Infinity is not a number JSON allows"),
        ('{"results": [{"batch": 48, "target_ctas": 512, "block_h": 32, "heads": 64, "context": 4096, '
         '"total_us": -Infinity}]}', "-Infinity is not a number JSON allows"),
        ('{"results": [{"batch": 48, "target_ctas": 512, "block_h": 32, "heads": 64, "context": 4096, '
         '"total_us": 1e999}]}', "results[0].total_us is inf: a timing must be a finite number above 0"),
        ('{"results": [' * 100_000 + "]}" * 100_000, "nested too deep"),
        ('{"results": [{"batch": ' + "9" * 5000 + "}]}", "not a valid kernel sweep"),
        (without("total_us"), "results[1].total_us is missing"),
        (without("batch"), "results[1].batch is missing"),
        (without("heads"), "results[1].heads is missing"),
        (with_row(total_us=0), "results[1].total_us is 0: a timing must be a finite number above 0"),
        (with_row(total_us="96"), "results[1].total_us is '96'"),
        (with_row(batch=0), "results[1].batch is 0: it must be a whole number between 1 and 10^9"),
        (with_row(target_ctas=10**12), "results[1].target_ctas is 1000000000000"),
        (with_row(block_h=True), "results[1].block_h is True"),
        (with_row(context=4096.5), "results[1].context is 4096.5"),
        (with_row(heads=None), "results[1].heads is None"),
        (with_row(batch=[[[[1]]]]), "results[1].batch is a JSON list"),
        (json.dumps({"results": [ROW, [1, 2]]}), "results[1] is a JSON list, not a row object"),
        (json.dumps({"results": [ROW, "x" * 10_000]}), "results[1] is 'xxxxxx"),
        (json.dumps({"results": {"a": 1}}), "results is a JSON object, not a list of measured rows"),
        (json.dumps({"check": {"ok": True}}), "results is missing"),
        (json.dumps({"skipped": True, "reason": "no GPU"}), "skipped is True: the bench measured nothing"),
        ("[1, 2]", "a JSON list, not a `kernel bench` sweep"),
        ('"a string"', "'a string', not a `kernel bench` sweep"),
        ("not json", "not valid JSON (Expecting value at line 1, column 1)"),
        ("", "not valid JSON"),
    ],
    ids=[
        "nan", "infinity", "-infinity", "1e999", "deep", "5000-digits", "no-total", "no-batch", "no-heads",
        "zero-total", "string-total", "zero-batch", "huge-ctas", "bool-block", "float-context", "null-heads",
        "list-batch", "row-a-list", "row-a-long-string", "results-an-object", "no-results", "skipped", "a-list",
        "a-string", "not-json", "empty",
    ],
)  # fmt: skip
def test_a_hostile_sweep_is_one_line_naming_file_field_and_fix(tmp_path: Path, text: str, names: str) -> None:
    msg = refused(tmp_path, text)
    assert names in msg, msg


def test_a_sweep_that_is_not_a_regular_file_is_refused_unread(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "sweep.json")  # a FIFO nobody writes: a plain open would hang here
    assert "is a FIFO" in refused(tmp_path, None)
    (tmp_path / "sweep.json").unlink()
    (tmp_path / "sweep.json").mkdir()
    assert "is a directory" in refused(tmp_path, None)
    (tmp_path / "sweep.json").rmdir()
    (tmp_path / "sweep.json").symlink_to(tmp_path / "nowhere.json")
    assert "cannot read" in refused(tmp_path, None)
    (tmp_path / "sweep.json").unlink()
    with (tmp_path / "sweep.json").open("wb") as f:  # sparse: past the bound without using the disk
        f.truncate(32 * 1024 * 1024 + 1)
    assert "is larger than" in refused(tmp_path, None)
    (tmp_path / "sweep.json").write_bytes(b'{"results": []}\xff')
    assert "not valid UTF-8" in refused(tmp_path, None)


def _bad_value(field: str) -> st.SearchStrategy[Any]:
    """Values ``field`` of a row may not hold (JSON-encodable, NaN and infinities included)."""
    junk = st.one_of(st.none(), st.booleans(), st.text(max_size=30), st.lists(st.integers(), max_size=3),
                     st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))  # fmt: skip
    if field == "total_us":
        numbers = st.one_of(st.floats().filter(lambda x: not (math.isfinite(x) and x > 0)),
                            st.integers(-(10**300), 0))  # fmt: skip
    else:
        numbers = st.one_of(st.integers(-(10**300), 0), st.integers(10**9 + 1, 10**300),
                            st.floats(allow_nan=True, allow_infinity=True))  # fmt: skip
    return st.one_of(junk, numbers)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), field=st.sampled_from(FIELDS), row=st.integers(0, 1), missing=st.booleans())
def test_any_bad_field_of_any_row_is_one_line(tmp_path: Path, data: st.DataObject, field: str, row: int,
                                              missing: bool) -> None:  # fmt: skip
    doc = copy.deepcopy(good_doc())
    if missing:
        del doc["results"][row][field]
    else:
        doc["results"][row][field] = data.draw(_bad_value(field))
    msg = refused(tmp_path, json.dumps(doc))  # allow_nan: NaN/Infinity literals reach the parser as written
    assert f"results[{row}].{field} " in msg or "is not a number JSON allows" in msg, msg


def test_the_ranking_says_which_row_it_cannot_read() -> None:
    """Rows that do not come from a file (a bench's, a stand-in's) are checked where they are ranked."""
    kept = [campaign.Scored(0, {"SGLANG_SM120_MMA_TARGET_CTAS": 256}, 1.0, 0.0, True, "kept")]
    base = {"SGLANG_SM120_MMA_TARGET_CTAS": 512, "SGLANG_SM120_MMA_BLOCK_H": 32}
    other_shape = {"batch": 48, "target_ctas": 256, "block_h": 32, "total_us": 1.0}  # no heads: another shape
    cases: list[tuple[list[Any], str]] = [
        ([other_shape, {k: v for k, v in ROW.items() if k != "total_us"}], "rows[1].total_us is missing"),
        ([{**ROW, "batch": "48"}], "rows[0].batch is '48'"),
        ([{**ROW, "total_us": float("nan")}], "rows[0].total_us is nan"),
        ([["not", "a", "row"]], "rows[0] is a JSON list"),
    ]
    for rows, names in cases:
        with pytest.raises(KnobfleetError) as err:
            campaign.kernel_rank(kept, base, rows, {48: 1.0}, 64, 4096, keep=1)
        assert names in str(err.value) and "\n" not in str(err.value), str(err.value)
        assert str(err.value).startswith("kernel stage: measured ")

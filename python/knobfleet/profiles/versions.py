"""Engine versions (pure): what changed between two versions' catalogs, the version a host reports, and a profile
rewritten for another version.

- ``diff(old, new)``: the knobs added, removed, renamed and changed (type, choices, default, kind), and the metric
  names that changed. A name the new version lacks is *renamed* when the engine says so: the new catalog's own
  rename table (``renamed``: SGLang's removed-argument map, curated in the overlay), a deprecated knob's
  ``replacement`` in the old catalog, or an alias the new version still accepts (then nothing breaks).
- The version a host reports lives in ``profiles/hostversion.py`` (import it from there): ``parse_version(text)``,
  ``0.32.0`` out of a version file's first line (``0.32.0``, ``vllm 0.32.0``, ``v0.32.0``); ``host_version(doc,
  pin, ...)``, the version a host runs, from the first source that answers (the operator's pin, the engine's
  report, the package metadata of its launcher's environment, its version file), and which; ``unknown_note``,
  what a plan says of a host none of them answers for.
- ``migrate_text(...)``: the next version of a profile file for the new catalog, edited line by line so the
  operator's comments stay: a renamed knob is written under its new name, a removed one is left out with a comment
  saying so (never dropped silently), and ``fingerprint.engine_version`` names the target.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pydantic stays off drift's read path, which reads versions only
    from knobfleet.profiles.model import Catalog, Knob, Profile, Scalar


@dataclass(frozen=True)
class Change:
    """One difference between two versions' catalogs."""

    what: str  # added | removed | renamed | changed | metric
    name: str
    detail: str = ""
    new_name: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"what": self.what, "name": self.name, "detail": self.detail, "new_name": self.new_name}


@dataclass(frozen=True)
class CatalogDiff:
    engine: str
    old: str
    new: str
    changes: tuple[Change, ...] = ()

    def of(self, what: str) -> list[Change]:
        return [c for c in self.changes if c.what == what]

    def as_json(self) -> dict[str, Any]:
        return {"engine": self.engine, "old": self.old, "new": self.new,
                "changes": [c.as_json() for c in self.changes]}  # fmt: skip


def _fmt(value: Any) -> str:
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return "unset" if value is None else repr(value) if isinstance(value, str) else str(value).lower() if isinstance(
        value, bool) else str(value)  # fmt: skip


def _changed(a: Knob, b: Knob) -> list[str]:
    out = []
    for attr in ("kind", "type", "choices", "default", "min", "max"):
        x, y = getattr(a, attr), getattr(b, attr)
        if x == y:
            continue
        if attr == "choices" and x is not None and y is not None:  # long lists: what came and went
            gained = [_fmt(c) for c in y if c not in x]
            lost = [_fmt(c) for c in x if c not in y]
            out.append("choices " + " ".join([*(f"+{c}" for c in gained), *(f"-{c}" for c in lost)]))
        else:
            out.append(f"{attr} {_fmt(x)} -> {_fmt(y)}")
    return out


def renamed_to(old: Catalog, new: Catalog, name: str) -> tuple[str | None, str]:
    """Where ``name`` (a knob of ``old`` that ``new`` lacks) went, and on whose word: the new version's rename
    table, the old version's deprecation of it, or an alias the new version accepts. (None, "") when nowhere."""
    if name in new.renamed:
        return new.renamed[name], f"{new.engine} {new.version}'s rename table"
    knob = old.knobs.get(name)
    if knob is not None and knob.replacement and knob.replacement in new.knobs:
        return knob.replacement, f"deprecated in {old.engine} {old.version}"
    if knob is not None and knob.kind == "flag":
        alias = next((n for n, k in new.knobs.items() if k.kind == "flag" and name in k.aliases), None)
        if alias is not None:
            return alias, "an alias the new version still accepts"
    alias = next((n for n, k in new.knobs.items() if k.kind == "env" and name in k.aliases), None)
    if alias is not None:
        return alias, "an alias the new version still reads"
    return None, ""


def diff(old: Catalog, new: Catalog) -> CatalogDiff:
    """What changed from ``old`` to ``new`` (same engine), sorted by name within each kind of change."""
    changes: list[Change] = []
    for name in sorted(set(old.knobs) - set(new.knobs)):
        to, why = renamed_to(old, new, name)
        if to is not None:
            changes.append(Change("renamed", name, why, to))
        else:
            knob = old.knobs[name]
            told = knob.description.removeprefix("Deprecated.").strip()
            said = f"deprecated in {old.version}" + (f": {told}" if told else "") if knob.deprecated else ""
            note = new.removed.get(name, "")
            inferred = note.startswith(("last in ", "added in "))  # knobfleet's words from the versions themselves
            changes.append(Change("removed", name, said if said or inferred else note))
    renamed_targets = {c.new_name for c in changes if c.what == "renamed"}
    for name in sorted(set(new.knobs) - set(old.knobs)):
        if name not in renamed_targets:
            changes.append(Change("added", name, new.knobs[name].kind))
    for name in sorted(set(old.knobs) & set(new.knobs)):
        what = _changed(old.knobs[name], new.knobs[name])
        if what:
            changes.append(Change("changed", name, "; ".join(what)))
    om = old.serve.metrics.model_dump() if old.serve.metrics else {}
    nm = new.serve.metrics.model_dump() if new.serve.metrics else {}
    for role in sorted(set(om) | set(nm)):
        if om.get(role) != nm.get(role):
            changes.append(Change("metric", role, f"{om.get(role) or 'none'} -> {nm.get(role) or 'none'}"))
    return CatalogDiff(old.engine, old.version or "?", new.version or "?", tuple(changes))


@dataclass(frozen=True)
class Move:
    """One knob of a profile that the target version does not have under its name."""

    section: str  # env | args
    name: str
    value: Scalar
    new_name: str | None  # renamed to; None: removed
    note: str = ""
    inherited: bool = False  # set by a parent profile, not the file being migrated


@dataclass
class Migration:
    """What ``migrate_text`` did: the new text (None when nothing changes), the knobs moved, and why not."""

    text: str | None
    moves: list[Move] = field(default_factory=list)
    reason: str = ""


def moves_for(profile: Profile, target: Catalog, leaf_env: set[str], leaf_args: set[str]) -> list[Move]:
    """The profile's knobs the target version lacks (``allow_unknown`` ones stay as they are), each with the
    name it has there, or None when it is gone."""
    out: list[Move] = []
    for section, values, leaf in (("env", profile.env, leaf_env), ("args", profile.args, leaf_args)):
        for name, value in values.items():
            if name in profile.allow_unknown or name in target.knobs:
                continue
            if section == "args" and target.flag_alias(name) is not None:
                continue  # still accepted under that spelling
            if section == "env" and not target.is_engine_env(name):
                continue  # not the engine's variable: the catalog does not speak for it
            new = target.renamed.get(name)
            note = "" if new is not None else target.removed.get(name, f"not in {target.engine} {target.version}")
            out.append(Move(section, name, value, new, note, inherited=name not in leaf))
    return out


_SECTION_RE = re.compile(r"^(env|args|fingerprint):\s*(\{\s*\}|null|~)?\s*(#.*)?$")  # a block, or empty
_KEY_RE = re.compile(r"^(\s+)[\"']?(--)?([A-Za-z0-9_.-]+)[\"']?\s*:(.*)$")
_VERSION_LINE = re.compile(r"^version:\s*(\d+)\s*(#.*)?$")


def _yaml_scalar(value: Scalar) -> str:
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):  # YAML 1.1 reads 1e-05 (no dot) as text: 1.0e-05
        text = repr(value)
        mantissa, e, exp = text.partition("e")
        return f"{mantissa if '.' in mantissa else mantissa + '.0'}{e}{exp}" if e else text
    return json.dumps(value, ensure_ascii=False)  # a JSON string is a YAML double-quoted scalar


@dataclass
class _Blocks:
    """A profile file's lines and where its top-level ``env``/``args``/``fingerprint`` blocks start."""

    lines: list[str]
    sections: dict[str, int] = field(default_factory=dict)  # section -> its header's line index
    empty: set[str] = field(default_factory=set)  # ``env: {}`` / ``env: null``: a section with no key yet

    def section_end(self, start: int) -> int:
        lines = self.lines
        if lines[start].split(":")[0] in self.empty:
            return start + 1
        j = start + 1
        while j < len(lines) and (not lines[j].strip() or lines[j].startswith((" ", "\t", "#"))):
            j += 1
        while j - 1 > start and not lines[j - 1].strip():
            j -= 1
        return j

    def keys_of(self, name: str) -> dict[str, int]:
        start = self.sections.get(name)
        if start is None:
            return {}
        lines = self.lines
        return {m.group(3): j for j in range(start + 1, self.section_end(start)) if (m := _KEY_RE.match(lines[j]))}

    def indent_of(self, name: str) -> str:
        """The indent of the section's keys (what an added key must use), two spaces in a new or empty one."""
        for j in self.keys_of(name).values():
            m = _KEY_RE.match(self.lines[j])
            if m:
                return m.group(1)
        return "  "


@dataclass
class _Edits:
    """What ``migrate_text`` writes: replacement lines by line index, and the lines added at each section's end."""

    lines: dict[int, list[str]] = field(default_factory=dict)  # line index -> replacement lines
    appends: dict[str, list[str]] = field(default_factory=lambda: {"env": [], "args": [], "fingerprint": []})


def _blocks(lines: list[str], touched: set[str]) -> _Blocks | str:
    """Where the file's sections are, or why it cannot be edited line by line (a flow mapping it would edit)."""
    doc = _Blocks(lines)
    for i, line in enumerate(lines):
        m = _SECTION_RE.match(line)
        if m:
            doc.sections[m.group(1)] = i
            if m.group(2):
                doc.empty.add(m.group(1))
        elif re.match(r"^(env|args|fingerprint):\s*[{\[]", line) and line.split(":")[0] in touched:
            return (f"line {i + 1}: {line.split(':')[0]} is a flow mapping; write it as one "
                    "key per line to migrate it")  # fmt: skip
    return doc


def _refusal(doc: _Blocks, mv: Move) -> str | None:
    """Why ``mv`` cannot be applied to this file line by line (None: it can)."""
    if mv.new_name is not None and mv.new_name in doc.keys_of(mv.section):
        return (f"{mv.section}.{mv.new_name} is already set in this file, and "
                f"{mv.name} is renamed to it; keep one of the two by hand")  # fmt: skip
    at_line = doc.keys_of(mv.section).get(mv.name)
    if at_line is not None and not mv.inherited:
        km = _KEY_RE.match(doc.lines[at_line])
        shown = km.group(4).split(" #")[0].strip() if km else ""
        if shown in ("|", ">", "|-", ">-") or (shown.startswith(("[", "{")) and not shown.endswith(("]", "}"))):
            return (f"line {at_line + 1}: {mv.name} has a value over several lines; "
                    "migrate it by hand")  # fmt: skip
    return None


def _move(doc: _Blocks, mv: Move, engine_version: str, edits: _Edits) -> None:
    """One knob moved: renamed in place or commented out when set in this file, else overridden at the section's
    end (``old: null`` plus the new name)."""
    lines = doc.lines
    start = doc.sections.get(mv.section)
    at = None
    if start is not None and not mv.inherited:
        for j in range(start + 1, doc.section_end(start)):
            m = _KEY_RE.match(lines[j])
            if m and m.group(3) == mv.name:
                at = j
                break
    if at is not None:
        m = _KEY_RE.match(lines[at])
        assert m is not None
        indent, dashes, rest = m.group(1), m.group(2) or "", m.group(4)
        if mv.new_name is not None:
            edits.lines[at] = [f"{indent}{dashes}{mv.new_name}:{rest}"]
        else:
            value = rest.split(" #")[0].rstrip()
            edits.lines[at] = [f"{indent}# {dashes}{mv.name}:{value}  # removed in {engine_version}: {mv.note}"]
    else:
        why = f"renamed to {mv.new_name}" if mv.new_name else f"removed: {mv.note}"
        pad = doc.indent_of(mv.section)
        edits.appends[mv.section].append(f"{pad}{mv.name}: null  # {why} in {engine_version}")
        if mv.new_name is not None:
            edits.appends[mv.section].append(f"{pad}{mv.new_name}: {_yaml_scalar(mv.value)}")


def _engine_version(doc: _Blocks, engine_version: str, fingerprint: dict[str, Any] | None, edits: _Edits) -> None:
    """``fingerprint.engine_version`` set (or added); a file without a fingerprint gets the inherited one's fields."""
    lines = doc.lines
    fp = doc.sections.get("fingerprint")
    fp_line = f"{doc.indent_of('fingerprint')}engine_version: {_yaml_scalar(engine_version)}"
    if fp is not None:
        found = next(
            (j for j in range(fp + 1, doc.section_end(fp)) if (m := _KEY_RE.match(lines[j])) and m.group(3) ==
             "engine_version"), None)  # fmt: skip
        if found is not None:
            edits.lines[found] = [fp_line]
        else:
            edits.appends["fingerprint"].append(fp_line)
    else:
        kept = {k: v for k, v in (fingerprint or {}).items() if v is not None and k != "engine_version"}
        edits.appends["fingerprint"] += [f"  {k}: {_yaml_scalar(v)}" for k, v in kept.items()] + [fp_line]


def _emptied(doc: _Blocks, edits: _Edits) -> set[int]:
    """The sections whose every key was removed (written ``env: {}``: a bare ``env:`` is null)."""
    emptied: set[int] = set()
    for name, start in doc.sections.items():
        keys = [j for j in range(start + 1, doc.section_end(start)) if _KEY_RE.match(doc.lines[j])]
        live = [j for j in keys if not edits.lines.get(j, [""])[0].lstrip().startswith("#")]
        if keys and not live and not edits.appends.get(name):
            emptied.add(start)
    return emptied


def _written(doc: _Blocks, edits: _Edits, version_at: int, bump_to: int, pin: str | None) -> list[str]:
    """The file's lines with the edits, the appends, the bumped ``version:`` and the pinned ``engine_version:``."""
    lines, sections, empty, appends = doc.lines, doc.sections, doc.empty, edits.appends
    emptied = _emptied(doc, edits)
    out: list[str] = []
    tails: dict[int, str] = {}
    for name in ("env", "args", "fingerprint"):
        if appends[name] and name in sections:
            tails[doc.section_end(sections[name]) - 1] = name
    pin_at = next((i for i, ln in enumerate(lines) if re.match(r"^engine_version:", ln)), None)
    for i, line in enumerate(lines):
        if i == pin_at and pin is not None:
            out.append(f"engine_version: {_yaml_scalar(pin)}")
            continue
        if i == version_at:
            m = _VERSION_LINE.match(line)
            assert m is not None
            out.append(f"version: {bump_to}" + (f"  {m.group(2)}" if m.group(2) else ""))
            if pin is not None and pin_at is None:  # pinned by a parent: this file pins the new version itself
                out.append(f"engine_version: {_yaml_scalar(pin)}")
        elif i in emptied:
            out.append(line.split(":")[0] + ": {}" + (f"  #{line.split('#', 1)[1]}" if "#" in line else ""))
        elif line.split(":")[0] in empty and i == sections.get(line.split(":")[0]) and appends[line.split(":")[0]]:
            out.append(line.split(":")[0] + ":")  # ``env: {}`` gets its first keys: a block again
        else:
            out.extend(edits.lines.get(i, [line]))
        if i in tails:
            out.extend(appends[tails[i]])
    for name in ("env", "args", "fingerprint"):
        if appends[name] and name not in sections:
            out.append(f"{name}:")
            out.extend(appends[name])
    return out


def migrate_text(
    text: str,
    moves: list[Move],
    engine_version: str,
    bump_to: int,
    fingerprint: dict[str, Any] | None = None,
    pin: str | None = None,
) -> Migration:
    """``text`` (one profile file, block style) with ``moves`` applied, ``version: bump_to`` and
    ``fingerprint.engine_version: engine_version``. A knob set in this file is renamed in place (its comment kept)
    or commented out when removed; an inherited one is overridden here (``old: null`` plus the new name). A file
    without a ``fingerprint`` gets one: the inherited ``fingerprint`` fields (a file's fingerprint replaces its
    parent's whole) plus the engine version. ``pin`` (the profile pins the version it runs): its ``engine_version:``
    line becomes that, or one is added; the migrated profile is then the upgrade itself. Flow-style
    ``env``/``args``/``fingerprint`` mappings cannot be edited line by line: refused with the reason."""
    lines = text.splitlines()
    doc = _blocks(lines, {mv.section for mv in moves} | {"fingerprint"})
    if isinstance(doc, str):
        return Migration(None, moves, doc)
    version_at = next((i for i, ln in enumerate(lines) if _VERSION_LINE.match(ln)), None)
    if version_at is None:
        return Migration(None, moves, "no `version: N` line to bump")
    edits = _Edits()
    for mv in moves:
        refused = _refusal(doc, mv)
        if refused is not None:
            return Migration(None, moves, refused)
        _move(doc, mv, engine_version, edits)
    _engine_version(doc, engine_version, fingerprint, edits)
    return Migration("\n".join(_written(doc, edits, version_at, bump_to, pin)) + "\n", moves)


def problems_on(profile: Profile, catalog: Catalog) -> list[str]:
    """The resolved profile checked against another version's catalog, one line per knob (``env.NAME: why``,
    ``args.NAME: why``): what that version lacks (with the replacement its rename tables name) or rejects."""
    from knobfleet.profiles.catalog import check_env, check_flag

    out = []
    for name, value in profile.env.items():
        why = check_env(catalog, name, value, profile.allow_unknown)
        if why:
            out.append(f"env.{name}: {why}")
    for name, value in profile.args.items():
        why = check_flag(catalog, name, value, profile.allow_unknown)
        if why:
            out.append(f"args.{name}: {why}")
    return out

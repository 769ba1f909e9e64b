"""Engine catalogs: which knobs an engine knows, their types and ranges; value checks with did-you-mean."""

from __future__ import annotations

import difflib
import hashlib
import json
import math
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from knobfleet import paths
from knobfleet.errors import KnobfleetError, ProfileError
from knobfleet.profiles import safeyaml
from knobfleet.profiles.model import ENV_NAME_RE, FLAG_NAME_RE, Catalog, Knob, Scalar

CATALOG_MAX_BYTES = 4 * 1024 * 1024  # generated catalogs list every knob an engine reads (SGLang: ~230 KB)


def _read(path: Path) -> dict[str, Any]:
    where = paths.display(path)
    try:
        data = safeyaml.load_file(path, max_bytes=CATALOG_MAX_BYTES)
    except safeyaml.YamlProblem as exc:
        raise ProfileError([f"{where}: {exc}"]) from None
    if not isinstance(data, dict):
        raise ProfileError([f"{where}: expected a mapping with engine, env_prefixes and knobs"])
    return data


def _validate(data: dict[str, Any], where: str) -> Catalog:
    try:
        return Catalog.model_validate(data)
    except ValidationError as exc:
        from knobfleet.profiles.loader import pydantic_problems

        raise ProfileError([f"{where}: {p}" for p in pydantic_problems(exc)]) from None


def load_catalog(path: Path) -> Catalog:
    return _validate(_read(path), paths.display(path))


def generated_file(engine: str, directory: Path | None = None, version: str | None = None) -> Path:
    """Where a synced catalog lives: ``generated/<engine>.yaml`` for the pinned version (``version`` None), and
    ``generated/<engine>@<version>.yaml`` for every other version `knobfleet catalog sync --version` keeps."""
    base = (directory or paths.catalogs_dir()) / "generated"
    return base / (f"{engine}.yaml" if version is None else f"{engine}@{version}.yaml")


def catalog_files(engine: str, directory: Path | None = None, version: str | None = None) -> list[Path]:
    """The files an engine's catalog is made of: ``generated/<engine>.yaml`` (from the engine's own registry,
    `knobfleet catalog sync`; ``generated/<engine>@<version>.yaml`` for another synced version) plus the curated
    ``<engine>.overlay.yaml`` (one for every version); or one hand-written ``<engine>.yaml`` for an engine without
    a registry to sync from. A project's own ``<engine>.overlay.yaml`` (its ``catalogs`` folder) comes last, on
    top; a project may also add a whole ``<engine>.yaml``."""
    base = directory or paths.catalogs_dir()
    extra = [d / f"{engine}.overlay.yaml" for d in paths.catalog_overlay_dirs()]
    extra = [f for f in extra if there(f, "catalog overlay")]
    overlay = base / f"{engine}.overlay.yaml"
    if version is not None:
        return [
            generated_file(engine, base, version),
            *([overlay] if there(overlay, "catalog overlay") else []),
            *extra,
        ]
    if there(overlay, "catalog overlay"):
        generated = generated_file(engine, base)
        return [generated, overlay, *extra] if there(generated) else [overlay, *extra]
    own = [d / f"{engine}.yaml" for d in paths.catalog_overlay_dirs() if there(d / f"{engine}.yaml")]
    return [own[0] if own else base / f"{engine}.yaml", *extra]


def there(path: Path, what: str = "catalog file") -> bool:
    """Whether the catalog file at ``path`` is there (False: nothing at that name); anything else there (a FIFO, a
    device, a folder, a dangling symlink, a symlink loop) is a ProfileError naming it, never a file skipped."""
    from knobfleet import safefile

    try:
        return safefile.is_present(path)
    except safefile.FileRefused as exc:
        raise ProfileError([safefile.not_a(paths.display_node(path), exc, what)]) from None


def _merged(files: list[Path]) -> dict[str, Any]:
    if len(files) == 1 and not files[0].name.endswith(".overlay.yaml"):
        return _read(files[0])
    from knobfleet.profiles.merge import merge

    first = _read(files[0])
    overlays = files[1:] if not files[0].name.endswith(".overlay.yaml") else files
    merged = first if overlays is not files else {"engine": first.get("engine"), "knobs": {}}
    lenient = "@" in files[0].name  # another version than the overlay was curated for: it may lack some knobs
    for f in overlays:
        overlay = _read(f)
        try:
            merged = merge(merged, overlay, lenient=lenient)
        except ValueError as exc:
            raise ProfileError([f"{paths.display(f)}: {exc}"]) from None
        merged.setdefault("env_prefixes", overlay.get("env_prefixes", ()))
    return merged


def _cached(files: list[Path]) -> dict[str, Any]:
    """Merged catalog data, cached as JSON under the state dir keyed by the files' content (parsing the
    generated YAML costs ~0.4 s; the cache ~5 ms)."""
    from knobfleet import safefile

    h = hashlib.sha256(CACHE_SCHEMA.encode())
    for f in files:
        try:  # bounded and non-blocking: a FIFO swapped in after the check is refused, never waited on
            raw = safefile.read_bytes(f, CATALOG_MAX_BYTES, "catalog file")
        except safefile.FileRefused as exc:
            raise ProfileError([f"{paths.display(f)}: {exc}"]) from None
        h.update(f.name.encode() + b"\0" + raw + b"\0")
    path = paths.state_dir() / "cache" / "catalogs" / f"{h.hexdigest()}.json"
    try:
        cached = json.loads(safefile.read_cache(path) or "null")
        if isinstance(cached, dict):
            return cached
    except (OSError, ValueError, RecursionError):  # RecursionError: nested too deep to be one of ours
        pass
    data: dict[str, Any] = _merged(files)
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        safefile.write_text(path, json.dumps(data))
    except (OSError, KnobfleetError):
        pass  # only costs time next run
    return data


CACHE_SCHEMA = "catalog-2"


def catalog_for(engine: str, directory: Path | None = None, version: str | None = None) -> Catalog:
    """The engine's catalog: the pinned version's (``version`` None, or the pinned one named), or another synced
    version's, with the renames the other synced versions declare added to its ``renamed`` table. Cached per set of
    synced files, so a version synced or removed in this process is seen."""
    return _catalog_for(engine, directory, version, tuple(p.name for p in _others(engine, directory)))


@cache
def _catalog_for(engine: str, directory: Path | None, version: str | None, _synced: tuple[str, ...]) -> Catalog:
    if version is not None:
        pinned = catalog_for(engine, directory)
        if version == pinned.version or not pinned.generated:
            return pinned
        files = catalog_files(engine, directory, version)
        if not there(files[0]):
            have = ", ".join(synced_versions(engine, directory)) or "none"
            raise ProfileError(
                [
                    f"{paths.display(files[0])}: no catalog for {engine} {version} (synced: {have}); add it with "
                    f"`knobfleet catalog sync {engine} --version {version}`"
                ]
            )
        return with_renames(_validate(_cached(files), paths.display(files[0])), engine, directory)
    files = catalog_files(engine, directory)
    missing = [f for f in files if not there(f)]
    if missing:
        raise ProfileError(
            [
                f"{paths.display(missing[0])}: catalog for engine {engine!r} not found; "
                f"add the file or fix the profile's engine (known: {', '.join(engine_names(directory)) or 'none'})"
            ]
        )
    cat = _validate(_cached(files), paths.display(files[-1]))
    return with_renames(cat, engine, directory) if cat.generated and _others(engine, directory) else cat


catalog_for.cache_clear = _catalog_for.cache_clear  # type: ignore[attr-defined]  # tests reset it


def _others(engine: str, directory: Path | None) -> list[Path]:
    base = generated_file(engine, directory).parent
    return sorted(base.glob(f"{engine}@*.yaml"))


def synced_versions(engine: str, directory: Path | None = None) -> list[str]:
    """Every version of ``engine`` with a synced catalog, oldest first: the pinned one and those kept next to it."""
    found = [p.name.removeprefix(f"{engine}@").removesuffix(".yaml") for p in _others(engine, directory)]
    pinned = generated_file(engine, directory)
    if there(pinned):
        version = _cached([pinned]).get("version")
        if isinstance(version, str) and version not in found:
            found.append(version)
    return sorted(found, key=version_key)


_PRE = {"dev": -4, "a": -3, "alpha": -3, "b": -2, "beta": -2, "rc": -1, "c": -1, "pre": -1, "preview": -1, "post": 1}


def version_key(version: str) -> tuple[Any, ...]:
    """Order of version strings: 0.9.0 < 0.10.0, and a pre-release below its release (0.10.0.dev1 < 0.10.0rc1 <
    0.10.0 < 0.10.0.post1): the release numbers, then the pre/post tag's rank and number."""
    import re

    m = re.match(r"v?(\d+(?:\.\d+)*)[.-]?([a-z]*)[.-]?(\d*)", version.lower())
    if m is None:
        return ((), 0, 0, version)
    release = tuple(int(p) for p in m.group(1).split("."))
    while len(release) > 1 and release[-1] == 0:
        release = release[:-1]  # 0.32 == 0.32.0
    tag = m.group(2)
    return (release, _PRE.get(tag, 0 if not tag else -5), int(m.group(3) or 0), version[m.end() :])


def with_renames(cat: Catalog, engine: str, directory: Path | None) -> Catalog:
    """``cat`` with what the other synced versions of its engine say about names it lacks: a knob of theirs marked
    deprecated with a replacement this version has is renamed; any other is ``removed``, with the nearest version
    that last had it (older) or first has it (newer)."""
    mine = version_key(cat.version or "0")
    datas = [_cached([p]) for p in [generated_file(engine, directory), *_others(engine, directory)] if there(p)]
    datas = [d for d in datas if str(d.get("version")) != cat.version]
    older = sorted((d for d in datas if version_key(str(d.get("version"))) < mine),
                   key=lambda d: version_key(str(d.get("version"))), reverse=True)  # fmt: skip
    newer = sorted((d for d in datas if version_key(str(d.get("version"))) > mine),
                   key=lambda d: version_key(str(d.get("version"))))  # fmt: skip
    found: dict[str, str] = {}
    gone: dict[str, str] = {}
    for data, word in [*((d, "last in") for d in older), *((d, "added in") for d in newer)]:
        for name, knob in (data.get("knobs") or {}).items():
            if name in cat.knobs or name in found or name in gone or cat.flag_alias(name) is not None:
                continue
            new = knob.get("replacement") if isinstance(knob, dict) else None
            if isinstance(new, str) and new in cat.knobs:
                found[name] = new
            else:
                gone[name] = f"{word} {engine} {data.get('version')}"
    renamed = {**{n: v for n, v in found.items() if n not in cat.removed}, **cat.renamed}
    removed = {**{n: v for n, v in gone.items() if n not in renamed}, **cat.removed}
    return cat.model_copy(update={"renamed": renamed, "removed": removed})


def engine_names(directory: Path | None = None) -> list[str]:
    """Every engine with a catalog: a hand-written ``<engine>.yaml`` or an ``<engine>.overlay.yaml``."""
    base = directory or paths.catalogs_dir()
    names = {p.stem for p in base.glob("*.yaml") if "." not in p.stem}
    names |= {p.name.removesuffix(".overlay.yaml") for p in base.glob("*.overlay.yaml")}
    for d in paths.catalog_overlay_dirs():
        names |= {p.stem for p in d.glob("*.yaml") if "." not in p.stem}
    return sorted(names)


@cache
def default_engine(directory: Path | None = None) -> str:
    """The engine of profiles and hosts that name none: the catalog marked ``serve.default: true``."""
    names = engine_names(directory)
    marked = [n for n in names if catalog_for(n, directory).serve.default]
    if len(marked) == 1:
        return marked[0]
    if len(names) == 1:
        return names[0]
    where = paths.display(directory or paths.catalogs_dir())
    raise ProfileError(
        [
            f"{where}: {len(marked)} catalogs are marked serve.default: true; mark exactly one "
            "(or name the engine in every profile)"
        ]
    )


def did_you_mean(name: str, candidates: list[str]) -> str:
    match = difflib.get_close_matches(name, candidates, n=1, cutoff=0.75)
    return f"; did you mean {match[0]}?" if match else ""


def _fmt(value: Scalar) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, str) else str(value)


def check_value(knob: Knob, value: Scalar) -> str | None:
    """Why ``value`` is not valid for ``knob``, or None when it is."""
    if knob.type == "bool":
        if knob.kind == "flag" and not isinstance(value, bool):
            return f"expected true (bare flag) or false (omit), got {_fmt(value)}"
        if knob.kind == "env" and not (isinstance(value, bool) or value in (0, 1)):
            return f"expected true/false or 0/1, got {_fmt(value)}"
        return None
    if isinstance(value, bool):
        return f"expected {'an integer' if knob.type == 'int' else 'a ' + knob.type}, got {_fmt(value)}"
    if knob.type == "int" and not isinstance(value, int):
        return f"expected an integer, got {_fmt(value)}"
    if knob.type == "float" and (not isinstance(value, int | float) or not math.isfinite(value)):
        return f"expected a number, got {_fmt(value)}"
    if knob.type == "str" and not isinstance(value, str):
        return f"expected a string, got {_fmt(value)}; quote it"
    if knob.choices is not None and value not in knob.choices:
        allowed = ", ".join(_fmt(c) for c in knob.choices)
        return f"{_fmt(value)} is not one of {allowed}"
    if isinstance(value, int | float) and not isinstance(value, bool):
        lo = -math.inf if knob.min is None else knob.min
        hi = math.inf if knob.max is None else knob.max
        if not lo <= value <= hi:
            lo_s = "" if knob.min is None else f"{knob.min:g}"
            hi_s = "" if knob.max is None else f"{knob.max:g}"
            return f"{_fmt(value)} is out of range; allowed {lo_s}..{hi_s}"
    return None


MAX_INT = 2**63 - 1


def _check_text(value: Scalar) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool) and not -MAX_INT <= value <= MAX_INT:
        return "is a number too large for any engine; use a value within ±9.2e18"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a finite number"
    if isinstance(value, str):
        if "\x00" in value:
            return "contains a NUL byte; remove it"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "is not valid UTF-8 text"
    return None


def gone_from(catalog: Catalog, name: str, dashes: str = "") -> str | None:
    """Why ``name`` is not in this version of the engine, from the engine's rename tables; None when they do not
    name it. The fix names the replacement and the command that rewrites a profile."""
    at = f"{catalog.engine} {catalog.version}" if catalog.version else catalog.engine
    new = catalog.renamed.get(name)
    if new is not None:
        to = f"{catalog.engine}@{catalog.version}" if catalog.version else catalog.engine
        return (f"{at} has no {dashes}{name}: renamed to {dashes}{new}; use {dashes}{new} "
                f"(`knobfleet profiles migrate PROFILE --to {to}` rewrites it)")  # fmt: skip
    note = catalog.removed.get(name)
    if note is not None:
        return f"{at} has no {dashes}{name}: removed ({note}); drop it from the profile"
    return None


def check_env(catalog: Catalog, name: str, value: Scalar, allow_unknown: tuple[str, ...]) -> str | None:
    if not ENV_NAME_RE.fullmatch(name):
        return "invalid env var name; use letters, digits and _ and do not start with a digit"
    problem = _check_text(value)
    if problem:
        return problem
    knob = catalog.knobs.get(name)
    if knob is not None and knob.kind == "env":
        return check_value(knob, value)
    if catalog.is_engine_env(name) and name not in allow_unknown:
        gone = gone_from(catalog, name)
        if gone:
            return gone
        hint = did_you_mean(name, sorted(catalog.env_knobs()))
        fix = hint or f"; add it to allow_unknown if {catalog.engine} really reads it"
        return f"unknown knob{fix}"
    return None


def check_flag(catalog: Catalog, name: str, value: Scalar, allow_unknown: tuple[str, ...]) -> str | None:
    if not FLAG_NAME_RE.fullmatch(name):
        return "invalid flag name; use letters, digits, - and _ without leading dashes"
    problem = _check_text(value)
    if problem:
        return problem
    knob = catalog.knobs.get(name) or catalog.flag_alias(name)
    if knob is not None and knob.kind == "flag":
        return check_value(knob, value)
    if name in allow_unknown:
        return None
    gone = gone_from(catalog, name, "--")
    if gone:
        return gone
    hint = did_you_mean(name, sorted(catalog.flag_knobs()))
    return f"unknown flag{hint or '; add it to allow_unknown if the engine really accepts it'}"

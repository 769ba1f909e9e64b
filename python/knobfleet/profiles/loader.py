"""YAML profile files → ``ProfileDoc`` with one readable line per problem."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from knobfleet import paths, rules
from knobfleet.errors import ProfileError
from knobfleet.profiles import safeyaml
from knobfleet.profiles.model import ProfileDoc

_TOP_LEVEL = ", ".join(ProfileDoc.model_fields)


def _loc(loc: tuple[int | str, ...]) -> str:
    # pydantic appends the union member tried (e.g. "str", "int") to the location; drop those.
    parts = [str(p) for p in loc if p not in {"str", "int", "float", "bool", "none", "tuple", "list"}]
    return ".".join(parts) if parts else "(top level)"


def pydantic_problems(exc: ValidationError) -> list[str]:
    """Turn a pydantic error into ``field: what; fix`` lines, one per distinct field."""
    out: dict[str, str] = {}
    for err in exc.errors():
        where = _loc(err["loc"])
        kind = err["type"]
        value: Any = err.get("input")
        if kind == "extra_forbidden":
            msg = f"unknown field; allowed fields: {_TOP_LEVEL}" if len(err["loc"]) == 1 else "unknown field"
        elif kind == "missing":
            msg = "required field is missing"
        elif kind == "string_pattern_mismatch":
            msg = f"{value!r} is not a valid name; use lowercase letters, digits, '.', '_' and '-'"
        elif kind in {"int_type", "int_parsing"} and where == "version":
            msg = f"expected an integer version such as 3, got {value!r}"
        elif kind == "greater_than_equal":
            msg = f"{value!r} is too small; {err['msg'].lower()}"
        elif kind in {"literal_error", "enum"}:
            msg = f"{value!r} is not allowed; {err['msg'].lower()}"
        elif kind in {"dict_type", "model_type", "model_attributes_type"}:
            msg = f"expected a mapping, got {type(value).__name__}"
        elif where.startswith(("env.", "args.")):
            msg = f"expected a string, integer, number, true/false or null, got {type(value).__name__}"
        else:
            msg = err["msg"][0].lower() + err["msg"][1:]
        out.setdefault(where, f"{where}: {msg}")
    return list(out.values())


FIX = {
    "env": "use letters, digits and _ and do not start with a digit",
    "args": "use letters, digits, - and _ without leading dashes",
}


def _knob_problems(section: str, key: str, value: Any, allowed: set[str]) -> list[str]:
    """A knob's name against the shared rules (naming an invisible character), a loader variable the profile
    does not name in allow_unknown, and a value with a control or invisible character."""
    name = key.removeprefix("--") if section == "args" else key
    shown = rules.shown(key)
    why = rules.check("env_name" if section == "env" else "flag_name", name)
    if why:
        kind = "env var" if section == "env" else "flag"
        if rules.first_invisible(name) is None:
            why = FIX[section]
        return [f"{section}.{shown}: invalid {kind} name; {why}"]
    out = []
    if section == "env" and rules.is_shell_reserved(name):
        return [f"env.{name}: bash will not let the serve script set {name} (read-only); it would exit at start"]
    if section == "env" and rules.is_loader_env(name) and name not in allowed:
        out.append(
            f"env.{name}: a loader variable (it changes what the engine's processes load or run); set it in the "
            f"host vars (knob_serve_host_env.{name}), or name it in this profile's allow_unknown"
        )
    if isinstance(value, str):
        hit = next(((i, c) for i, c in enumerate(value) if c not in "\n\t\x00" and rules.invisible(c)), None)
        if hit is not None:
            out.append(
                f"{section}.{shown}: the value contains {rules.describe_char(hit[1])} at position {hit[0]} "
                "(invisible, or rewrites the terminal); remove it"
            )
    return out


def load_doc(path: Path) -> ProfileDoc:
    """Read one profile file. Raises ProfileError whose lines start with the file's path."""
    where = rules.shown(paths.display(path))
    if path.suffix not in (".yaml", ".yml"):
        raise ProfileError([f"{where}: not a profile file (profile files end in .yaml or .yml); check the path"])
    try:
        data = safeyaml.load_file(path)
    except safeyaml.YamlProblem as exc:
        raise ProfileError([f"{where}: {exc}"]) from None
    if not isinstance(data, dict):
        raise ProfileError([f"{where}: expected a mapping with name, version, env, args; got {type(data).__name__}"])
    if not {"name", "version", "schema_version"} & set(data):
        # never echo a stray file's keys (`render ../../etc/shadow` must not print its first line)
        raise ProfileError([f"{where}: not a knob profile (it has no name or version field); point at a profile file"])
    problems: list[str] = []
    allowed = data.get("allow_unknown")
    allowed = {str(a).removeprefix("--") for a in allowed} if isinstance(allowed, list | tuple) else set()
    for section in ("env", "args"):
        block = data.get(section)
        if isinstance(block, dict):
            for key, value in block.items():
                if not isinstance(key, str):
                    raise ProfileError([f"{where}: {section}.{key!r}: names must be strings; quote it"])
                problems += _knob_problems(section, key, value, allowed)
    if problems:
        raise ProfileError([f"{where}: {p}" for p in problems])
    try:
        doc = ProfileDoc.model_validate(data)
    except ValidationError as exc:
        raise ProfileError([f"{where}: {p}" for p in pydantic_problems(exc)]) from None
    if doc.name != path.stem:
        raise ProfileError(
            [
                f"{where}: name: {doc.name!r} does not match the file name; "
                f"rename the file to {doc.name}.yaml or set name: {path.stem}"
            ]
        )
    return doc

"""YAML profile files → ``ProfileDoc`` with one readable line per problem."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from knobfleet import paths
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


def load_doc(path: Path) -> ProfileDoc:
    """Read one profile file. Raises ProfileError whose lines start with the file's path."""
    where = paths.display(path)
    try:
        data = safeyaml.load_file(path)
    except safeyaml.YamlProblem as exc:
        raise ProfileError([f"{where}: {exc}"]) from None
    if not isinstance(data, dict):
        raise ProfileError([f"{where}: expected a mapping with name, version, env, args; got {type(data).__name__}"])
    for section in ("env", "args"):
        block = data.get(section)
        if isinstance(block, dict):
            for key in block:
                if not isinstance(key, str):
                    raise ProfileError([f"{where}: {section}.{key}: names must be strings; quote it"])
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

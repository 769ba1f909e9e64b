"""Dump SGLang's knob registry from an installed SGLang as one JSON document (stdout). Runs under the SGLang
venv's python::

    SGLANG_USE_CPU_ENGINE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VENV/bin/python sglang_dump.py > dump.json

Standalone on purpose (stdlib + the installed sglang only; knobfleet is not importable there), like
``vllm_dump.py``. The dump has the shape ``sglang_source.dump_wheel`` gives, so ``build.build_catalog`` takes
either. It imports ``sglang.srt.environ`` and ``sglang.srt.server_args`` (no server, no network) and reads:

- env: every ``EnvField`` descriptor of the live ``sglang.srt.environ.Envs`` class: its type from the ``Env*``
  class (``EnvBoolWithAlias`` is an ``EnvBool``), its default as evaluated at import, the deprecated alias
  and the secret mark; the comment above its line in environ.py as its description; plus the names in
  ``_DEPRECATED_ENVS`` (still read, with a warning);
- flags: the parser ``sglang serve`` / ``python -m sglang.launch_server`` parse with
  (``prepare_server_args``: ``argparse.ArgumentParser`` + ``ServerArgs.add_cli_args``), each action with its
  option strings, action kind, type, nargs, choices, default and help;
- model: how the model is passed (the ``--model-path`` flag).

Plugins (``sglang.srt.plugins.load_plugins``, which ``launch_server`` runs first) are not loaded: the dump is
of SGLang itself. Env defaults that depend on the machine or on other variables (a callable, evaluated when the
variable is read, or an import-time call such as ``os.path.expanduser('~/.cache/sglang')``) are recorded as their
source expression (``default_expr``), never as the value this machine computed, so the dump is the same on every
machine; the SGLANG_/SGL_ variables of the caller's environment do not reach the import (``sync`` drops them).
"""

from __future__ import annotations

import argparse
import ast
import enum
import importlib
import inspect
import json
import logging
import os
import re
import sys
import warnings
from typing import Any

try:  # imported as part of knobfleet (sglang_source, the tests)
    from knobfleet.engines.sync.source_comments import comment_above
except ImportError:  # standalone in the engine's venv (no knobfleet there): this file's folder is sys.path[0]
    from source_comments import comment_above  # type: ignore[import-not-found,no-redef]

JsonScalar = str | int | float | bool | None

# The Env* classes of sglang/srt/environ.py and the type each reads; a subclass (EnvBoolWithAlias) by its MRO.
ENV_TYPES = {
    "EnvBool": "bool",
    "EnvInt": "int",
    "EnvFloat": "float",
    "EnvStr": "str",
    "EnvTuple": "tuple",
    "EnvJSON": "json",
}
# Calls a default may make and still be the same on every machine (``EnvTuple(tuple())``).
_STATIC_CALLS = frozenset({"tuple", "list", "set", "frozenset", "dict"})
# build.scrub_addresses (knobfleet is not importable here): example addresses other than loopback become HOST.
_ADDRESS = re.compile(r"(?<![0-9.])(?!127\.)(?:[0-9]{1,3}\.){3}[0-9]{1,3}(?!\.?[0-9])")


def scrub_addresses(text: str) -> str:
    return _ADDRESS.sub("HOST", text)


def _flat(text: str | None) -> str:
    """Help text with whitespace collapsed, example addresses scrubbed; "" for None and SUPPRESS."""
    if not text or text == argparse.SUPPRESS:
        return ""
    return scrub_addresses(" ".join(str(text).split()))


def _plain(value: object) -> object:
    """An enum member as its value (``IntEnum`` defaults), a tuple/set as a list; else unchanged."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((_plain(v) for v in value), key=lambda v: (type(v).__name__, str(v)))
    return value


def _scalar(value: object) -> tuple[bool, JsonScalar | list[JsonScalar]]:
    """(True, json value) when ``value`` is a JSON scalar or a list of them (after ``_plain``)."""
    value = _plain(value)
    if value is None or isinstance(value, str | bool | int | float):
        return True, value
    if isinstance(value, list) and all(v is None or isinstance(v, str | bool | int | float) for v in value):
        return True, list(value)
    return False, None


# --- env --------------------------------------------------------------------------------------------


def env_source_facts(source: str, class_name: str = "Envs") -> dict[str, tuple[str, ast.expr | None]]:
    """``{name: (comment above it, its default's expression)}`` for the fields of ``class_name`` in ``source``."""
    tree = ast.parse(source)
    lines = source.splitlines()
    out: dict[str, tuple[str, ast.expr | None]] = {}
    for node in tree.body:
        if not (isinstance(node, ast.ClassDef) and node.name == class_name):
            continue
        for stmt in node.body:
            if (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)
                and isinstance(stmt.value, ast.Call)
            ):
                call = stmt.value
                out[stmt.targets[0].id] = (comment_above(lines, stmt.lineno), call.args[0] if call.args else None)
    return out


def is_static(node: ast.expr | None) -> bool:
    """Whether a default expression gives the same value on every machine: literals, arithmetic, names and
    attributes (module constants, enum members), and ``tuple()``-like calls of those; not ``os.path.expanduser``,
    ``os.cpu_count()``, ``os.environ.get(...)`` or a lambda."""
    if node is None:
        return True
    for sub in ast.walk(node):
        if isinstance(sub, ast.Lambda | ast.NamedExpr | ast.Await | ast.Yield | ast.YieldFrom):
            return False
        if isinstance(sub, ast.Call) and not (isinstance(sub.func, ast.Name) and sub.func.id in _STATIC_CALLS):
            return False
    return True


def env_type(field: object) -> tuple[str, str]:
    """(type, Env* class name) of an EnvField descriptor, by the first known Env* class in its MRO."""
    cls = type(field)
    for base in cls.__mro__:
        if base.__name__ in ENV_TYPES:
            return ENV_TYPES[base.__name__], cls.__name__
    return "str", cls.__name__


def _source_text(node: ast.expr | None, value: object) -> str:
    if node is not None:
        return ast.unparse(node)
    return str(getattr(value, "__qualname__", None) or getattr(value, "__name__", None) or type(value).__name__)


def env_entry(name: str, field: Any, comment: str = "", expr: ast.expr | None = None) -> dict[str, Any]:
    """One ``Envs`` descriptor as a dump entry (see module doc for the default rule)."""
    type_, annotation = env_type(field)
    entry: dict[str, Any] = {"name": name, "annotation": annotation, "type": type_}
    default = getattr(field, "default", None)
    if callable(default) or not is_static(expr):
        entry["default_expr"] = _source_text(expr, default)
    else:
        ok, val = _scalar(default)
        if ok:
            entry["default"] = val
        else:
            entry["default_expr"] = _source_text(expr, default)
    deprecated_name = getattr(field, "deprecated_name", None)
    if deprecated_name:
        entry["aliases"] = [str(deprecated_name)]
    if getattr(field, "secret", False):
        entry["secret"] = True
    entry["description"] = comment
    return entry


def deprecated_entry(name: str, deprecation: Any) -> dict[str, Any]:
    """One ``_DEPRECATED_ENVS`` item (a ``_DeprecatedEnv``: replacement, transform, note) as a dump entry."""
    entry: dict[str, Any] = {"name": name, "type": "str", "deprecated": True}
    replacement = getattr(deprecation, "replacement", None)
    if replacement:
        entry["replacement"] = str(replacement)
    note = getattr(deprecation, "note", None)
    entry["description"] = f"Deprecated. {note}" if note else "Deprecated."
    return entry


def env_registry(
    envs_cls: type,
    field_base: type,
    deprecated: dict[str, Any] | None = None,
    source: str | None = None,
) -> list[dict[str, Any]]:
    """Every ``field_base`` descriptor of ``envs_cls`` (and the ``deprecated`` names it does not declare), sorted;
    descriptions and default expressions from ``source`` (the module's text) where given."""
    facts = env_source_facts(source, envs_cls.__name__) if source else {}
    out: dict[str, dict[str, Any]] = {}
    for attr, field in vars(envs_cls).items():
        if not isinstance(field, field_base):
            continue
        name = str(getattr(field, "name", attr))
        comment, expr = facts.get(attr, ("", None))
        out[name] = env_entry(name, field, comment, expr)
    for name, deprecation in (deprecated or {}).items():
        if name not in out:
            out[name] = deprecated_entry(name, deprecation)
    return [out[k] for k in sorted(out)]


# --- flags ------------------------------------------------------------------------------------------


def action_kind(action: argparse.Action) -> str:
    """argparse's own actions by name (store, store_true, boolean_optional, …); any other by its class name."""
    kinds: dict[type[argparse.Action], str] = {
        argparse._StoreTrueAction: "store_true",
        argparse._StoreFalseAction: "store_false",
        argparse.BooleanOptionalAction: "boolean_optional",
        argparse._StoreConstAction: "store_const",
        argparse._AppendAction: "append",
        argparse._AppendConstAction: "append_const",
        argparse._CountAction: "count",
        argparse._StoreAction: "store",
    }
    kind = kinds.get(type(action))
    return kind if kind is not None else type(action).__name__


def type_name(t: object) -> str | None:
    """The name of an action's ``type=`` callable (``int``, ``human_readable_int``, ``json_list_type``)."""
    if t is None:
        return None
    if t in (int, float, str, bool):
        return str(getattr(t, "__name__", t))
    name = getattr(t, "__qualname__", None) or getattr(t, "__name__", None)
    if name is None:
        name = getattr(getattr(t, "func", None), "__qualname__", None) or type(t).__name__  # functools.partial
    return str(name)


def _nargs(value: object) -> int | str | None:
    return value if value is None or isinstance(value, int | str) else str(value)


def flag_entry(action: argparse.Action) -> dict[str, Any]:
    """One parser action as a dump entry."""
    kind = action_kind(action)
    help_text = _flat(action.help)
    entry: dict[str, Any] = {
        "dest": action.dest,
        "option_strings": list(action.option_strings),
        "positional": not action.option_strings,
        "action": kind,
        "type": type_name(action.type),
        "nargs": _nargs(action.nargs),
        "required": bool(action.required),
        "help": help_text,
        "hidden": action.help == argparse.SUPPRESS,
    }
    if kind.startswith("Deprecated") or help_text.lower().lstrip("(").startswith("deprecated"):
        entry["deprecated"] = True
    if action.choices is not None:
        ok, ch = _scalar(action.choices if isinstance(action.choices, set | frozenset) else list(action.choices))
        entry["choices"] = ch if ok else [str(c) for c in action.choices]
    if action.default is not argparse.SUPPRESS:
        ok, default = _scalar(action.default)
        if ok:
            entry["default"] = default
        else:
            entry["default_repr"] = type(action.default).__name__
    return entry


def flags(parser: argparse.ArgumentParser) -> list[dict[str, Any]]:
    """Every action of ``parser`` but ``--help``, sorted like ``sglang_source`` sorts (dest, option strings)."""
    out = [flag_entry(a) for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    out.sort(key=lambda e: (e["dest"], e["option_strings"]))
    return out


def model_section(flag_list: list[dict[str, Any]]) -> dict[str, Any]:
    """How the model is passed: the first long option of the ``model_path`` action."""
    for entry in flag_list:
        if entry["dest"] == "model_path":
            longs = [o for o in entry["option_strings"] if o.startswith("--")]
            if longs:
                return {"style": "flag", "flag": longs[0][2:], "launcher": "python -m sglang.launch_server"}
    raise RuntimeError("SGLang's parser has no model_path flag")


def make_dump(version: str, env: list[dict[str, Any]], flag_list: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "engine": "sglang",
        "version": version,
        "source": {
            "install": f"sglang {version} (imported)",
            "env": "sglang.srt.environ.Envs (EnvField descriptors, _DEPRECATED_ENVS)",
            "flags": "sglang serve argument parser (ServerArgs.add_cli_args)",
        },
        "env": env,
        "flags": flag_list,
        "model": model_section(flag_list),
    }


# --- the installed engine -----------------------------------------------------------------------------


def serve_parser(server_args: Any) -> argparse.ArgumentParser:
    """The parser ``prepare_server_args`` (``sglang serve``, ``python -m sglang.launch_server``) builds."""
    parser = argparse.ArgumentParser(prog="sglang serve")
    server_args.ServerArgs.add_cli_args(parser)
    return parser


def main() -> int:
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    sys.argv = [sys.argv[0]]
    from importlib.metadata import version as dist_version

    environ = importlib.import_module("sglang.srt.environ")
    server_args = importlib.import_module("sglang.srt.server_args")
    path = inspect.getsourcefile(environ)
    source = None
    if path is not None:
        with open(path, encoding="utf-8") as fh:
            source = fh.read()
    env = env_registry(environ.Envs, environ.EnvField, getattr(environ, "_DEPRECATED_ENVS", {}), source)
    flag_list = flags(serve_parser(server_args))
    doc = make_dump(dist_version("sglang"), env, flag_list)
    json.dump(doc, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

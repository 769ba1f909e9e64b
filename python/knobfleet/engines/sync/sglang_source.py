"""Read SGLang's knob registry from its wheel, without importing it (no torch, no CUDA).

``pip download --no-deps sglang==VERSION`` puts the wheel in a cache folder; the wheel is opened as a zip and
its source parsed with ``ast``:

- env: ``sglang/srt/environ.py``, class ``Envs``: one ``NAME = EnvBool(default) | EnvInt | EnvFloat | EnvStr |
  EnvTuple | EnvJSON | Env*WithAlias(default, deprecated_name=OLD)`` per variable, with the comment above it;
  plus ``_DEPRECATED_ENVS`` (names still read, with a warning, and maybe forwarded to a replacement);
- flags: the ``A[T, "help"]`` / ``A[T, Arg(help=..., aliases=[...], choices=..., cli_name=..., no_cli=...)]``
  fields of the classes in ``sglang/srt/arg_groups/fields/*.py`` (registered on the parser by
  ``arg_utils.add_cli_args_from_dataclass``: ``--field-name`` plus aliases; bool fields are store_true,
  ``Literal`` gives choices, ``list[T]`` takes ``nargs="+"``), plus the few registered by hand in
  ``ServerArgs.add_cli_args`` (``sglang/srt/server_args.py``);
- choice lists named in ``Arg(choices=NAME)`` are resolved from ``sglang/srt/arg_groups/choices.py``.

The result is a dump in the same shape as ``vllm_dump.py`` prints, for ``build.build_catalog``.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any

from knobfleet.engines.sync.build import scrub_addresses
from knobfleet.engines.sync.source_comments import comment_above

FIELDS_DIR = "sglang/srt/arg_groups/fields/"
ENVIRON = "sglang/srt/environ.py"
SERVER_ARGS = "sglang/srt/server_args.py"
CHOICES = "sglang/srt/arg_groups/choices.py"

_ENV_TYPES = {
    "EnvBool": "bool",
    "EnvBoolWithAlias": "bool",
    "EnvInt": "int",
    "EnvIntWithAlias": "int",
    "EnvFloat": "float",
    "EnvStr": "str",
    "EnvStrWithAlias": "str",
    "EnvTuple": "tuple",
    "EnvJSON": "json",
}
_UNRESOLVED = object()


def download_wheel(version: str, cache_dir: Path, python: str | None = None) -> Path:
    """The sglang wheel of ``version`` in ``cache_dir``, downloaded once with pip (no dependencies)."""
    found = sorted(cache_dir.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    cache_dir.mkdir(parents=True, exist_ok=True)
    cmd = [python or sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
    cmd += ["--quiet", f"sglang=={version}", "-d", str(cache_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    found = sorted(cache_dir.glob(f"sglang-{version}-*.whl"))
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"pip download sglang=={version} failed (exit {proc.returncode}): {proc.stderr[-800:]}")
    return found[0]


# --- small AST helpers ------------------------------------------------------------------------------


def _const_eval(node: ast.expr | None, names: dict[str, Any]) -> Any:
    """Evaluate a constant expression: literals, names of module constants, ``+`` of lists/strings,
    ``set()/list()/frozenset()/sorted()/tuple()`` of those. ``_UNRESOLVED`` for anything else."""
    if node is None:
        return _UNRESOLVED
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        items = [_const_eval(e, names) for e in node.elts]
        if any(i is _UNRESOLVED for i in items):
            return _UNRESOLVED
        return items if not isinstance(node, ast.Tuple) else tuple(items)
    if isinstance(node, ast.Name):
        return names.get(node.id, _UNRESOLVED)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = _const_eval(node.operand, names)
        return -v if isinstance(v, int | float) else _UNRESOLVED
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _const_eval(node.left, names), _const_eval(node.right, names)
        if isinstance(a, str) and isinstance(b, str):
            return a + b
        if isinstance(a, list | tuple | set | frozenset) and isinstance(b, list | tuple | set | frozenset):
            return [*a, *b]
        return _UNRESOLVED
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("set", "list", "frozenset", "tuple", "sorted")
        and not node.keywords
    ):
        if not node.args:
            return []
        v = _const_eval(node.args[0], names)
        if isinstance(v, list | tuple | set | frozenset):
            return sorted(v, key=str) if node.func.id in ("set", "frozenset", "sorted") else list(v)
        return _UNRESOLVED
    return _UNRESOLVED


def _text(node: ast.expr | None, names: dict[str, Any]) -> str:
    v = _const_eval(node, names)
    if isinstance(v, str):
        return v
    return ast.unparse(node) if node is not None else ""


def _module_constants(tree: ast.Module, names: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = dict(names or {})
    for stmt in tree.body:
        target: ast.expr | None = None
        value: ast.expr | None = None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign):
            target, value = stmt.target, stmt.value
        if isinstance(target, ast.Name) and value is not None:
            v = _const_eval(value, out)
            if v is not _UNRESOLVED:
                out[target.id] = v
    return out


def _json_scalar(v: Any) -> tuple[bool, Any]:
    if v is None or isinstance(v, str | bool | int | float):
        return True, v
    if isinstance(v, list | tuple) and all(x is None or isinstance(x, str | bool | int | float) for x in v):
        return True, list(v)
    return False, None


# --- env --------------------------------------------------------------------------------------------


def parse_environ(source: str) -> list[dict[str, Any]]:
    tree = ast.parse(source)
    lines = source.splitlines()
    consts = _module_constants(tree)
    out: dict[str, dict[str, Any]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Envs":
            for stmt in node.body:
                if not (
                    isinstance(stmt, ast.Assign)
                    and len(stmt.targets) == 1
                    and isinstance(stmt.targets[0], ast.Name)
                    and isinstance(stmt.value, ast.Call)
                    and isinstance(stmt.value.func, ast.Name)
                    and stmt.value.func.id.startswith("Env")
                ):
                    continue
                name, call = stmt.targets[0].id, stmt.value
                entry: dict[str, Any] = {"name": name, "annotation": call.func.id}  # type: ignore[attr-defined]
                entry["type"] = _ENV_TYPES.get(call.func.id, "str")  # type: ignore[attr-defined]
                default = _const_eval(call.args[0] if call.args else None, consts)
                ok, val = _json_scalar(default) if default is not _UNRESOLVED else (False, None)
                if ok:
                    entry["default"] = val
                elif call.args:
                    entry["default_expr"] = ast.unparse(call.args[0])
                for kw in call.keywords:
                    if kw.arg == "deprecated_name":
                        entry["aliases"] = [_text(kw.value, consts)]
                    if kw.arg == "secret":
                        entry["secret"] = bool(_const_eval(kw.value, consts))
                entry["description"] = comment_above(lines, stmt.lineno)
                out[name] = entry
        if (
            isinstance(node, ast.AnnAssign | ast.Assign)
            and isinstance(node.value, ast.Dict)
            and "_DEPRECATED_ENVS" in ast.unparse(node.targets[0] if isinstance(node, ast.Assign) else node.target)
        ):
            for key, val in zip(node.value.keys, node.value.values, strict=True):
                if not (isinstance(key, ast.Constant) and isinstance(key.value, str)) or key.value in out:
                    continue
                entry = {"name": key.value, "type": "str", "deprecated": True}
                if isinstance(val, ast.Call):
                    for kw in val.keywords:
                        if kw.arg == "replacement":
                            entry["replacement"] = _text(kw.value, consts)
                        if kw.arg == "note":
                            entry["description"] = "Deprecated. " + _text(kw.value, consts)
                    for pos, arg in zip(("replacement", "transform", "note"), val.args, strict=False):
                        if pos == "replacement":
                            entry["replacement"] = _text(arg, consts)
                entry.setdefault("description", "Deprecated.")
                out[key.value] = entry
    return [out[k] for k in sorted(out)]


# --- flags ------------------------------------------------------------------------------------------


def _unwrap_optional(node: ast.expr) -> ast.expr:
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "Optional":
        return node.slice
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "Union":
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        rest = [e for e in elts if not (isinstance(e, ast.Constant) and e.value is None)]
        if len(rest) == 1:
            return rest[0]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        parts = [node.left, node.right]
        rest = [p for p in parts if not (isinstance(p, ast.Constant) and p.value is None)]
        if len(rest) == 1:
            return _unwrap_optional(rest[0])
    return node


def _field_flag(stmt: ast.AnnAssign, consts: dict[str, Any]) -> dict[str, Any] | None:
    """The flag an ``A[T, "help"]`` / ``A[T, Arg(...)]`` field registers on the parser, or None (not a CLI field)."""
    parts = _field_arg(stmt, consts)
    if parts is None:
        return None
    field, raw_type, arg, help_node = parts
    cli = _text(arg["cli_name"], consts) if "cli_name" in arg else "--" + field.replace("_", "-")
    aliases = _const_eval(arg.get("aliases"), consts) if "aliases" in arg else []
    names = [cli, *(aliases if isinstance(aliases, list | tuple) else [])]
    entry: dict[str, Any] = {
        "dest": field,
        "option_strings": [str(n) for n in names],
        "positional": False,
        "help": scrub_addresses(" ".join(_text(arg.get("help", help_node), consts).split())),
        "hidden": False,
        "required": False,
        "nargs": None,
    }
    inner = _unwrap_optional(raw_type)
    entry["annotation"] = ast.unparse(raw_type)
    choices = _field_action(entry, inner, arg, consts)
    if "choices" in arg:
        choices = _const_eval(arg["choices"], consts)
        if choices is _UNRESOLVED:
            entry["choices_expr"] = ast.unparse(arg["choices"])
    if choices is not _UNRESOLVED:
        ok, ch = _json_scalar(choices)
        if ok:
            entry["choices"] = ch
    if stmt.value is None:
        entry["required"] = True
    else:
        v = _const_eval(stmt.value, consts)
        ok, val = _json_scalar(v) if v is not _UNRESOLVED else (False, None)
        if ok:
            entry["default"] = val
        else:
            entry["default_expr"] = ast.unparse(stmt.value)
    return entry


def _field_arg(
    stmt: ast.AnnAssign, consts: dict[str, Any]
) -> tuple[str, ast.expr, dict[str, ast.expr], ast.expr | None] | None:
    """A field's name, its type, its ``Arg(...)`` keywords and its help (a bare string after the type), or None
    when it is no CLI field (no ``Arg`` nor help, or ``no_cli=True``)."""
    ann = stmt.annotation
    if not (
        isinstance(ann, ast.Subscript)
        and isinstance(ann.value, ast.Name)
        and ann.value.id in ("A", "Annotated")
        and isinstance(ann.slice, ast.Tuple)
        and len(ann.slice.elts) >= 2
        and isinstance(stmt.target, ast.Name)
    ):
        return None
    field = stmt.target.id
    raw_type, *meta = ann.slice.elts
    arg: dict[str, ast.expr] = {}
    help_node: ast.expr | None = None
    is_arg = False
    for m in meta:
        if isinstance(m, ast.Call) and isinstance(m.func, ast.Name) and m.func.id == "Arg":
            is_arg = True
            arg = {kw.arg: kw.value for kw in m.keywords if kw.arg}
            if m.args:
                arg.setdefault("help", m.args[0])
        elif isinstance(m, ast.Call):
            continue  # Derived(...), NS(...): not a CLI field by itself
        elif help_node is None:
            help_node = m
            is_arg = True
    if not is_arg or bool(_const_eval(arg.get("no_cli"), consts) is True):
        return None
    return field, raw_type, arg, help_node


def _field_action(entry: dict[str, Any], inner: ast.expr, arg: dict[str, ast.expr], consts: dict[str, Any]) -> Any:
    """Set the flag's action, type and nargs in ``entry`` as ``add_cli_args_from_dataclass`` registers them (an
    explicit action; ``Literal`` choices; ``list[T]`` takes ``nargs="+"``; ``bool`` is store_true). Returns the
    ``Literal``'s choices, else ``_UNRESOLVED``."""
    choices: Any = _UNRESOLVED
    if "action" in arg:
        entry["action"] = _text(arg["action"], consts)
        entry["type"] = None
        if "BooleanOptionalAction" in entry["action"]:
            # argparse adds --no-NAME for each long option itself: the registry (the source) never spells it.
            longs = [o for o in entry["option_strings"] if o.startswith("--")]
            entry["option_strings"] += ["--no-" + o[2:] for o in longs]
            entry["nargs"] = 0
    elif isinstance(inner, ast.Subscript) and isinstance(inner.value, ast.Name) and inner.value.id == "Literal":
        lit = _const_eval(inner.slice, consts)
        vals = list(lit) if isinstance(lit, tuple) else [lit]
        choices = vals
        entry["action"] = "store"
        entry["type"] = type(vals[0]).__name__ if vals and vals[0] is not _UNRESOLVED else "str"
    elif (
        isinstance(inner, ast.Subscript)
        and isinstance(inner.value, ast.Name)
        and inner.value.id in ("List", "list")
        and "type_parser" not in arg
    ):
        entry["action"] = "store"
        elem = ast.unparse(inner.slice)
        entry["type"] = elem
        entry["nargs"] = _text(arg["nargs"], consts) if "nargs" in arg else "+"
    elif isinstance(inner, ast.Name) and inner.id == "bool":
        entry["action"] = "store_true"
        entry["type"] = None
        entry["nargs"] = 0
    else:
        entry["action"] = "store"
        if "type_parser" in arg:
            entry["type"] = ast.unparse(arg["type_parser"])
        else:
            entry["type"] = ast.unparse(inner)
        if "nargs" in arg:
            entry["nargs"] = _text(arg["nargs"], consts)
    return choices


def parse_fields(source: str, consts: dict[str, Any]) -> list[dict[str, Any]]:
    tree = ast.parse(source)
    names = _module_constants(tree, consts)
    out = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign):
                    entry = _field_flag(stmt, names)
                    if entry is not None:
                        entry["group"] = node.name
                        out.append(entry)
    return out


def parse_manual_flags(source: str, defaults: dict[str, Any], consts: dict[str, Any]) -> list[dict[str, Any]]:
    """``parser.add_argument(...)`` calls in ``ServerArgs.add_cli_args``."""
    tree = ast.parse(source)
    names = _module_constants(tree, consts)
    out: list[dict[str, Any]] = []
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs"):
        for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "add_cli_args"):
            for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
                if not (isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument"):
                    continue
                opts = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                if not opts:
                    continue
                kw = {k.arg: k.value for k in call.keywords if k.arg}
                dest = _text(kw["dest"], names) if "dest" in kw else opts[0].lstrip("-").replace("-", "_")
                action = _text(kw["action"], names) if "action" in kw else "store"
                entry: dict[str, Any] = {
                    "dest": dest,
                    "option_strings": opts,
                    "positional": False,
                    "action": action,
                    "type": ast.unparse(kw["type"]) if "type" in kw else (None if "StoreTrue" in action else "str"),
                    "help": scrub_addresses(" ".join(_text(kw.get("help"), names).split())),
                    "hidden": False,
                    "required": False,
                    "nargs": 0 if "StoreTrue" in action or action == "store_true" else None,
                    "group": "ServerArgs.add_cli_args",
                }
                if "BooleanOptionalAction" in action:  # argparse adds --no-NAME itself
                    entry["option_strings"] += ["--no-" + o[2:] for o in opts if o.startswith("--")]
                    entry["type"], entry["nargs"] = None, 0
                if action.startswith("Deprecated") or entry["help"].lower().lstrip("(").startswith("deprecated"):
                    entry["deprecated"] = True
                if "choices" in kw:
                    ch = _const_eval(kw["choices"], names)
                    ok, val = _json_scalar(ch) if ch is not _UNRESOLVED else (False, None)
                    if ok:
                        entry["choices"] = val
                    else:
                        entry["choices_expr"] = ast.unparse(kw["choices"])
                if "default" in kw:
                    d = kw["default"]
                    if (
                        isinstance(d, ast.Call)
                        and isinstance(d.func, ast.Name)
                        and d.func.id == "_declared_default"
                        and d.args
                    ):
                        field = _text(d.args[0], names)
                        if field in defaults:
                            entry["default"] = defaults[field]
                    else:
                        v = _const_eval(d, names)
                        ok, val = _json_scalar(v) if v is not _UNRESOLVED else (False, None)
                        if ok:
                            entry["default"] = val
                elif "StoreTrue" in action or action == "store_true":
                    entry["default"] = False
                out.append(entry)
    return out


def _wheel_version(zf: zipfile.ZipFile) -> str:
    for name in zf.namelist():
        if re.fullmatch(r"sglang-[^/]+\.dist-info/METADATA", name):
            for line in zf.read(name).decode("utf-8", "replace").splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
    raise ValueError("wheel has no sglang dist-info METADATA")


def dump_wheel(wheel: Path) -> dict[str, Any]:
    """The knob registry of an sglang wheel as a dump (see module doc)."""
    with zipfile.ZipFile(wheel) as zf:
        version = _wheel_version(zf)

        def read(name: str) -> str:
            return zf.read(name).decode("utf-8")

        choices = _module_constants(ast.parse(read(CHOICES)))
        fields: list[dict[str, Any]] = []
        field_files = sorted(
            n for n in zf.namelist() if n.startswith(FIELDS_DIR) and n.endswith(".py") and n.count("/") == 4
        )
        for name in field_files:
            fields.extend(parse_fields(read(name), choices))
        defaults = {f["dest"]: f["default"] for f in fields if "default" in f}
        manual = parse_manual_flags(read(SERVER_ARGS), defaults, choices)
        env = parse_environ(read(ENVIRON))
    flags = sorted([*fields, *manual], key=lambda e: (e["dest"], e["option_strings"]))
    return {
        "engine": "sglang",
        "version": version,
        "source": {
            "wheel": wheel.name,
            "env": f"{ENVIRON} (class Envs, _DEPRECATED_ENVS)",
            "flags": f"{FIELDS_DIR}*.py (A[T, Arg(...)] fields) + ServerArgs.add_cli_args in {SERVER_ARGS}",
            "files": [str(PurePosixPath(n)) for n in (ENVIRON, CHOICES, SERVER_ARGS, *field_files)],
        },
        "env": env,
        "flags": flags,
        "model": {"style": "flag", "flag": "model-path", "launcher": "python -m sglang.launch_server"},
    }


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    ap = argparse.ArgumentParser(description="dump SGLang's knob registry from its wheel as JSON")
    ap.add_argument("version")
    ap.add_argument("--cache", type=Path, default=Path("/var/cache/knobfleet/wheels"))
    ns = ap.parse_args(argv)
    doc = dump_wheel(download_wheel(ns.version, ns.cache))
    json.dump(doc, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

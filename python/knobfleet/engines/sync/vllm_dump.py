"""Dump vLLM's own knob registry as one JSON document (stdout). Runs under the vLLM venv's python::

    VENV/bin/python vllm_dump.py > dump.json

Standalone on purpose (stdlib + the installed vllm only; knobfleet is not importable there). It reads:

- env: every name in ``vllm.envs.environment_variables`` (what vLLM reads), with the type, default and
  ``Literal`` choices declared for it in envs.py's ``if TYPE_CHECKING:`` block, choices given to
  ``env_with_choices(...)``, and the comment above its registry entry as a description;
- flags: the ``vllm serve`` parser, built the way the ``vllm`` CLI builds it (``ServeSubcommand``), each
  action with its option strings, action kind, type, choices, default and the first paragraph of its help;
- model: how the model is passed (the positional ``model_tag`` after ``serve``).

Values that depend on the machine (defaults computed from $HOME, the CPU count, …) are recorded as the
source expression (``default_expr``), never evaluated, so the dump is the same on every machine.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import logging
import os
import sys
from typing import Any

try:  # imported as part of knobfleet (sglang_source, the tests)
    from knobfleet.engines.sync.source_comments import comment_above
except ImportError:  # standalone in the engine's venv (no knobfleet there): this file's folder is sys.path[0]
    from source_comments import comment_above  # type: ignore[import-not-found,no-redef]

JsonScalar = str | int | float | bool | None


def _mod(name: str) -> Any:
    return importlib.import_module(name)


def _first_paragraph(text: str | None) -> str:
    """The help text up to its first blank line, whitespace collapsed (build.py cuts a sentence from it)."""
    if not text or text == argparse.SUPPRESS:
        return ""
    para: list[str] = []
    for line in text.strip().splitlines():
        if not line.strip():
            break
        para.append(line.strip())
    return " ".join(" ".join(para).split())


def _scalar(value: object) -> tuple[bool, JsonScalar | list[JsonScalar]]:
    """(True, json value) when ``value`` is a JSON scalar or a list/tuple of them."""
    if value is None or isinstance(value, str | bool | int | float):
        return True, value
    if isinstance(value, list | tuple) and all(v is None or isinstance(v, str | bool | int | float) for v in value):
        return True, list(value)
    return False, None


def _literal(node: ast.expr | None) -> tuple[bool, object]:
    if node is None:
        return False, None
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _literal_choices(annotation: ast.expr) -> list[JsonScalar] | None:
    """Choices of ``Literal[...]`` (possibly ``Literal[...] | None``) in an annotation."""
    for node in ast.walk(annotation):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "Literal":
            ok, val = _literal(node.slice)
            if ok:
                vals = list(val) if isinstance(val, tuple) else [val]
                out: list[JsonScalar] = [v for v in vals if isinstance(v, str | int | float | bool)]
                if len(out) == len(vals):
                    return out
    return None


def env_registry(envs: Any) -> list[dict[str, Any]]:
    path = inspect.getsourcefile(envs)
    assert path is not None
    with open(path, encoding="utf-8") as fh:
        source = fh.read()
    lines = source.splitlines()
    tree = ast.parse(source)
    declared: dict[str, tuple[ast.expr, ast.expr | None]] = {}
    choices_from_calls: dict[str, list[JsonScalar]] = {}
    comments: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    declared[stmt.target.id] = (stmt.annotation, stmt.value)
        target: str | None = None
        value: ast.expr | None = None
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            target, value = node.target.id, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target, value = node.targets[0].id, node.value
        if target == "environment_variables" and isinstance(value, ast.Dict):
            for key, val in zip(value.keys, value.values, strict=True):
                if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                    continue
                comments[key.value] = comment_above(lines, key.lineno)
                if (
                    isinstance(val, ast.Call)
                    and isinstance(val.func, ast.Name)
                    and val.func.id in ("env_with_choices", "env_list_with_choices")
                    and len(val.args) >= 3
                ):
                    ok, ch = _literal(val.args[2])
                    if ok and isinstance(ch, list | tuple) and all(isinstance(c, str | int | float) for c in ch):
                        choices_from_calls[key.value] = list(ch)
    out: list[dict[str, Any]] = []
    for name in sorted(envs.environment_variables):
        entry: dict[str, Any] = {"name": name}
        if name in declared:
            annotation, default = declared[name]
            entry["annotation"] = ast.unparse(annotation)
            ok, literal = _literal(default)
            okj, jval = _scalar(literal) if ok else (False, None)
            if okj:
                entry["default"] = jval
            elif default is not None:
                entry["default_expr"] = ast.unparse(default)
            lit = _literal_choices(annotation)
            if lit is not None:
                entry["choices"] = lit
        if name in choices_from_calls:
            entry["choices"] = choices_from_calls[name]
            entry["list"] = False
        entry["description"] = comments.get(name, "")
        out.append(entry)
    return out


def _action_kind(action: argparse.Action) -> str:
    kinds = {
        argparse._StoreTrueAction: "store_true",
        argparse._StoreFalseAction: "store_false",
        argparse.BooleanOptionalAction: "boolean_optional",
        argparse._StoreConstAction: "store_const",
        argparse._AppendAction: "append",
        argparse._CountAction: "count",
        argparse._StoreAction: "store",
    }
    for cls, kind in kinds.items():
        if type(action) is cls:
            return kind
    for cls, kind in kinds.items():
        if isinstance(action, cls):
            return kind
    return type(action).__name__


def _type_name(t: object) -> str | None:
    if t is None:
        return None
    if t in (int, float, str, bool):
        return t.__name__
    name = str(getattr(t, "__qualname__", None) or getattr(t, "__name__", None) or type(t).__name__)
    # vLLM wraps plain types in closures (optional_type(int), parse_type(float), …): name what they wrap.
    inner = [
        c.cell_contents.__name__
        for c in getattr(t, "__closure__", None) or ()
        if c.cell_contents in (int, float, str, bool)
    ]
    if len(inner) == 1:
        return f"{name.split('.')[0]}[{inner[0]}]"
    return name


def serve_parser() -> argparse.ArgumentParser:
    """The ``vllm serve`` parser exactly as the ``vllm`` CLI builds it."""
    argparse_utils = _mod("vllm.utils.argparse_utils")
    try:
        serve = _mod("vllm.entrypoints.cli.serve")
        top = argparse_utils.FlexibleArgumentParser(prog="vllm")
        subparsers = top.add_subparsers(dest="subparser")
        parser: argparse.ArgumentParser = serve.ServeSubcommand().subparser_init(subparsers)
        return parser
    except (ImportError, AttributeError):
        for mod in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args"):
            try:
                make: Any = _mod(mod).make_arg_parser
            except (ImportError, AttributeError):
                continue
            built: argparse.ArgumentParser = make(argparse_utils.FlexibleArgumentParser())
            return built
    raise RuntimeError("cannot find vLLM's serve argument parser")


def flags(parser: argparse.ArgumentParser) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        entry: dict[str, Any] = {
            "dest": action.dest,
            "option_strings": list(action.option_strings),
            "positional": not action.option_strings,
            "action": _action_kind(action),
            "type": _type_name(action.type),
            "nargs": action.nargs if action.nargs is None or isinstance(action.nargs, int | str) else str(action.nargs),
            "required": bool(action.required),
            "help": _first_paragraph(action.help),
            "hidden": action.help == argparse.SUPPRESS,
        }
        if action.choices is not None:
            ok, ch = _scalar(list(action.choices))
            entry["choices"] = ch if ok else [str(c) for c in action.choices]
        ok, default = _scalar(action.default)
        if ok:
            entry["default"] = default
        else:
            entry["default_repr"] = type(action.default).__name__
        out.append(entry)
    out.sort(key=lambda e: (not e["positional"], e["dest"], e["option_strings"]))
    return out


def main() -> int:
    logging.disable(logging.WARNING)
    # vLLM fills in flag help text only when "--help" is on the command line (arg_utils.NEEDS_HELP), and
    # drops --model from the parser for "serve --help": so "--help" without "serve", before vllm loads.
    sys.argv = [sys.argv[0], "--help"]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    vllm = _mod("vllm")
    envs = _mod("vllm.envs")
    parser = serve_parser()
    flag_list = flags(parser)
    positional = [f["dest"] for f in flag_list if f["positional"]]
    doc = {
        "engine": "vllm",
        "version": str(vllm.__version__),
        "source": {
            "env": "vllm.envs.environment_variables (+ TYPE_CHECKING declarations in vllm/envs.py)",
            "flags": "vllm serve argument parser (vllm.entrypoints.cli.serve.ServeSubcommand)",
        },
        "env": env_registry(envs),
        "flags": flag_list,
        "model": {"style": "positional", "subcommand": "serve", "positional": positional[0] if positional else None},
    }
    json.dump(doc, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

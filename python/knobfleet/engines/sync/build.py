"""Registry dump (JSON from ``vllm_dump.py`` or ``sglang_source.dump_wheel``) → catalog. Pure: no I/O.

A generated catalog has the shape of the hand-written ones plus what only a generator knows::

    schema_version: 1
    engine: vllm
    version: 0.32.0            # the engine version it was generated from
    generated: true
    source: ...                # what it was generated from
    env_prefixes: [VLLM_]
    model: {style: positional, subcommand: serve}     # SGLang: {style: flag, flag: model-path}
    knobs:
      max-num-seqs: {kind: flag, type: int, restart: true, description: ...}
      tensor-parallel-size: {..., aliases: [-tp]}     # other spellings the engine accepts
      enable-prefix-caching: {..., type: bool, negation: no-enable-prefix-caching}
      VLLM_CPU_KVCACHE_SPACE: {kind: env, type: int, ...}

Types are mapped conservatively: a value parser we do not know becomes ``str``. Curated metadata (ranges,
better descriptions, knobs from patches) lives in an overlay file merged by ``profiles.merge.merge``; the generated
file is never edited by hand. Everything is sorted, so regenerating from the same engine gives identical bytes.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from knobfleet.profiles.merge import ordered as _ordered

__all__ = ["build_catalog", "render"]

ENV_PREFIXES = {"vllm": ["VLLM_"], "sglang": ["SGLANG_", "SGL_"]}
MAX_DESCRIPTION = 120
_SCALAR_TYPES = ("int", "float", "str", "bool")
# Value parsers of the engines that take a plain int / float (vLLM's human_readable_int also takes "2k").
_INT_PARSERS = re.compile(r"^(human_readable_int(_or_auto)?|int)$")
_WRAPPED = re.compile(r"^[A-Za-z_][\w.<>]*\[(int|float|str|bool)\]$")  # optional_type[int], parse_type[float]
_BOOL_ACTIONS = re.compile(r"(store_true|store_false|boolean_optional|BooleanOptionalAction|StoreTrue)")


# An engine's help text may give a network address as an example; knobfleet's files carry none outside
# 127.0.0.0/8 (nothing connects to them, but a catalog is no place for them): such literals become HOST.
_ADDRESS = re.compile(r"(?<![0-9.])(?!127\.)(?:[0-9]{1,3}\.){3}[0-9]{1,3}(?!\.?[0-9])")


def scrub_addresses(text: str) -> str:
    return _ADDRESS.sub("HOST", text)


def description(text: str | None) -> str:
    """First sentence of ``text``, whitespace collapsed, at most MAX_DESCRIPTION characters; example network
    addresses other than loopback replaced by HOST."""
    flat = scrub_addresses(" ".join((text or "").split()))
    if not flat:
        return ""
    m = re.search(r"(?<=[.!?])\s+(?=[A-Z0-9\"'`(])", flat)
    first = flat[: m.start()] if m else flat
    if len(first) > MAX_DESCRIPTION:
        first = first[: MAX_DESCRIPTION - 1].rstrip() + "…"
    return first


def _flag_type(entry: dict[str, Any]) -> str:
    action = str(entry.get("action") or "store")
    if _BOOL_ACTIONS.search(action):
        return "bool"
    t = entry.get("type")
    if t is None:
        return "str"  # argparse's default type
    t = str(t)
    if t in _SCALAR_TYPES:
        return t
    if _INT_PARSERS.match(t):
        return "int"
    m = _WRAPPED.match(t)
    if m:
        return m.group(1)
    return "str"


def _env_type(entry: dict[str, Any]) -> str:
    t = entry.get("type")
    if t in _SCALAR_TYPES:
        return str(t)
    ann = str(entry.get("annotation") or "")
    ann = re.sub(r"\s*\|\s*None$|^Optional\[(.*)\]$", lambda m: m.group(1) or "", ann).strip()
    if ann in _SCALAR_TYPES:
        return ann
    choices = entry.get("choices")
    if ann.startswith("Literal[") and isinstance(choices, list) and choices:
        kinds = {type(c).__name__ for c in choices}
        if len(kinds) == 1 and next(iter(kinds)) in _SCALAR_TYPES:
            return next(iter(kinds))
    return "str"


def _fits(value: Any, type_: str) -> bool:
    if type_ == "bool":
        return isinstance(value, bool)
    if type_ == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if type_ == "float":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, str)


def _choices(entry: dict[str, Any], type_: str) -> list[Any] | None:
    choices = entry.get("choices")
    if type_ == "bool" or not isinstance(choices, list) or not choices:
        return None
    if not all(_fits(c, type_) for c in choices):
        return None
    return sorted(set(choices), key=lambda c: (str(type(c)), c))


def _knob(kind: str, type_: str, entry: dict[str, Any], choices: list[Any] | None) -> dict[str, Any]:
    knob: dict[str, Any] = {"kind": kind, "type": type_}
    if choices:
        knob["choices"] = choices
    default = entry.get("default")
    if default is not None and _fits(default, type_) and (not choices or default in choices):
        knob["default"] = default
    knob["restart"] = True
    knob["description"] = description(entry.get("description", entry.get("help")))
    if entry.get("deprecated"):
        knob["deprecated"] = True
    if entry.get("replacement"):
        knob["replacement"] = str(entry["replacement"])
    return knob


def env_knob(entry: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    type_ = _env_type(entry)
    knob = _knob("env", type_, entry, _choices(entry, type_))
    aliases = sorted(str(a) for a in entry.get("aliases") or [])
    if aliases:
        knob["aliases"] = aliases
    return str(entry["name"]), knob


def _flag_name(option: str) -> str:
    """``--max-num-seqs`` → ``max-num-seqs``; a short option keeps its dash (``-tp``)."""
    return option[2:] if option.startswith("--") else option


def flag_knob(entry: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The knob of one parser action; None for positionals and actions without a long option."""
    options = [str(o) for o in entry.get("option_strings") or []]
    longs = [o for o in options if o.startswith("--")]
    if entry.get("positional") or not longs:
        return None
    type_ = _flag_type(entry)
    action = str(entry.get("action") or "")
    negation = None
    if "boolean_optional" in action or "BooleanOptionalAction" in action:
        negs = [o for o in longs if o.startswith("--no-") and "--" + o[5:] in longs]
        negation = _flag_name(negs[0]) if negs else None
        longs = [o for o in longs if o != (negs[0] if negs else None)]
    name = _flag_name(longs[0])
    knob = _knob("flag", type_, entry, _choices(entry, type_))
    aliases = [_flag_name(o) for o in options if o != longs[0] and _flag_name(o) != negation]
    if aliases:
        knob["aliases"] = sorted(aliases)
    if negation:
        knob["negation"] = negation
    # The arity the argv reader (module_utils/knob_argv.py) needs beyond the type: a switch is type bool, a
    # valued flag takes one word unless nargs says otherwise (an optional value, a list, a store_const switch).
    nargs = entry.get("nargs")
    if "store_const" in action.lower() or "storeconst" in action.lower():
        nargs = 0
    if type_ != "bool" and nargs not in (None, 1):
        knob["nargs"] = nargs
    return name, knob


def source_text(dump: dict[str, Any]) -> str:
    src = dump.get("source")
    if isinstance(src, dict):
        parts = [f"{k}: {src[k]}" for k in sorted(src) if k != "files"]
        return "; ".join(parts)
    return str(src or "")


def build_catalog(dump: dict[str, Any]) -> dict[str, Any]:
    """A catalog dict from a registry dump (see module doc). Deterministic."""
    engine = str(dump["engine"])
    knobs: dict[str, dict[str, Any]] = {}
    for entry in dump.get("env") or []:
        name, knob = env_knob(entry)
        knobs[name] = knob
    flags: dict[str, dict[str, Any]] = {}
    for entry in dump.get("flags") or []:
        made = flag_knob(entry)
        if made is None:
            continue
        name, knob = made
        if name in flags:  # two actions for one option (deprecated re-registration): keep the first, sorted
            continue
        flags[name] = knob
    for name, knob in flags.items():
        if name in knobs:
            raise ValueError(f"{engine}: {name!r} is both an env var and a flag")
        knobs[name] = knob
    model = dump.get("model") or {}
    model_out = {k: model[k] for k in ("style", "subcommand", "flag") if model.get(k)}
    return {
        "schema_version": 1,
        "engine": engine,
        "version": str(dump["version"]),
        "generated": True,
        "source": source_text(dump),
        "env_prefixes": list(ENV_PREFIXES.get(engine, [])),
        "model": model_out,
        "knobs": {n: _ordered(knobs[n]) for n in sorted(knobs)},
    }


class _Dumper(yaml.SafeDumper):
    """Mappings in block style; short lists in flow style (``choices: [a, b]``), long ones one item a line."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)  # indented block sequences (yamllint's default style)


def _flow_list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    short = sum(len(str(x)) + 2 for x in data) <= 90
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=short)


_Dumper.add_representer(list, _flow_list)


def render(catalog: dict[str, Any], header: str = "") -> str:
    """The catalog as YAML text: fixed key order, leaf lists in flow style, stable across runs."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    body = yaml.dump(
        catalog,
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=120,
    )
    return "\n".join([*lines, body.rstrip("\n")]) + "\n"


def generated_header(catalog: dict[str, Any]) -> str:
    return (
        f"Generated by `knobfleet catalog sync {catalog['engine']}` from {catalog['engine']} {catalog['version']}"
        " — do not edit.\n"
        f"Curated ranges, descriptions and patch knobs go in {catalog['engine']}.overlay.yaml."
    )


# Fields today's ``knobfleet.profiles.model.Catalog`` / ``Knob`` accept (extra="forbid").
V1_CATALOG_FIELDS = ("schema_version", "engine", "env_prefixes", "serve", "knobs")
V1_KNOB_FIELDS = ("kind", "type", "choices", "min", "max", "default", "restart", "description")


def to_v1(catalog: dict[str, Any]) -> dict[str, Any]:
    """The catalog with only the fields today's Catalog model accepts (until the model learns the new ones)."""
    out = {k: catalog[k] for k in V1_CATALOG_FIELDS if k in catalog}
    out["knobs"] = {n: {f: k[f] for f in V1_KNOB_FIELDS if f in k} for n, k in catalog["knobs"].items()}
    return out

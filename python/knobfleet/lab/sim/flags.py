"""SGLang's launch flags for the stand-in, built from ``flags.json`` (generated from the SGLang catalog).

``flags.json`` is written by ``knobfleet.lab.hostfiles.sim_flags`` from
``profiles/catalogs/generated/sglang.yaml``: every flag that SGLang version registers, with its type,
aliases, nargs, choices and default. The parser is a plain argparse parser like SGLang's: prefix
abbreviations stay on (``--tp 2`` is ``--tp-size 2``, an ambiguous prefix such as ``--cuda-graph-max-bs``
is refused), an unknown flag or a bad value exits 2 with argparse's usage error.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

FLAGS_FILE = Path(__file__).with_name("flags.json")
PROG = "launch_server.py"
_TYPES: dict[str, type] = {"int": int, "float": float, "str": str}


def load(path: Path | None = None) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((path or FLAGS_FILE).read_text(encoding="utf-8"))
    return data


def build_parser(spec: dict[str, Any] | None = None) -> argparse.ArgumentParser:
    """An argparse parser accepting exactly the flags in ``spec`` (default: ``flags.json``)."""
    spec = spec if spec is not None else load()
    parser = argparse.ArgumentParser(prog=PROG)
    required = set(spec.get("required") or ())
    for name, flag in sorted(spec["flags"].items()):
        options = [f"--{name}", *(f"--{a}" if not a.startswith("-") else a for a in flag.get("aliases") or ())]
        kwargs: dict[str, Any] = {"dest": name.replace("-", "_"), "default": flag.get("default")}
        if name in required:
            kwargs["required"] = True
        if flag["type"] == "bool":
            # a flag without a value; BooleanOptionalAction (adds --no-NAME) where the catalog names a negation
            kwargs["action"] = argparse.BooleanOptionalAction if flag.get("negation") else "store_true"
        else:
            kwargs["type"] = _TYPES.get(flag["type"], str)
            if flag.get("nargs"):
                kwargs["nargs"] = flag["nargs"]
            if flag.get("choices"):
                kwargs["choices"] = flag["choices"]
        parser.add_argument(*options, **kwargs)
    return parser


def parse(argv: list[str] | None = None, spec: dict[str, Any] | None = None) -> argparse.Namespace:
    return build_parser(spec).parse_args(argv)

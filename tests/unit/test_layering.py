"""The layer order written in docs/ARCHITECTURE.md, checked on every import of the package (read with ast).

An arrow may point only down the order, or stay inside its own package; imports under ``if TYPE_CHECKING:`` are
types, not arrows. The extra rules forbid arrows the order alone would allow. The recorded cases are the five
arrows that broke the rules before the layering work: each must be found."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "python" / "knobfleet"
DOC = REPO / "docs" / "ARCHITECTURE.md"


def block(name: str) -> list[str]:
    m = re.search(rf"```{name}\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert m, f"docs/ARCHITECTURE.md has no ```{name} block"
    return [ln for ln in m.group(1).splitlines() if ln.strip()]


def layers() -> dict[str, int]:
    return {unit: depth for depth, row in enumerate(block("layers")) for unit in row.split()}


def rules() -> list[tuple[str, str]]:
    out = []
    for line in block("rules"):
        src, _, rest = line.partition("!->")
        out.append((src.strip(), rest.split()[0]))
    return out


@dataclass(frozen=True)
class Arrow:
    file: str
    line: int
    source: str  # dotted module importing
    target: str  # dotted module imported


def module_of(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    return ".".join(rel.parts).removesuffix(".__init__")


def is_module(root: Path, dotted: str) -> bool:
    where = root.parent.joinpath(*dotted.split("."))
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()


def absolute(node: ast.ImportFrom, me: str, path: Path) -> str | None:
    """The dotted module a ``from`` import names, a relative one (``from .knob_lean import loads``, ``from . import
    b``) resolved against the importing module ``me``; None for one that climbs past the top package."""
    if node.level == 0:
        return node.module
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    parts = package.split(".")
    if node.level - 1 >= len(parts):
        return None
    base = ".".join(parts[: len(parts) - (node.level - 1)])
    return f"{base}.{node.module}" if node.module else base


def arrows(root: Path) -> list[Arrow]:
    """Every runtime import of a knobfleet module, as (importer, imported) dotted names."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        typing_only = {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
            for n in ast.walk(node)
        }
        me = module_of(path, root)
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and (module := absolute(node, me, path)):
                # ``from knobfleet.fleet import transports`` imports the submodule; ``from knobfleet.x import f`` x
                targets = [
                    f"{module}.{a.name}" if is_module(root, f"{module}.{a.name}") else module for a in node.names
                ]
            for t in dict.fromkeys(targets):
                if t == "knobfleet" or t.startswith("knobfleet."):
                    found.append(Arrow(str(path.relative_to(root.parent)), node.lineno, me, t))
    return found


def unit(dotted: str) -> str:
    """The row name a module belongs to: its package under knobfleet (``fleet``), or the module (``render``)."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def within(dotted: str, prefix: str) -> bool:
    return dotted == f"knobfleet.{prefix}" or dotted.startswith(f"knobfleet.{prefix}.")


def violations(root: Path) -> list[str]:
    order, extra = layers(), rules()
    base = max(order.values())
    out = []
    for a in arrows(root):
        src, dst = unit(a.source), unit(a.target)
        where = f"{a.file}:{a.line}: {a.source} -> {a.target}"
        for name in (src, dst):
            if name not in order:
                out.append(f"{where}: {name} is in no layer of docs/ARCHITECTURE.md")
        if src not in order or dst not in order or src == dst:
            pass
        elif order[dst] < order[src] or (order[dst] == order[src] and order[src] != base):
            out.append(f"{where}: {src} may not import {dst} (layer order)")
        for s, t in extra:
            if within(a.source, s) and within(a.target, t):
                out.append(f"{where}: rule {s} !-> {t}")
    return out


def test_the_package_keeps_the_layer_order() -> None:
    assert violations(PKG) == []


def test_every_package_and_module_has_a_layer() -> None:
    order = layers()
    names = {
        p.stem if p.is_file() else p.name for p in PKG.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()
    }
    assert sorted(names - set(order)) == []


# The five arrows that broke the rules before (a12eb87), one file each as it was there.
BROKEN = {
    "profiles/catalog.py": "def merged():\n    from knobfleet.engines.sync.build import merge\n",
    "engines/sync/__init__.py": "def pinned():\n    from knobfleet.lab.vllm_install import VLLM_VERSION\n",
    "render.py": "from knobfleet.fleet.hostvars import HostVars\n",
    "cli/apply.py": "def cmd_apply(args):\n    from knobfleet.fleet import probe\n",
    "ops/workspace.py": "def wave_plan():\n    from knobfleet.kernel.commands import calibration_line\n",
}


@pytest.mark.parametrize("file", sorted(BROKEN))
def test_each_old_broken_arrow_is_found(tmp_path: Path, file: str) -> None:
    root = tmp_path / "knobfleet"
    (root / file).parent.mkdir(parents=True, exist_ok=True)
    (root / file).write_text(BROKEN[file], encoding="utf-8")
    (root / "__init__.py").write_text("", encoding="utf-8")
    found = violations(root)
    assert len(found) == 1 and found[0].startswith(f"knobfleet/{file}:"), found


def test_a_type_only_import_is_no_arrow(tmp_path: Path) -> None:
    root = tmp_path / "knobfleet"
    root.mkdir()
    (root / "render.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from knobfleet.fleet.hostvars import HostVars\n"
    )
    assert violations(root) == []


# --- what the layer order alone cannot see: cycles inside a package, relative imports, import_module strings ---


def cycles(root: Path) -> list[list[str]]:
    """Every set of modules that import each other, directly or round a loop (function-level imports count;
    ``if TYPE_CHECKING:`` ones do not): the strongly connected components of more than one module."""
    graph: dict[str, set[str]] = {}
    for a in arrows(root):
        if a.source != a.target:
            graph.setdefault(a.source, set()).add(a.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


# import_module with a computed name: the command registry (names in cli/__init__.COMMANDS) and the engines'
# own packages, imported by the catalog dumps and the tiny-model builder inside the engine's venv.
IMPORT_MODULE_OK = ("cli/__init__.py", "engines/sync/sglang_dump.py", "engines/sync/vllm_dump.py",
                    "lab/vllm_tiny_model.py")  # fmt: skip


def hidden_imports(root: Path) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            me = module_of(path, root)
            if isinstance(node, ast.ImportFrom) and node.level > 0 and absolute(node, me, path) is None:
                out.append(f"{rel}:{node.lineno}: a relative import past the top package (the check cannot follow it)")
            call = node.func if isinstance(node, ast.Call) else None
            name = getattr(call, "attr", None) or getattr(call, "id", None)
            if name in ("import_module", "__import__") and rel not in IMPORT_MODULE_OK:
                out.append(f"{rel}:{node.lineno}: {name}() (an import the layer check cannot see)")
    return out


def test_no_module_imports_round_a_loop() -> None:
    assert cycles(PKG) == []


def test_no_import_hides_from_the_layer_check() -> None:
    assert hidden_imports(PKG) == []


@pytest.mark.parametrize(
    ("files", "found"),
    [
        ({"ops/a.py": "from knobfleet.ops import b\n", "ops/b.py": "def f():\n    from knobfleet.ops import a\n"},
         "cycle"),
        ({"ops/a.py": "from knobfleet.ops import b\n", "ops/b.py": "from knobfleet.ops import c\n",
          "ops/c.py": "import knobfleet.ops.a\n"}, "cycle"),
        ({"ops/a.py": "from . import b\n", "ops/b.py": "from .a import f\n"}, "cycle"),
        ({"ops/a.py": "from ...x import y\n"}, "relative"),
        ({"ops/a.py": "import importlib\nm = importlib.import_module('knobfleet.cli')\n"}, "import_module"),
        ({"ops/a.py": "if TYPE_CHECKING:\n    from knobfleet.ops import b\n",
          "ops/b.py": "from knobfleet.ops import a\n"}, None),
    ],
    ids=["two-modules", "three-modules", "relative-cycle", "relative-past-the-top", "import-module-string",
         "type-only-is-no-cycle"],
)  # fmt: skip
def test_each_hidden_shape_makes_the_check_fail(tmp_path: Path, files: dict[str, str], found: str | None) -> None:
    root = tmp_path / "knobfleet"
    for rel, text in {"__init__.py": "", "ops/__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    loops, hidden = cycles(root), hidden_imports(root)
    if found == "cycle":
        assert loops and not hidden
    elif found is None:
        assert not loops and not hidden
    else:
        assert not loops and len(hidden) == 1 and found.replace("_", "") in hidden[0].replace("_", "")

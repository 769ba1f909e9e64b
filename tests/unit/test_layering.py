"""The layer order written in docs/ARCHITECTURE.md, checked on every import of the package (read with ast).

An arrow may point only down the order, or stay inside its own package; imports under ``if TYPE_CHECKING:`` are
types, not arrows. The extra rules forbid arrows the order alone would allow. The recorded cases are the five
arrows that broke the rules before the layering work: each must be found.

Below the order, what keeps the imports honest (issue 58): no loop of imports, type-only ones counted too; no
module-level ``__getattr__`` answering for names another module holds; no ``import X as X`` re-export; no
``__all__`` naming what the module imports from elsewhere; no import of another module's ``_private`` name. Each
check has a planted tree that makes it fail."""

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


def type_only(tree: ast.AST) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:`` (its ``else:`` runs, so it is not among them)."""
    return {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        for stmt in node.body
        for n in ast.walk(stmt)
    }


def arrows(root: Path, types: bool = False) -> list[Arrow]:
    """Every runtime import of a knobfleet module, as (importer, imported) dotted names; with ``types``, the imports
    under ``if TYPE_CHECKING:`` too."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        typing_only = set() if types else type_only(tree)
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


def cycles(root: Path, types: bool = False) -> list[list[str]]:
    """Every set of modules that import each other, directly or round a loop (function-level imports count;
    ``if TYPE_CHECKING:`` ones only with ``types``): the strongly connected components of more than one module."""
    graph: dict[str, set[str]] = {}
    for a in arrows(root, types):
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


def test_no_module_imports_round_a_loop_even_for_a_type() -> None:
    """A type-only loop is a loop of knowledge all the same: the carved-out module takes a small Protocol of its own
    (ops/apply_steps.Rollout, lab/labview.LabView) or the shared type moves down (fleet/transports/sshrun.py)."""
    assert cycles(PKG, types=True) == []


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
        ({"ops/a.py": "if TYPE_CHECKING:\n    from knobfleet.ops import b\n",
          "ops/b.py": "from knobfleet.ops import a\n"}, "type-cycle"),
        ({"ops/a.py": "if TYPE_CHECKING:\n    pass\nelse:\n    from knobfleet.ops import b\n",
          "ops/b.py": "from knobfleet.ops import a\n"}, "cycle"),
    ],
    ids=["two-modules", "three-modules", "relative-cycle", "relative-past-the-top", "import-module-string",
         "type-only-is-no-cycle", "type-only-is-a-type-cycle", "type-checking-else-runs"],
)  # fmt: skip
def test_each_hidden_shape_makes_the_check_fail(tmp_path: Path, files: dict[str, str], found: str | None) -> None:
    root = tmp_path / "knobfleet"
    for rel, text in {"__init__.py": "", "ops/__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    loops, hidden, typed = cycles(root), hidden_imports(root), cycles(root, types=True)
    if found == "cycle":
        assert loops and not hidden and typed == loops
    elif found == "type-cycle":
        assert not loops and not hidden and typed
    elif found is None:
        assert not loops and not hidden
    else:
        assert not loops and len(hidden) == 1 and found.replace("_", "") in hidden[0].replace("_", "")


# --- honest imports (issue 58): a name is imported from the module that holds it ---------------------------------

# A module-level ``__getattr__`` (PEP 562) answers for names the module does not hold. Allowed where it is the point.
GETATTR_OK = {
    "lab/sgl_kernel_placeholder.py": "a PEP 562 stand-in for the engine's missing sgl_kernel library: every name "
    "SGLang imports from it must resolve, to an op that fails loudly when called (docs/SGLANG.md)",
}
# ``from x import name as name``: a name handed on under its own name. Kept only for a reader being changed elsewhere.
REEXPORT_OK: dict[tuple[str, str], str] = {}
# Imports of another module's ``_private`` names (a package's private module is its own modules' to import).
PRIVATE_OK = {
    "lab/sim/model.py": "``from . import _waves`` is the lab host's copy of waves.py (labroot installs it as "
    "sglang_sim/_waves.py); in the package the import fails and knobfleet.waves is used",
}


def module_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements of a module outside any function or class (through if, try, with and loops)."""
    out = []
    for stmt in body:
        out.append(stmt)
        if not isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            for field_ in ("body", "orelse", "finalbody", "handlers"):
                out += module_level(getattr(stmt, field_, []))
    return out


def module_getattrs(root: Path) -> list[str]:
    """The modules (paths under ``root``) that define a module-level ``__getattr__``."""
    return sorted(
        path.relative_to(root).as_posix()
        for path in root.rglob("*.py")
        if any(
            isinstance(s, ast.FunctionDef) and s.name == "__getattr__"
            for s in module_level(ast.parse(path.read_text(encoding="utf-8")).body)
        )
    )


def reexports(root: Path) -> list[tuple[str, str]]:
    """Every ``import x as x`` / ``from m import x as x``: (path under ``root``, name)."""
    return sorted(
        (path.relative_to(root).as_posix(), a.name)
        for path in root.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for a in node.names
        if a.asname == a.name
    )


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(root: Path) -> list[tuple[str, str]]:
    """Every import of a ``_private`` name of another knobfleet module (type-only imports too; the standard
    library's ``_json`` and the like are not knobfleet's): (path under ``root``, what). A private module
    (``pkg/_impl.py``) may be imported by the modules of its own package."""
    out = []
    for path in sorted(root.rglob("*.py")):
        me, rel = module_of(path, root), path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (module := absolute(node, me, path)):
                names = [f"{module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for dotted in (n for n in names if n.startswith("knobfleet.")):
                parts = dotted.split(".")
                for i, part in enumerate(parts):
                    owner = ".".join(parts[:i])
                    mine = owner == me or (is_module(root, ".".join(parts[: i + 1])) and me.startswith(owner + "."))
                    if private(part) and not mine:
                        out.append((rel, f"{node.lineno}: {dotted}"))
    return out


def test_no_module_answers_for_names_it_does_not_hold() -> None:
    """A caller imports a name from the module that defines it, never from a module-level ``__getattr__``."""
    assert module_getattrs(PKG) == sorted(GETATTR_OK), "a new one: import from the home; a gone one: drop its entry"


def test_no_module_re_exports_a_name_as_itself() -> None:
    assert reexports(PKG) == sorted(REEXPORT_OK), "a new one: callers import from the home; a gone one: drop it"


def own_names(body: list[ast.stmt]) -> set[str]:
    """The names a module binds itself, outside any function or class (through if, try, with and loops): its
    assignments (plain, annotated with a value, unpacked), defs and classes; never its imports."""
    out: set[str] = set()
    for stmt in module_level(body):
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(stmt.name)
        elif isinstance(stmt, ast.Assign) or (isinstance(stmt, ast.AnnAssign) and stmt.value is not None):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            out |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return out


def listed(body: list[ast.stmt]) -> tuple[list[str], list[int]]:
    """The names ``__all__`` lists (``=``, ``: list[str] =``, ``+=``, literal lists and tuples of strings), and the
    lines where ``__all__`` is built some other way (the check cannot read those)."""
    names: list[str] = []
    unread: list[int] = []
    for stmt in module_level(body):
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign | ast.AugAssign):
            targets, value = [stmt.target], stmt.value
        elif isinstance(stmt, ast.Expr) and "__all__." in ast.unparse(stmt):  # __all__.extend(...), .append(...)
            unread.append(stmt.lineno)
            continue
        else:
            continue
        if not any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) or value is None:
            continue
        try:
            got = ast.literal_eval(value)
        except (ValueError, TypeError):
            got = None
        if isinstance(got, list | tuple) and all(isinstance(n, str) for n in got):
            names += got
        else:
            unread.append(stmt.lineno)
    return names, unread


def foreign_exports(root: Path) -> dict[str, list[str]]:
    """Each module whose ``__all__`` lists a name the module does not define itself (imported from another
    module, or bound nowhere): path under ``root`` -> those names; ``__all__`` built in a way the check cannot read
    is listed as ``line N: __all__ not a literal list``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        body = ast.parse(path.read_text(encoding="utf-8")).body
        names, unread = listed(body)
        mine = own_names(body)
        bad = [n for n in dict.fromkeys(names) if n not in mine] + [
            f"line {n}: __all__ not a literal list" for n in unread
        ]
        if bad:
            out[path.relative_to(root).as_posix()] = bad
    return out


# A package's ``__init__.py`` may name its modules' public names as the package's documented face (with the reason);
# no other module lists in ``__all__`` what it imports. None is needed today: ``fleet/transports/__init__.py`` lists
# only the registry and what it decides, and the shared types are imported from ``fleet/transports/base.py``.
ALL_OK: dict[str, str] = {}


def test_every_all_lists_only_names_its_module_defines() -> None:
    """``__all__`` is what a module holds for others. A name it imports is another module's: a caller imports it from
    that home, so the module drops it from ``__all__`` (and the import too, unless it uses the name itself)."""
    found = foreign_exports(PKG)
    assert all(rel.endswith("__init__.py") for rel in ALL_OK), "only a package's __init__.py may hand names on"
    dishonest = {rel: names for rel, names in found.items() if rel not in ALL_OK}
    assert not dishonest, "__all__ lists names these modules do not define (import each from its home):\n" + "\n".join(
        f"  knobfleet/{rel}: {', '.join(names)}" for rel, names in sorted(dishonest.items())
    )
    assert sorted(set(found) & set(ALL_OK)) == sorted(ALL_OK), "drop the ALL_OK entries now clean"


@pytest.mark.parametrize(
    ("text", "foreign"),
    [
        ("from knobfleet.ops.b import f, g\n__all__ = ['f', 'h']\ndef h(): pass\n", ["f"]),
        ("from .b import f\n__all__ = ('f',)\n", ["f"]),
        ("import json\n__all__ = ['json']\n", ["json"]),
        ("if TYPE_CHECKING:\n    from knobfleet.ops.b import T\n__all__ = ['T']\n", ["T"]),
        ("__all__ = ['ghost']\n", ["ghost"]),
        ("from knobfleet.ops.b import f\n__all__ = ['g']\n__all__ += ['f']\ng = 1\n", ["f"]),
        ("from knobfleet.ops.b import f\n__all__: list[str] = ['f']\n", ["f"]),
        ("__all__ = [n for n in dir()]\n", ["line 1: __all__ not a literal list"]),
        ("__all__ = ['a']\n__all__.extend(['b'])\na = 1\n", ["line 2: __all__ not a literal list"]),
        ("from knobfleet.ops.b import f as g\n__all__ = ['g']\n", ["g"]),
        ("A = 1\nB: int = 2\nC, (D, E) = 3, (4, 5)\nclass F: pass\ndef g(): pass\nasync def h(): pass\n"
         "if A:\n    J = 1\ntry:\n    from x import K\nexcept ImportError:\n    K = None\n"
         "__all__ = ['A', 'B', 'C', 'D', 'E', 'F', 'g', 'h', 'J', 'K']\n", []),
        ("from knobfleet.ops.b import f\ndef g():\n    __all__ = ['f']\n", []),
        ("from knobfleet.ops.b import f\n", []),
    ],
    ids=["imported-name", "relative-import-in-a-tuple", "stdlib-module", "type-only-import", "bound-nowhere",
         "augmented", "annotated", "computed", "extended", "renamed-import", "own-names-are-fine",
         "a-local-all-is-not-the-modules", "no-all-is-fine"],
)  # fmt: skip
def test_each_foreign_name_in_all_makes_its_check_fail(tmp_path: Path, text: str, foreign: list[str]) -> None:
    root = tmp_path / "knobfleet"
    for rel, body in {"__init__.py": "", "ops/__init__.py": "", "ops/b.py": "def f(): pass\nT = int\n",
                      "ops/a.py": text}.items():  # fmt: skip
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(body)
    assert foreign_exports(root) == ({"ops/a.py": foreign} if foreign else {})


def test_no_module_imports_another_modules_private_names() -> None:
    """Make the name public in its home (or move the code to where it is used); tests may still reach a private name
    of the module they test."""
    found = private_imports(PKG)
    assert [f"{rel}:{what}" for rel, what in found if rel not in PRIVATE_OK] == []
    assert sorted({rel for rel, _ in found} & set(PRIVATE_OK)) == sorted(PRIVATE_OK), "drop the entries now clean"


@pytest.mark.parametrize(
    ("files", "getattrs", "reexported", "privates"),
    [
        ({"ops/a.py": "def __getattr__(name):\n    raise AttributeError(name)\n"}, ["ops/a.py"], [], []),
        ({"ops/a.py": "if not TYPE_CHECKING:\n    def __getattr__(name):\n        return 1\n"}, ["ops/a.py"], [], []),
        ({"ops/a.py": "class A:\n    def __getattr__(self, name):\n        return 1\n"}, [], [], []),
        ({"ops/a.py": "from knobfleet.ops.b import f as f\n", "ops/b.py": "def f(): pass\n"}, [], ["f"], []),
        ({"ops/a.py": "from .b import f as f\n", "ops/b.py": "def f(): pass\n"}, [], ["f"], []),
        ({"ops/a.py": "from knobfleet.ops.b import f as g\nimport json as js\n"}, [], [], []),
        ({"ops/a.py": "from knobfleet.ops.b import _f\nfrom _json import x\n"}, [], [], ["knobfleet.ops.b._f"]),
        ({"ops/a.py": "from .b import _f, g\n"}, [], [], ["knobfleet.ops.b._f"]),
        ({"ops/a.py": "if TYPE_CHECKING:\n    from knobfleet.ops.b import _T\n"}, [], [], ["knobfleet.ops.b._T"]),
        ({"cli/a.py": "from knobfleet.ops import _impl\n", "ops/_impl.py": ""}, [], [], ["knobfleet.ops._impl"]),
        ({"cli/a.py": "import knobfleet.ops._impl\n", "ops/_impl.py": ""}, [], [], ["knobfleet.ops._impl"]),
        ({"ops/a.py": "from knobfleet.ops import _impl\nfrom knobfleet import __version__\n", "ops/_impl.py": ""},
         [], [], []),
    ],
    ids=["module-getattr", "getattr-under-if", "class-getattr-is-fine", "re-export", "relative-re-export",
         "other-name-is-fine", "private-name", "relative-private-name", "type-only-private-name",
         "private-module-of-another-package", "import-private-module", "own-package-private-module-is-fine"],
)  # fmt: skip
def test_each_dishonest_import_makes_its_check_fail(
    tmp_path: Path, files: dict[str, str], getattrs: list[str], reexported: list[str], privates: list[str]
) -> None:
    root = tmp_path / "knobfleet"
    for rel, text in {"__init__.py": "", "ops/__init__.py": "", "cli/__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    assert module_getattrs(root) == getattrs
    assert [name for _rel, name in reexports(root)] == reexported
    assert [what.split(": ")[1] for _rel, what in private_imports(root)] == privates

"""Issue 36's size rule for the whole package (python/knobfleet): no module over 500 lines, no function over 80
(decorators included). Generated data (catalogs, dashboards, JSON tables) is not Python and is not counted here.
The on-host modules have their own copy of the rule in tests/unit/module_utils/test_sizes.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "python" / "knobfleet"
FILES = sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(PKG)) for p in FILES])
def test_no_module_over_500_lines_nor_a_function_over_80(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 500, f"{path.relative_to(PKG)}: {len(text.splitlines())} lines"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            assert node.end_lineno is not None
            length = node.end_lineno - start + 1
            assert length <= 80, f"{path.relative_to(PKG)}: {node.name} is {length} lines"


def test_the_rule_sees_every_module() -> None:
    assert len(FILES) > 150 and PKG / "ops" / "apply.py" in FILES

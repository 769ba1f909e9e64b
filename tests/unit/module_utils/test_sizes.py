"""Issue 36's size rule for the code shipped to hosts (python/knobfleet/module_utils): no file over 500 lines, no
function over 80 (decorators included)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from knobfleet import paths

FILES = sorted(paths.module_utils_dir().glob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_no_module_util_over_500_lines_nor_a_function_over_80(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 500
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            assert node.end_lineno is not None and node.end_lineno - start + 1 <= 80, node.name

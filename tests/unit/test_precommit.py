"""The pre-commit config runs make lint's fast parts, on the same folders, with this checkout's tools (no hook
repository is fetched)."""

from __future__ import annotations

import re

import yaml

from tests.conftest import REPO


def test_pre_commit_runs_make_lints_fast_parts_locally() -> None:
    doc = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())
    assert [r["repo"] for r in doc["repos"]] == ["local"]
    hooks = {h["id"]: h for r in doc["repos"] for h in r["hooks"]}
    make = (REPO / "Makefile").read_text()
    lint = make[make.index("\nlint:") :].split("\n\n")[0]
    for hook, tool in (
        ("ruff-check", "ruff check"),
        ("ruff-format", "ruff format --check"),
        ("yamllint", "yamllint -s"),
    ):
        line = next(ln for ln in lint.splitlines() if tool in ln)
        folders = line.split(tool, 1)[1].split()
        assert hooks[hook]["entry"].startswith(f".venv/bin/{tool.split()[0]}"), hooks[hook]
        assert set(re.findall(r"\w+", hooks[hook]["files"])) == set(folders), (hook, folders)

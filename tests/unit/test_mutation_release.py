"""tools/mutation.py: in a clone without tags (CI's), the last release is the commit the tracked file names, and
--quick samples the modules changed since it, the most changed first."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import REPO


def _mutation() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutation_tool", REPO / "tools" / "mutation.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["mutation_tool"] = mod
    spec.loader.exec_module(mod)
    return mod


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "PATH": "/usr/bin:/bin", "HOME": str(repo)}  # fmt: skip
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout.strip()


def test_the_tracked_release_names_a_commit_of_this_history() -> None:
    fields = dict(ln.split(None, 1) for ln in (REPO / "tools" / "last-release").read_text().splitlines() if " " in ln)
    assert fields["version"].count(".") == 2
    known = subprocess.run(["git", "cat-file", "-e", f"{fields['commit']}^{{commit}}"], cwd=REPO, capture_output=True)
    if (REPO / ".git").exists():
        assert known.returncode == 0, f"tools/last-release: {fields['commit']} is not a commit of this clone"


def test_a_clone_without_tags_samples_what_changed_since_the_tracked_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = _mutation()
    repo = tmp_path / "clone"
    pkg = repo / "python" / "knobfleet"
    (pkg / "ops").mkdir(parents=True)
    (pkg / "ops" / "plan.py").write_text("a = 1\n")
    (pkg / "waves.py").write_text("b = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "release")
    release = _git(repo, "rev-parse", "HEAD")
    (pkg / "ops" / "plan.py").write_text("a = 2\n")
    (pkg / "waves.py").write_text("b = 2\nc = 3\nd = 4\n")
    _git(repo, "commit", "-qam", "work")
    monkeypatch.setattr(m, "REPO", repo)
    monkeypatch.setattr(m, "RELEASE_FILE", repo / "last-release")
    assert m.last_release_tag() is None  # no tag and no file: the fixed sample
    (repo / "last-release").write_text(f"# the last release\nversion 0.2.3\ncommit {release}\n")
    assert m.last_release_tag() == release
    patterns = ["src/knobfleet/ops/plan.py", "src/knobfleet/waves.py"]
    assert m.changed_since(release, patterns) == ["waves.py", "ops/plan.py"]  # 4 changed lines, then 2
    (repo / "last-release").write_text("version 9.9.9\ncommit 0123456789abcdef0123456789abcdef01234567\n")
    assert m.last_release_tag() is None  # a commit this clone does not have

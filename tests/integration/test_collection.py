"""The knobfleet.serving collection as Ansible users get it: built with ansible-galaxy, installed into a
collections path outside the repository, every module documented for ansible-doc, ansible-lint's production
profile clean, and ansible-builder producing the execution environment's build context. No lab needed."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

import knobfleet
from knobfleet import collection
from tests.conftest import REPO

BIN = REPO / ".venv" / "bin"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    work = tmp_path_factory.mktemp("collection")
    tarball = collection.build_tarball(REPO, work / "dist", work / "stage")
    assert tarball.is_file() and tarball.name == f"knobfleet-serving-{knobfleet.__version__}.tar.gz"
    colls = work / "collections"
    subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "install", "-p", str(colls), str(tarball)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return tarball, colls


@pytest.mark.parametrize("module", ["knob_generation", "knob_ready", "knob_probe"])
def test_ansible_doc_renders_every_module(installed: tuple[Path, Path], module: str) -> None:
    _, colls = installed
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "ANSIBLE_COLLECTIONS_PATH": str(colls), "HOME": str(colls.parent)}
    proc = subprocess.run(
        [str(BIN / "ansible-doc"), "--json", f"knobfleet.serving.{module}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)[f"knobfleet.serving.{module}"]
    assert doc["doc"]["short_description"] and doc["examples"].strip() and doc["return"]
    assert all(opt.get("description") for opt in doc["doc"]["options"].values())
    text = subprocess.run(
        [str(BIN / "ansible-doc"), f"knobfleet.serving.{module}"], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert "EXAMPLES:" in text and "RETURN VALUES:" in text


def test_roles_are_documented_by_their_argument_specs(installed: tuple[Path, Path]) -> None:
    _, colls = installed
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "ANSIBLE_COLLECTIONS_PATH": str(colls), "HOME": str(colls.parent)}
    proc = subprocess.run(
        [str(BIN / "ansible-doc"), "-t", "role", "knobfleet.serving.knob_serve"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "knob_serve_restore_on_failure" in proc.stdout


def test_ansible_lint_production_profile_is_clean(installed: tuple[Path, Path]) -> None:
    _, colls = installed
    tree = colls / "ansible_collections" / "knobfleet" / "serving"
    proc = subprocess.run(
        [str(BIN / "ansible-lint"), "-q", "--profile", "production"],
        cwd=tree,
        capture_output=True,
        text=True,
        env={"PATH": f"{BIN}:/usr/bin:/bin", "ANSIBLE_COLLECTIONS_PATH": str(colls), "HOME": str(colls.parent)},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_ansible_builder_creates_the_execution_environment_context(
    installed: tuple[Path, Path], tmp_path: Path
) -> None:
    tarball, _ = installed
    (tmp_path / "dist").mkdir()
    shutil.copy2(tarball, tmp_path / "dist" / "knobfleet-serving.tar.gz")
    shutil.copy2(REPO / "execution-environment.yml", tmp_path / "execution-environment.yml")
    proc = subprocess.run(
        [str(BIN / "ansible-builder"), "create", "-f", "execution-environment.yml", "-c", "context"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    context = tmp_path / "context"
    containerfile = next(p for p in (context / "Containerfile", context / "Dockerfile") if p.is_file())
    text = containerfile.read_text()
    assert "quay.io/ansible/awx-ee" in text and "ansible-galaxy" in text
    assert (context / "_build" / "collections" / "knobfleet-serving.tar.gz").is_file()
    reqs = (context / "_build" / "requirements.yml").read_text()
    assert "collections/knobfleet-serving.tar.gz" in reqs

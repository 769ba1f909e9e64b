"""Build the ``knobfleet.serving`` Ansible collection from the single source in this repository.

The repository keeps one copy of everything: roles/ (with each role's modules in ``library/``), playbooks/,
and the modules' shared code in ``python/knobfleet/module_utils`` (``ansible.module_utils.knob_*``). The
collection is generated from them, never edited by hand:

* modules move to ``plugins/modules``, module_utils are copied to ``plugins/module_utils``, and their import
  lines are rewritten to the collection's FQCN path
  (``ansible_collections.knobfleet.serving.plugins.module_utils.knob_live``);
* the roles' tasks and the playbooks name modules and roles by FQCN (``knobfleet.serving.knob_generation``,
  ``knobfleet.serving.knob_serve``);
* ``galaxy.yml`` is ``collection/galaxy.yml.in`` with the package's version.

``stage_ansible_dir`` lays out what the wheel ships in ``knobfleet/_data/ansible``: the playbooks, with the
collection beside them in ``collections/`` (Ansible looks there first), so the CLI always runs its own copy.

Standard library only: the wheel's build hook (hatch_build.py) loads this file by path.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

NAMESPACE, NAME = "knobfleet", "serving"
FQCN = f"{NAMESPACE}.{NAME}"
UTILS_IMPORT = re.compile(r"\bansible\.module_utils\.(knob_[a-z_]+)")
COLLECTION_UTILS = f"ansible_collections.{NAMESPACE}.{NAME}.plugins.module_utils."
ROLES = ("knob_serve", "knob_probe", "knob_bench", "knob_kernel")
PLAYBOOKS = ("apply.yml", "restore.yml", "probe.yml", "bench.yml", "kernel.yml")


def rewrite_python(text: str) -> str:
    """``ansible.module_utils.knob_x`` → the collection's FQCN path (modules and module_utils alike)."""
    return UTILS_IMPORT.sub(lambda m: COLLECTION_UTILS + m.group(1), text)


def rewrite_tasks(text: str, modules: list[str]) -> str:
    """Task files and playbooks: our modules and roles by FQCN (``knob_generation:`` keys, ``role:`` and
    include_role ``name:`` values)."""
    if modules:
        names = "|".join(re.escape(m) for m in modules)
        text = re.sub(rf"(?m)^(\s*(?:- )?)({names}):([ \t]*)$", rf"\1{FQCN}.\2:\3", text)
    roles = "|".join(ROLES)
    return re.sub(rf"(?m)^(\s*(?:- )?(?:role|name): )({roles})[ \t]*$", rf"\1{FQCN}.\2", text)


def version_of(src: Path) -> str:
    text = (src / "python" / "knobfleet" / "__init__.py").read_text(encoding="utf-8")
    found = re.search(r'(?m)^__version__ = "([^"]+)"', text)
    if not found:
        raise ValueError(f"{src}/python/knobfleet/__init__.py: no __version__ line")
    return found.group(1)


def _modules(src: Path) -> dict[str, Path]:
    return {p.stem: p for r in ROLES for p in sorted((src / "roles" / r / "library").glob("*.py"))}


def stage_collection(src: Path, dest: Path, version: str | None = None) -> Path:
    """Write the collection tree to ``dest`` (replaced if present); returns ``dest``."""
    version = version or version_of(src)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    modules = _modules(src)
    template = src / "collection"
    text = (template / "galaxy.yml.in").read_text(encoding="utf-8").replace("@VERSION@", version)
    galaxy = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#"))
    (dest / "galaxy.yml").write_text(galaxy, encoding="utf-8")
    for extra in ("README.md", "meta", "changelogs"):
        s = template / extra
        if s.is_dir():
            shutil.copytree(s, dest / extra)
        else:
            shutil.copy2(s, dest / extra)
    if (src / "LICENSE").is_file():
        shutil.copy2(src / "LICENSE", dest / "LICENSE")
    mods = dest / "plugins" / "modules"
    mods.mkdir(parents=True)
    for name, path in modules.items():
        (mods / f"{name}.py").write_text(rewrite_python(path.read_text(encoding="utf-8")), encoding="utf-8")
    utils = dest / "plugins" / "module_utils"
    utils.mkdir(parents=True)
    for path in sorted((src / "python" / "knobfleet" / "module_utils").glob("knob_*.py")):
        (utils / path.name).write_text(rewrite_python(path.read_text(encoding="utf-8")), encoding="utf-8")
    for role in ROLES:
        shutil.copytree(
            src / "roles" / role,
            dest / "roles" / role,
            ignore=shutil.ignore_patterns("library", "__pycache__", "*.pyc"),
        )
    for yml in (dest / "roles").rglob("*.yml"):
        if "tasks" in yml.parts or yml.parent.name == "handlers":
            yml.write_text(rewrite_tasks(yml.read_text(encoding="utf-8"), list(modules)), encoding="utf-8")
    books = dest / "playbooks"
    books.mkdir()
    for book in PLAYBOOKS:
        text = (src / "playbooks" / book).read_text(encoding="utf-8")
        (books / book).write_text(rewrite_tasks(text, list(modules)), encoding="utf-8")
    return dest


def stage_ansible_dir(src: Path, dest: Path, version: str | None = None) -> Path:
    """What the wheel ships as ``knobfleet/_data/ansible``: playbooks + ``collections/ansible_collections/…``."""
    if dest.exists():
        shutil.rmtree(dest)
    coll = stage_collection(src, dest / "collections" / "ansible_collections" / NAMESPACE / NAME, version)
    for book in PLAYBOOKS:
        shutil.copy2(coll / "playbooks" / book, dest / book)
    return dest


def build_tarball(src: Path, outdir: Path, work: Path, version: str | None = None) -> Path:
    """``ansible-galaxy collection build`` of a freshly staged tree; returns the .tar.gz."""
    tree = stage_collection(src, work / "ansible_collections" / NAMESPACE / NAME, version)
    outdir.mkdir(parents=True, exist_ok=True)
    galaxy = shutil.which("ansible-galaxy") or str(Path(sys.executable).with_name("ansible-galaxy"))
    proc = subprocess.run(
        [galaxy, "collection", "build", "--force", "--output-path", str(outdir), str(tree)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"ansible-galaxy collection build failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return outdir / f"{NAMESPACE}-{NAME}-{version or version_of(src)}.tar.gz"


def main(argv: list[str] | None = None) -> int:
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(
        prog="python -m knobfleet.collection", description="Build the knobfleet.serving collection."
    )
    parser.add_argument("--src", type=Path, default=Path(__file__).resolve().parents[2], help="repository root")
    parser.add_argument("--out", type=Path, default=Path("dist"), help="where the .tar.gz goes (default dist/)")
    parser.add_argument("--tree", type=Path, default=None, help="only stage the collection tree here")
    args = parser.parse_args(argv)
    if args.tree:
        print(stage_collection(args.src, args.tree))
        return 0
    with tempfile.TemporaryDirectory() as work:
        print(build_tarball(args.src, args.out, Path(work)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

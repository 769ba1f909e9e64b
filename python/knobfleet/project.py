"""A user's own fleet repository: found from the working directory upward by its ``knobfleet.toml`` (like git
finds ``.git``), or made by ``knobfleet init DIR``.

``knobfleet.toml`` (every key optional; paths are relative to the file)::

    [project]
    name = "myfleet"
    profiles = "profiles"                 # profile files and profiles.lock
    inventory = "inventories/hosts.yml"   # the default of -i
    catalogs = "catalogs"                 # <engine>.overlay.yaml on top of the catalogs knobfleet ships

Standard library only (tomllib); no I/O beyond reading that one file and walking up the tree.
"""

from __future__ import annotations

import contextlib
import json
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from knobfleet import safefile
from knobfleet.errors import UsageError
from knobfleet.rules import first_invisible, shown

CONFIG_NAME = "knobfleet.toml"
MAX_CONFIG = 256 * 1024
KEYS = {
    "name": "the project's name",
    "profiles": "folder of profile files (default profiles)",
    "inventory": "default inventory (default inventories/hosts.yml)",
    "catalogs": "folder of engine catalog overlays (default catalogs)",
}


class ProjectError(UsageError):
    """knobfleet.toml is unreadable or names something impossible."""


@dataclass(frozen=True)
class Project:
    root: Path
    name: str
    profiles: Path
    inventory: Path
    catalogs: Path

    @property
    def config(self) -> Path:
        return self.root / CONFIG_NAME

    @property
    def ansible_cfg(self) -> Path:
        return self.root / "ansible.cfg"


def find(start: Path) -> Path | None:
    """The nearest folder at or above ``start`` holding ``knobfleet.toml``."""
    start = start.resolve()
    for candidate in (start, *start.parents):
        path = candidate / CONFIG_NAME
        try:  # anything else there is named (as ``paths.has_config`` does), never skipped for a project above
            if safefile.is_present(path):
                return candidate
        except safefile.FileRefused as exc:
            fix = "replace it with a regular TOML file (`knobfleet init --help`)"
            raise ProjectError(safefile.not_a(shown(str(path)), exc, "project file", fix)) from None
    return None


def load(root: Path) -> Project:
    """The project at ``root``; a bad ``knobfleet.toml`` is one line naming the file, the key and the fix."""
    path = root / CONFIG_NAME
    where = shown(str(path))
    try:
        data = tomllib.loads(safefile.read_text(path, MAX_CONFIG, "knobfleet.toml"))
    except safefile.FileRefused as exc:
        raise ProjectError(f"{where}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ProjectError(f"{where}: not valid TOML ({exc}); fix the syntax") from None
    section = data.get("project", {})
    if not isinstance(section, dict):
        raise ProjectError(f"{where}: project: must be a table ([project]); see `knobfleet init --help`")
    unknown = sorted(set(data) - {"project"})
    if unknown:
        raise ProjectError(f"{where}: {unknown[0]}: unknown section; only [project] is read")
    for key, value in section.items():
        if key not in KEYS:
            import difflib

            close = difflib.get_close_matches(key, list(KEYS), n=1)
            hint = f"did you mean {close[0]}?" if close else f"known keys: {', '.join(KEYS)}"
            raise ProjectError(f"{where}: project.{key}: unknown key; {hint}")
        if not isinstance(value, str) or not value.strip():
            raise ProjectError(f"{where}: project.{key}: must be a non-empty string ({KEYS[key]})")

    def rel(key: str, default: str) -> Path:
        value = Path(os.path.expanduser(str(section.get(key, default))))
        return value if value.is_absolute() else root / value

    return Project(
        root=root,
        name=str(section.get("name", root.name)),
        profiles=rel("profiles", "profiles"),
        inventory=rel("inventory", "inventories/hosts.yml"),
        catalogs=rel("catalogs", "catalogs"),
    )


# --- knobfleet init --------------------------------------------------------------------------------------

CONFIG_TEMPLATE = """\
# A knobfleet project: knobfleet finds it from this folder or any folder below (like git).
[project]
name = "{name}"
profiles = "profiles"                 # profile files and profiles.lock (`knobfleet profiles lock`)
inventory = "inventories/hosts.yml"   # the default of -i (ANSIBLE_INVENTORY and -i override it)
catalogs = "catalogs"                 # <engine>.overlay.yaml: your knobs on top of the catalogs knobfleet ships
"""

ANSIBLE_CFG = """\
# Read by knobfleet's Ansible runs and by plain ansible-playbook from this folder. knobfleet keeps every
# setting here; see docs/OWN_FLEET.md ("What knobfleet overrides") for the few it sets itself.
[defaults]
# Collections (knobfleet.serving) installed with `ansible-galaxy collection install`; knobfleet's CLI uses
# the copy shipped inside its Python package whatever this says.
collections_path = ./collections:~/.ansible/collections:/usr/share/ansible/collections
interpreter_python = auto_silent
# forks = 20
# vault_password_file = ~/.vault-pass
# callbacks_enabled = ansible.posix.profile_tasks

[ssh_connection]
pipelining = True
# ssh_common_args = -o ProxyJump=bastion.example.internal
"""

INVENTORY = """\
# Your fleet. Host vars are documented in `ansible-doc -t role knobfleet.serving.knob_serve`.
all:
  children:
    decode:
      hosts:
        gpu-decode-01:
          ansible_host: 192.0.2.11
      vars:
        ansible_user: root
        knob_serve_service: sglang-decode
        knob_serve_script_path: /opt/serving/serve_decode.sh
        knob_serve_model_path: /models/my-model
        knob_serve_port: 30000
"""

PROFILE = """\
# A knob profile: env vars and launch flags, checked against the engine's catalog.
schema_version: 1
name: mybase
version: 1
engine: sglang
description: My decode settings.
env:
  SGLANG_OPT_USE_MULTI_STREAM_OVERLAP: 0
args:
  tp-size: 1
"""

README = """\
# {name}

A knobfleet project: knob profiles for this fleet's inference engines, and its inventory.

```sh
knobfleet profiles validate          # every profile against its engine's catalog
knobfleet plan mybase                # what apply would change (exit 2: changes pending)
knobfleet apply mybase               # asks first; --yes for scripts and CI
knobfleet drift                      # live /proc state against the applied generation
```

Plain Ansible works too (`ansible-galaxy collection install knobfleet-serving-*.tar.gz` first):

```sh
knobfleet render mybase --what vars > mybase.vars.yml
ansible-playbook knobfleet.serving.apply -i inventories/hosts.yml -e @mybase.vars.yml
```
"""

GITIGNORE = ".state/\ncollections/\n*.vars.yml\n"


def _project_name(name: str, given: bool) -> str:
    """A project name that TOML and a terminal can carry: decodable text without invisible characters."""
    where = "--name" if given else "DIR's folder name"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as exc:
        byte = name[exc.start].encode("utf-8", "surrogateescape")
        raise ProjectError(
            f"{shown(name)}: {where} has the byte 0x{byte.hex()} that is not UTF-8; pass --name NAME "
            "(nothing was written)"
        ) from None
    hit = first_invisible(name)
    if hit is not None or not name.strip():
        from knobfleet.rules import describe_char

        what = "is empty" if hit is None else f"contains {describe_char(hit[1])} (invisible)"
        raise ProjectError(f"{shown(name)}: {where} {what}; pass --name NAME (nothing was written)")
    return name


def init(directory: Path, name: str | None = None, force: bool = False) -> list[Path]:
    """Create a project in ``directory`` (made when missing). Refuses to overwrite files unless ``force``.
    Every file is composed and checked before the first is written, and each is written atomically; a failure
    part-way removes what this run created, so a re-run starts clean. Returns the files written."""
    directory = Path(os.path.realpath(directory))  # not resolve(): before 3.13 it raises on a symlink loop
    if directory.exists() and not directory.is_dir():
        raise ProjectError(f"{shown(str(directory))}: exists and is not a folder; pick another DIR")
    name = _project_name(name, True) if name is not None else _project_name(directory.name, False)
    toml_name = json.dumps(name, ensure_ascii=False)  # a TOML basic string: quotes and backslashes escaped
    files = {
        CONFIG_NAME: CONFIG_TEMPLATE.replace('"{name}"', toml_name),
        "ansible.cfg": ANSIBLE_CFG,
        "inventories/hosts.yml": INVENTORY,
        "profiles/mybase.yaml": PROFILE,
        "catalogs/README.md": "Engine catalog overlays: `<engine>.overlay.yaml` adds or narrows knobs on top of\n"
        "the catalogs knobfleet ships (`knobfleet profiles validate` reads both).\n",
        "README.md": README.format(name=name),
        ".gitignore": GITIGNORE,
    }
    existing = [rel for rel in files if os.path.lexists(directory / rel)]
    if existing and not force:
        raise ProjectError(
            f"{shown(str(directory / existing[0]))}: already exists; knobfleet init never overwrites "
            "(use --force, or another DIR)"
        )
    blobs = {rel: text.encode("utf-8") for rel, text in files.items()}
    made_dirs = [p for p in (directory, *{(directory / rel).parent for rel in files}) if not p.exists()]
    written: list[Path] = []
    try:
        for rel, blob in blobs.items():
            path = directory / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            safefile.write_bytes(path, blob)
            written.append(path)
    except BaseException:
        for path in written:
            if path.relative_to(directory).as_posix() not in existing:
                path.unlink(missing_ok=True)
        for d in sorted(made_dirs, key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                d.rmdir()
        raise
    return written

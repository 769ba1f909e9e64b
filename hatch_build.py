"""Wheel build hook: generate the knobfleet.serving collection (python/knobfleet/collection.py) and ship it,
with the playbooks the CLI runs, as ``knobfleet/_data/ansible``. Nothing is generated for editable installs:
a checkout runs its roles/ directly."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class CollectionBuildHook(BuildHookInterface):  # type: ignore[misc]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or version == "editable":
            return
        root = Path(self.root)
        spec = importlib.util.spec_from_file_location("_kf_collection", root / "python" / "knobfleet" / "collection.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        staged = module.stage_ansible_dir(root, root / "build" / "wheel-ansible" / "ansible")
        build_data["force_include"][str(staged)] = "knobfleet/_data/ansible"

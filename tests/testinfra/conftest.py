"""Lets testinfra's Ansible backend run knobfleet's own probe module (``host.ansible("knob_probe", …)``)."""

from __future__ import annotations

import os

from knobfleet import paths

os.environ.setdefault("ANSIBLE_LIBRARY", str(paths.roles_dir() / "knob_probe" / "library"))
os.environ.setdefault("ANSIBLE_MODULE_UTILS", str(paths.module_utils_dir()))

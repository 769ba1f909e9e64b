"""A placeholder ``sgl_kernel`` for real SGLang on a CPU lab host: knobfleet's own code, no upstream code.

SGLang's CPU mode imports ``sgl_kernel`` (its compiled kernel package) while it loads modules, but no CPU build of
that package is published. On a CPU without AMX SGLang calls none of its ops for a dense Llama: every layer takes
its torch-native path (``cpu_has_amx_support()`` needs registered ``torch.ops.sgl_kernel`` ops, and this module
registers none). So the lab installs this file as ``site-packages/sgl_kernel/__init__.py``:

- any name, at any depth (``sgl_kernel.scalar_type.scalar_types.uint4b8`` is read at import time), is a
  :class:`Missing` object;
- any ``sgl_kernel.<sub>`` import resolves to such a module (``sgl_kernel.mamba`` and others are submodules);
- calling one prints ``sgl_kernel placeholder: <name> called`` on stderr (the unit's journal, which the lab's
  integration test reads) and raises ``NotImplementedError`` naming the op, so a newer SGLang that does call a
  kernel on this path fails loudly on the first request, never silently.

It imports nothing outside the standard library: it runs inside SGLang's venv, not knobfleet's.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, NoReturn

__version__ = "0.0.0+knobfleet.placeholder"
MARK = "sgl_kernel placeholder:"


class Missing:
    """A kernel op (or namespace of ops) that this install does not have."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Missing:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)  # copy, pickle and inspect probe dunders: never pretend to have them
        return Missing(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        print(f"{MARK} {self._name} called", file=sys.stderr, flush=True)
        raise NotImplementedError(f"{self._name}: no sgl_kernel CPU kernels in this install (knobfleet placeholder)")

    def __repr__(self) -> str:
        return f"<missing sgl_kernel op {self._name}>"


class _Module(types.ModuleType):
    def __getattr__(self, attr: str) -> Missing:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return Missing(f"{self.__name__}.{attr}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves every ``sgl_kernel.<sub>`` import to a placeholder module."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(__name__ + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        mod = _Module(spec.name)
        mod.__path__ = []
        return mod

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def __getattr__(attr: str) -> Missing:  # PEP 562: ``from sgl_kernel import x`` for any x
    if attr.startswith("__") and attr.endswith("__"):
        raise AttributeError(attr)
    return Missing(f"{__name__}.{attr}")


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())

"""knob_generation (roles/knob_serve/library) when things go wrong half-way: what is left on the host.

- Under ``--foreign-dropins remove`` a failed install puts every admin drop-in back, byte for byte, wherever the
  install failed (moving the drop-ins away, writing the script, writing the unit).
- A refused adoption ("cannot adopt … symlink", a FIFO, a device-like special file) releases the host lock the
  same call took, so the next apply — by anyone — is not told the host is locked.

In-process, as tests/unit/roles/test_knob_generation.py: the host is a temp dir, failures are injected at the
one write primitive every host write goes through (knob_fs ``write_at``: the drop-in backups via
``write_atomic``, the script and unit via the all-or-nothing ``Install``) with the errno a full disk or a racing
admin gives.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from knobfleet.module_utils import knob_commit, knob_guards, knob_store
from tests.unit.roles.test_knob_generation import HAND_SCRIPT, HAND_UNIT, Failed, Host, profile, script, unit

DROPINS = {
    "10-admin.conf": "[Service]\nEnvironment=CTAS=1024\n",
    "20-limits.conf": "[Service]\nLimitNOFILE=65536\n# the admin's own note\n",
}


@pytest.fixture(autouse=True)
def no_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(knob_commit, "validate_staged", lambda module, kind, path, script_path: None)


@pytest.fixture
def host(tmp_path: Path) -> Host:
    h = Host(tmp_path)
    h.hand_written()
    return h


def admin_dropins(host: Host, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The admin's drop-in directory of the unit, with two drop-ins; the module's discovery pointed at it."""
    admin = host.unit.parent / "svc.service.d"
    admin.mkdir()
    for name, text in DROPINS.items():
        (admin / name).write_text(text)
        (admin / name).chmod(0o644)
    monkeypatch.setattr(
        knob_guards, "dropins", lambda unit: [{"path": str(p), "exists": True} for p in sorted(admin.glob("*.conf"))]
    )
    return admin


def fail_once(monkeypatch: pytest.MonkeyPatch, matches: Callable[[str], bool], code: int = errno.ENOSPC) -> list[str]:
    """knob_fs's ``write_at`` fails the first time it writes a path ``matches`` accepts (the directory
    descriptor's path + the name); every other write is real. Patched in knob_fs itself (``write_atomic`` and
    ``Install.put`` reach it there) and in the module's own import of it (the generation store)."""
    knob_fs = sys.modules[knob_commit.Install.__module__]
    real = knob_fs.write_at
    failed: list[str] = []

    def write_at(
        dfd: int, name: str, data: bytes, mode: int, uid: int = 0, gid: int = 0, renamed: list[bool] | None = None
    ) -> None:
        path = os.path.join(os.readlink(f"/proc/self/fd/{dfd}"), name)
        if not failed and matches(path):
            failed.append(path)
            raise OSError(code, os.strerror(code), path)
        real(dfd, name, data, mode, uid, gid, renamed)

    monkeypatch.setattr(knob_fs, "write_at", write_at)
    monkeypatch.setattr(knob_store, "write_at", write_at)
    return failed


FAILURE_POINTS: dict[str, Callable[[Host], Callable[[str], bool]]] = {
    # the second drop-in's copy into the new generation: the first one is already moved away
    "backing up the second drop-in": lambda h: lambda p: p.endswith("/generations/0001/dropins/20-limits.conf"),
    "writing the script": lambda h: lambda p: p == str(h.script),
    "writing the unit": lambda h: lambda p: p == str(h.unit),
}


@pytest.mark.parametrize("where", sorted(FAILURE_POINTS))
def test_a_failed_install_under_policy_remove_puts_every_admin_dropin_back(
    host: Host, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    admin = admin_dropins(host, monkeypatch)
    host.call("begin", foreign_dropins="remove")
    host.stage(script(1), unit(1))
    failed = fail_once(monkeypatch, FAILURE_POINTS[where](host))
    with pytest.raises(Failed) as exc:
        host.call("commit", profile=profile(1), foreign_dropins="remove")
    assert failed, f"the failure at {where} was never reached"
    assert exc.value.result["rolled_back"] is True and exc.value.result["errno"] == errno.ENOSPC
    assert str(exc.value).endswith("generation 0001 removed; generation 0000 is still live")
    # The admin's drop-ins are back, byte for byte, and nothing else appeared in their directory.
    assert {p.name: p.read_text() for p in admin.iterdir()} == DROPINS
    assert all(p.stat().st_mode & 0o777 == 0o644 for p in admin.iterdir())
    # The rest of the host is as it was before the apply.
    assert host.script.read_text() == HAND_SCRIPT and host.unit.read_text() == HAND_UNIT
    assert host.generations() == ["0000"] and host.current() == "generations/0000"
    assert [e["event"] for e in host.ledger()] == ["adopt"]


def test_a_failed_install_without_dropins_to_remove_creates_no_dropin_directory(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(knob_guards, "dropins", lambda unit: [])
    host.call("begin", foreign_dropins="remove")
    host.stage(script(1), unit(1))
    fail_once(monkeypatch, lambda p: p == str(host.unit))
    with pytest.raises(Failed):
        host.call("commit", profile=profile(1), foreign_dropins="remove")
    assert not (host.unit.parent / "svc.service.d").exists()
    assert host.script.read_text() == HAND_SCRIPT


def test_after_a_failed_install_the_next_apply_removes_and_keeps_the_dropins_again(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The put-back drop-ins are found again by the retry: moved into its generation, and back on rollback."""
    admin = admin_dropins(host, monkeypatch)
    host.call("begin", foreign_dropins="remove")
    host.stage(script(1), unit(1))
    fail_once(monkeypatch, lambda p: p == str(host.unit))
    with pytest.raises(Failed):
        host.call("commit", profile=profile(1), foreign_dropins="remove")
    res = host.call("commit", profile=profile(1), foreign_dropins="remove")
    assert res["generation"] == 1 and sorted(res["dropins_removed"]) == sorted(str(admin / n) for n in DROPINS)
    assert list(admin.iterdir()) == []
    host.call("restore", generation=0)
    assert {p.name: p.read_text() for p in admin.iterdir()} == DROPINS


# --- a refused adoption releases the lock ------------------------------------------------------------------


def _symlink_script(h: Host) -> None:
    target = h.root / "elsewhere.sh"
    target.write_text(HAND_SCRIPT)
    h.script.unlink()
    h.script.symlink_to(target)


def _symlink_unit(h: Host) -> None:
    target = h.root / "elsewhere.service"
    target.write_text(HAND_UNIT)
    h.unit.unlink()
    h.unit.symlink_to(target)


def _fifo_script(h: Host) -> None:
    h.script.unlink()
    os.mkfifo(h.script)


def _dir_as_unit(h: Host) -> None:
    h.unit.unlink()
    h.unit.mkdir()


UNADOPTABLE: dict[str, tuple[Callable[[Host], None], str, str]] = {
    "symlinked script": (_symlink_script, "script", "is a symlink"),
    "symlinked unit": (_symlink_unit, "unit", "is a symlink"),
    "FIFO as script": (_fifo_script, "script", "is a FIFO, not a regular file"),
    "directory as unit": (_dir_as_unit, "unit", "is a directory, not a regular file"),
}


@pytest.mark.parametrize("case", sorted(UNADOPTABLE))
def test_a_refused_adoption_releases_the_lock_it_took(host: Host, case: str) -> None:
    damage, which, why = UNADOPTABLE[case]
    damage(host)
    path = host.script if which == "script" else host.unit
    with pytest.raises(Failed) as exc:
        host.call("begin", run_id="run-1", operator="alice")
    msg = str(exc.value)
    assert msg.startswith(f"cannot adopt {path}: ") and why in msg
    assert msg.endswith("and apply again; nothing was changed")
    assert not exc.value.result.get("lock_held")
    assert not os.path.lexists(host.store.lock), "the refused run left the host locked"
    assert not (host.state / "generations/0000").exists() and not os.path.lexists(host.state / "current")
    # Once the file is fixed, another operator's apply goes ahead: no "locked by alice".
    if os.path.isdir(path) and not path.is_symlink():
        path.rmdir()
    else:
        path.unlink()
    path.write_text(HAND_SCRIPT if which == "script" else HAND_UNIT)
    res = host.call("begin", run_id="run-2", operator="bob")
    assert (res["locked"], res["adopted"], res["generation"]) == (True, True, 0)

"""knob_serve_service may not name a unit the host's packages ship (issue 40: an apply with `ssh` wrote
/etc/systemd/system/ssh.service over the host's sshd and restarted it). knob_generation's install refuses, before
it takes the lock, adopts or writes anything, a unit name found in the package unit directories (here: temp dirs
standing in for /lib/systemd/system and /usr/lib/systemd/system; never this machine's); a hand-written serve unit
in /etc/systemd/system that no package ships is still adopted as generation 0, and a restore is never refused by
the check (it is how a host gets back)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from knobfleet.module_utils import knob_commit, knob_pkgmeta, knob_txn
from tests.unit.roles.test_knob_generation import Failed, FakeModule, Host, profile, script, unit

HAND_UNIT = "[Service]\nExecStart=/root/serve.sh\n"
SSHD = "[Unit]\nDescription=OpenBSD Secure Shell server\n[Service]\nExecStart=/usr/sbin/sshd -D\n"


@pytest.fixture(autouse=True)
def no_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(knob_commit, "validate_staged", lambda module, kind, path, script_path: None)


@pytest.fixture
def pkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """The host's package unit directories, in the test's temp dir."""
    dirs = (tmp_path / "pkg/lib/systemd/system", tmp_path / "pkg/usr/lib/systemd/system")
    for d in dirs:
        d.mkdir(parents=True)
    monkeypatch.setattr(knob_pkgmeta, "PACKAGE_UNIT_DIRS", tuple(str(d) for d in dirs))
    return dirs


def named(tmp_path: Path, service: str, unit_dir: Path | None = None, script_there: bool = True) -> Host:
    h = Host(tmp_path)
    h.unit = (unit_dir or tmp_path / "etc/systemd/system") / f"{service}.service"
    h.script.parent.mkdir(parents=True, exist_ok=True)
    if script_there:
        h.script.write_text("#!/bin/bash\nexec /usr/bin/engine\n")
    return h


def install(h: Host, n: int, module: FakeModule | None = None, **kw: Any) -> dict[str, Any]:
    p = h.params("install", script_content=script(n), unit_content=unit(n), profile=profile(n), **kw)
    result: dict[str, Any] = knob_txn.HANDLERS["install"](module or FakeModule(), h.store, p)
    return result


def finish(h: Host, generation: int, run_id: str = "run-1") -> None:
    knob_txn.HANDLERS["finish"](
        FakeModule(), h.store, h.params("finish", generation=generation, status="good", run_id=run_id)
    )


def tree(root: Path) -> dict[str, bytes | None]:
    return {str(p): (p.read_bytes() if p.is_file() and not p.is_symlink() else None) for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("where", [0, 1], ids=["lib", "usr-lib"])
@pytest.mark.parametrize(
    ("service", "shipped", "kind"),
    [
        ("ssh", "ssh.service", "file"),
        ("nginx", "nginx.service", "file"),
        ("sshd", "sshd.service", "alias"),  # Debian's alias: a symlink to ssh.service
        ("getty@tty9", "getty@.service", "file"),  # an instance of a template the package ships
        ("gone", "gone.service", "dangling"),  # whatever is there is never opened: a dangling link counts
        ("fifo", "fifo.service", "fifo"),
    ],
)
@pytest.mark.parametrize("check_mode", [False, True], ids=["apply", "plan"])
def test_a_unit_the_hosts_packages_ship_is_refused_before_anything_changes(
    tmp_path: Path, pkg: tuple[Path, Path], where: int, service: str, shipped: str, kind: str, check_mode: bool
) -> None:
    import os

    target = pkg[where] / shipped
    if kind == "file":
        target.write_text(SSHD)
    elif kind == "alias":
        (pkg[where] / "ssh.service").write_text(SSHD)
        target.symlink_to("ssh.service")
    elif kind == "dangling":
        target.symlink_to("nowhere.service")
    else:
        os.mkfifo(target)
    h = named(tmp_path, service)
    before = tree(tmp_path)
    with pytest.raises(Failed) as err:
        install(h, 1, FakeModule(check_mode=check_mode))
    msg = err.value.result["msg"]
    assert msg == (
        f"knob_serve_service {service} names a unit the host's packages ship ({target}): installing {h.unit} would "
        "take the place of the host's own service and restart it; set knob_serve_service to a name of the "
        "engine's own; nothing was changed"
    )
    assert err.value.result["refused"] is True and err.value.result["failed_step"] == "begin"
    assert tree(tmp_path) == before  # no state dir, lock, generation 0, ledger or unit: nothing written
    assert not h.state.exists() and not h.unit.exists()


def test_a_hand_written_serve_unit_in_etc_is_still_adopted(tmp_path: Path, pkg: tuple[Path, Path]) -> None:
    (pkg[0] / "ssh.service").write_text(SSHD)  # the host's own units, under other names
    (pkg[1] / "nginx.service").write_text(SSHD)
    (pkg[1] / "sglang@.service").write_text(SSHD)  # a template: only its instances (sglang@X) are its units
    for service in ("svc", "sglang", "ssh-tunnel-engine"):
        h = named(tmp_path / service, service)
        h.unit.parent.mkdir(parents=True)
        h.unit.write_text(HAND_UNIT)
        h.unit.chmod(0o640)
        res = install(h, 1)
        assert res["steps"]["begin"]["adopted"] and res["steps"]["commit"]["generation"] == 1
        assert (
            h.meta(0)["files"]["unit"]["path"] == str(h.unit)
            and (h.state / "generations/0000" / h.unit.name).read_text() == HAND_UNIT
        )
        assert h.unit.read_text() == unit(1)


def test_a_commit_on_its_own_is_refused_too(tmp_path: Path, pkg: tuple[Path, Path]) -> None:
    h = named(tmp_path, "ssh")
    h.call("begin")  # no package ships ssh yet
    h.stage(script(1), unit(1))
    (pkg[1] / "ssh.service").write_text(SSHD)
    with pytest.raises(Failed) as err:
        h.call("commit", profile=profile(1))
    assert err.value.result["refused"] and "names a unit the host's packages ship" in err.value.result["msg"]
    assert not h.unit.exists()


def test_an_earlier_apply_is_named_and_a_restore_is_never_refused(tmp_path: Path, pkg: tuple[Path, Path]) -> None:
    h = named(tmp_path, "ssh", script_there=False)  # nothing of knobfleet's there before its first apply
    install(h, 1)  # an older knobfleet, before the package check: /etc/systemd/system/ssh.service is knobfleet's
    finish(h, 1)
    (pkg[0] / "ssh.service").write_text(SSHD)
    with pytest.raises(Failed) as err:
        install(h, 2, run_id="run-2")
    assert err.value.result["msg"].endswith(
        f"(an earlier apply installed {h.unit}: remove it and run systemctl daemon-reload); nothing was changed"
    )
    assert h.unit.read_text() == unit(1) and h.generations() == ["0000", "0001"]
    assert not Path(h.store.lock).exists()
    # the way back: a restore's begin (restore.yml) and the restore itself; generation 0 held no unit
    module = FakeModule()
    h.call("begin", run_id="run-3")
    res = h.call("restore", module, generation=0, event="restore", run_id="run-3")
    assert res["uninstalled"] and not h.unit.exists()
    assert ["systemctl", "disable", "--now", "ssh.service"] in module.commands


def test_a_package_directory_as_the_unit_dir_is_accepted_only_for_knobfleets_own_file(
    tmp_path: Path, pkg: tuple[Path, Path]
) -> None:
    h = named(tmp_path, "engine", unit_dir=pkg[1])
    install(h, 1)  # nothing there before: knobfleet's first unit in that directory
    finish(h, 1)
    res = install(h, 2, run_id="run-2")  # knobfleet's own file now: not the host's
    assert res["steps"]["commit"]["generation"] == 2 and h.unit.read_text() == unit(2)
    other = named(tmp_path / "other", "nginx", unit_dir=pkg[1])
    other.unit.write_text(SSHD)  # a unit found there before knobfleet: a package's, as far as anyone can tell
    with pytest.raises(Failed) as err:
        install(other, 1)
    assert f"({other.unit})" in err.value.result["msg"] and other.unit.read_text() == SSHD

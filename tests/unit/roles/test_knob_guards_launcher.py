"""knob_guards' launcher checks (issue 56): root never runs, from a new generation or a restored one, a launcher
that is gone or that another user can change (the file, a folder on its path, a symlink or any hop of one). Every
node is made in a temp dir (data-driven); nothing of this machine's own files is touched."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from knobfleet.module_utils import knob_guards
from knobfleet.module_utils.knob_guards import check_launcher, exec_path_problem, launcher_paths

OTHER = 4242  # a uid that is not root


@pytest.fixture(autouse=True)
def checks_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(knob_guards, "LAUNCHER_CHECKS", True)


def exe(path: Path, mode: int = 0o755) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(mode)
    return path


def _file_0777(t: Path) -> Path:
    return exe(t / "bin" / "py", 0o777)


def _file_group_writable(t: Path) -> Path:
    p = exe(t / "bin" / "py", 0o775)
    os.chown(p, 0, OTHER)
    return p


def _file_of_another_user(t: Path) -> Path:
    p = exe(t / "bin" / "py")
    os.chown(p, OTHER, 0)
    return p


def _folder_0777(t: Path) -> Path:
    p = exe(t / "open" / "py")
    (t / "open").chmod(0o777)
    return p


def _folder_of_another_user(t: Path) -> Path:
    p = exe(t / "theirs" / "py")
    os.chown(t / "theirs", OTHER, 0)
    return p


def _link_into_their_folder(t: Path) -> Path:
    target = exe(t / "theirs" / "py")
    os.chown(t / "theirs", OTHER, 0)
    (t / "bin").mkdir()
    (t / "bin" / "py").symlink_to(target)
    return t / "bin" / "py"


def _link_they_own(t: Path) -> Path:
    target = exe(t / "real" / "py")
    (t / "sticky").mkdir(mode=0o1777)
    (t / "sticky").chmod(0o1777)
    link = t / "sticky" / "py"
    link.symlink_to(target)
    os.lchown(link, OTHER, 0)
    return link


def _a_middle_hop_they_own(t: Path) -> Path:
    real = exe(t / "real" / "py")
    (t / "sticky").mkdir()
    (t / "sticky").chmod(0o1777)
    hop = t / "sticky" / "hop"
    hop.symlink_to(real)
    os.lchown(hop, OTHER, 0)
    (t / "bin").mkdir()
    (t / "bin" / "py").symlink_to(hop)  # root's link, through a hop another user can repoint
    return t / "bin" / "py"


def _folder_link_into_theirs(t: Path) -> Path:
    exe(t / "theirs" / "venv" / "bin" / "py")
    os.chown(t / "theirs" / "venv", OTHER, 0)
    (t / "opt").mkdir()
    (t / "opt" / "venv").symlink_to("../theirs/venv")  # relative, with ..
    return t / "opt" / "venv" / "bin" / "py"


REFUSED: list[tuple[str, Callable[[Path], Path], str]] = [
    ("file mode 0777", _file_0777, "writable by every user (mode 0777)"),
    ("file group-writable", _file_group_writable, f"writable by group {OTHER}"),
    ("file of another user", _file_of_another_user, f"owned by uid {OTHER}"),
    ("folder 0777", _folder_0777, "writable by every user (mode 0777)"),
    ("folder of another user", _folder_of_another_user, f"owned by uid {OTHER}"),
    ("symlink into their folder", _link_into_their_folder, f"owned by uid {OTHER}"),
    ("symlink they own in a sticky folder", _link_they_own, f"is a symlink owned by uid {OTHER}"),
    ("a middle hop they own", _a_middle_hop_they_own, f"is a symlink owned by uid {OTHER}"),
    ("a folder symlink into theirs", _folder_link_into_theirs, f"owned by uid {OTHER}"),
]


@pytest.mark.parametrize(("case", "make", "why"), REFUSED, ids=[c[0] for c in REFUSED])
def test_a_launcher_another_user_can_change_is_found(case: str, make: Callable[[Path], Path], why: str,
                                                     tmp_path: Path) -> None:  # fmt: skip
    assert why in (exec_path_problem(str(make(tmp_path))) or ""), case


def _root_only(t: Path) -> Path:
    return exe(t / "bin" / "py")


def _in_a_sticky_folder(t: Path) -> Path:
    p = exe(t / "sticky" / "py")
    (t / "sticky").chmod(0o1777)  # the sticky bit protects the file, which is root's and 0755
    return p


def _roots_link_chain(t: Path) -> Path:
    real = exe(t / "usr" / "bin" / "python3.11")
    (t / "usr" / "bin" / "python3").symlink_to("python3.11")
    (t / "bin").symlink_to("usr/bin")
    assert real.exists()
    return t / "bin" / "python3"


ACCEPTED = [("root-only", _root_only), ("in a sticky folder", _in_a_sticky_folder), ("root's links", _roots_link_chain)]


@pytest.mark.parametrize(("case", "make"), ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_a_root_only_launcher_passes(case: str, make: Callable[[Path], Path], tmp_path: Path) -> None:
    assert exec_path_problem(str(make(tmp_path))) is None, case


def test_a_missing_part_and_a_loop_are_named(tmp_path: Path) -> None:
    assert exec_path_problem(str(tmp_path / "gone" / "py")) == f"{tmp_path / 'gone'} does not exist"
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    assert "too many levels of symlinks" in (exec_path_problem(str(tmp_path / "a")) or "")


@pytest.mark.parametrize(
    ("script", "paths"),
    [
        ("export A=1\nexec /opt/v/bin/python3 -m sglang.launch_server --port 1\n", ["/opt/v/bin/python3"]),
        ("exec /usr/bin/python3 /srv/serve.py --x\n", ["/usr/bin/python3", "/srv/serve.py"]),
        ("exec /usr/bin/bash /srv/run.sh\n", ["/usr/bin/bash", "/srv/run.sh"]),
        ("exec /opt/engine /srv/model\n", ["/opt/engine"]),  # not an interpreter: its argument is data
        ("exec python3 -m vllm.entrypoints\n", ["python3"]),
        ("echo no exec\n", []),
    ],
)
def test_the_files_a_serve_script_runs(script: str, paths: list[str]) -> None:
    assert launcher_paths(script) == paths


class Refused(Exception):
    pass


class Module:
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def fail_json(self, **kw: Any) -> None:
        raise Refused(kw)

    def warn(self, text: str) -> None:
        self.warnings.append(text)


def test_check_launcher_refuses_a_gone_or_open_launcher_in_one_line(tmp_path: Path) -> None:
    gone = tmp_path / "venv-0.5.22" / "bin" / "python3"
    with pytest.raises(Refused) as exc:
        check_launcher(Module(), {}, f"exec {gone} -m sglang.launch_server\n", "generation 0003")
    msg = exc.value.args[0]["msg"]
    assert msg.startswith(f"generation 0003 launches {gone}, which does not exist on this host")
    assert "nothing was changed" in msg and "\n" not in msg and exc.value.args[0]["launcher_missing"] == str(gone)

    open_py = _file_0777(tmp_path)
    script = f"exec {open_py} -m sglang.launch_server\n"
    with pytest.raises(Refused) as exc:
        check_launcher(Module(), {"service_user": "root"}, script, "the new generation")
    assert "any such user can run code as root" in exc.value.args[0]["msg"] and exc.value.args[0]["refused"]
    # an engine that runs as another user: its own files are its business; the override warns instead
    assert check_launcher(Module(), {"service_user": "sglang"}, script, "the new generation") is None
    m = Module()
    assert "writable by every user" in (check_launcher(m, {"allow_writable_script_dir": True}, script, "x") or "")
    assert m.warnings
    # an interpreter's script argument counts too
    their_script = _file_of_another_user(tmp_path / "s")
    with pytest.raises(Refused, match=f"launches {their_script} as root"):
        check_launcher(Module(), {}, f"exec {exe(tmp_path / 'r' / 'python3')} {their_script}\n", "the new generation")
    assert check_launcher(Module(), {}, f"exec {_root_only(tmp_path / 'ok')} -m x\n", "the new generation") is None

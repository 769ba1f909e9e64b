"""Host file safety (module_utils/knob_fs.py): the attacks an unprivileged owner of a directory knobfleet
writes into can mount, run for real on this machine's filesystem (tmp dirs; the tests run as root)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from knobfleet.module_utils import knob_fs
from knobfleet.module_utils.knob_fs import UnsafePath

NOBODY = 65534


def test_write_replaces_a_symlink_at_the_target_instead_of_following_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    d = tmp_path / "scripts"
    d.mkdir()
    (d / "serve.sh").symlink_to(victim)
    knob_fs.write(str(d / "serve.sh"), b"#!/bin/bash\n", 0o755)
    assert victim.read_text() == "root's file\n"
    assert not (d / "serve.sh").is_symlink() and (d / "serve.sh").read_bytes() == b"#!/bin/bash\n"
    st = (d / "serve.sh").stat()
    assert (st.st_mode & 0o7777, st.st_uid) == (0o755, 0)


def test_a_symlinked_directory_in_the_path_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(UnsafePath, match="symlink"):
        knob_fs.write(str(tmp_path / "link" / "serve.sh"), b"x", 0o644)
    assert list((tmp_path / "real").iterdir()) == []


def test_a_prepared_temp_name_cannot_redirect_the_write(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    for guess in (".serve.sh.knobfleet-tmp", ".serve.sh.tmp", "serve.sh.tmp"):
        (tmp_path / guess).symlink_to(victim)
    knob_fs.write(str(tmp_path / "serve.sh"), b"new\n", 0o755)
    assert victim.read_text() == "keep\n" and (tmp_path / "serve.sh").read_bytes() == b"new\n"


@pytest.mark.parametrize("kind", ["symlink to /dev/zero", "fifo", "directory", "too large"])
def test_reads_refuse_what_is_not_a_small_regular_file(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "f"
    if kind == "symlink to /dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_bytes(b"x" * 1025)
    with pytest.raises(OSError):
        knob_fs.read(str(path), limit=1024)


def test_state_dir_must_be_roots_alone(tmp_path: Path) -> None:
    mine = tmp_path / "state"
    fd = knob_fs.private_dir(str(mine))
    os.close(fd)
    assert (mine.stat().st_mode & 0o777) == 0o700
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(UnsafePath, match="owned by root"):
        knob_fs.private_dir(str(theirs))
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o777)
    loose.chmod(0o777)
    with pytest.raises(UnsafePath):
        knob_fs.private_dir(str(loose))


def test_unlink_and_exists_never_follow(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("x")
    (tmp_path / "l").symlink_to(victim)
    assert knob_fs.exists(str(tmp_path / "l"))
    assert knob_fs.unlink(str(tmp_path / "l")) and victim.exists()
    assert not knob_fs.unlink(str(tmp_path / "l")) and knob_fs.sha256(str(tmp_path / "nope")) is None

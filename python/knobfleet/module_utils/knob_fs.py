"""Safe file access on a host where other users may own the directories knobfleet writes into.

Every path is opened from ``/`` one component at a time with ``O_NOFOLLOW`` (a symlink anywhere in it is
refused, never followed), files are created under random ``O_EXCL`` names in a directory file descriptor,
owner and mode are set on the descriptor (``fchown``/``fchmod``), and the file is renamed into place
relative to the same descriptor. Reads are bounded and refuse anything but a regular file. Standard
library only: ``ansible.module_utils.knob_fs`` on hosts, ``knobfleet.module_utils.knob_fs`` in tests."""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import stat
from typing import Any

MAX_FILE = 4 * 1024 * 1024  # no managed file is anywhere near this
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePath(OSError):
    """A path knobfleet refuses to use: a symlink in it, or not a regular file / directory."""


def _components(path: str) -> list[str]:
    if not path.startswith("/"):
        raise UnsafePath(errno.EINVAL, "not an absolute path", path)
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise UnsafePath(errno.EINVAL, "'.' or '..' in path", path)
    return parts


def open_dir(path: str, create_mode: int | None = None) -> int:
    """A descriptor of directory ``path``, opened without following any symlink; missing components are
    created (root-owned, ``create_mode``) when ``create_mode`` is given."""
    fd = os.open("/", DIR_FLAGS)
    walked = ""
    try:
        for part in _components(path):
            walked += "/" + part
            try:
                nfd = os.open(part, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if create_mode is None:
                    raise
                try:
                    os.mkdir(part, create_mode, dir_fd=fd)
                except FileExistsError:
                    pass
                nfd = os.open(part, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UnsafePath(
                        exc.errno,
                        "is a symlink or not a directory; knobfleet does not follow symlinks in the paths it manages",
                        walked,
                    ) from None
                raise
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def dir_state(fd: int) -> dict[str, Any]:
    st = os.fstat(fd)
    return {"uid": st.st_uid, "mode": st.st_mode & 0o7777, "others_can_write": bool(st.st_mode & 0o022)}


def private_dir(path: str) -> int:
    """knobfleet's own state directory: created 0700, and refused unless root owns it and nobody else can
    write to it (another owner could swap what knobfleet reads back)."""
    fd = open_dir(path, create_mode=0o700)
    st = dir_state(fd)
    if st["uid"] != 0 or st["others_can_write"]:
        os.close(fd)
        raise UnsafePath(errno.EPERM, "must be owned by root and writable by root only (chown root; chmod go-w)", path)
    return fd


def split(path: str) -> tuple[str, str]:
    parent, _, name = path.rstrip("/").rpartition("/")
    if not name:
        raise UnsafePath(errno.EINVAL, "no file name", path)
    return parent or "/", name


def read_at(dfd: int, name: str, limit: int = MAX_FILE) -> bytes:
    """The regular file ``name`` in directory ``dfd``; a symlink, FIFO or device is refused, and so is a file
    larger than ``limit``."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(exc.errno, "is a symlink; knobfleet reads regular files only", name) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(errno.EINVAL, "is not a regular file", name)
        data = b""
        while len(data) <= limit:
            chunk = os.read(fd, min(1 << 16, limit + 1 - len(data)))
            if not chunk:
                break
            data += chunk
        if len(data) > limit:
            raise UnsafePath(errno.EFBIG, "is larger than %d bytes" % limit, name)
        return data
    finally:
        os.close(fd)


def read(path: str, limit: int = MAX_FILE) -> bytes:
    parent, name = split(path)
    dfd = open_dir(parent)
    try:
        return read_at(dfd, name, limit)
    finally:
        os.close(dfd)


def sha256(path: str) -> str | None:
    """sha256 of the regular file at ``path``; None when it does not exist."""
    try:
        return hashlib.sha256(read(path)).hexdigest()
    except FileNotFoundError:
        return None


def write_at(dfd: int, name: str, data: bytes, mode: int, uid: int = 0, gid: int = 0) -> None:
    """Create ``name`` in ``dfd`` atomically: a random O_EXCL temp file, owner and mode set on its descriptor,
    fsync, rename over ``name`` (a symlink there is replaced, never followed), fsync of the directory."""
    tmp = ".%s.%s.knobfleet-tmp" % (name, secrets.token_hex(8))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchown(fd, uid, gid)
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        raise
    os.fsync(dfd)


def write(path: str, data: bytes, mode: int, uid: int = 0, gid: int = 0, create_dirs: int | None = None) -> None:
    parent, name = split(path)
    dfd = open_dir(parent, create_mode=create_dirs)
    try:
        write_at(dfd, name, data, mode, uid, gid)
    finally:
        os.close(dfd)


def unlink(path: str) -> bool:
    """Remove the file at ``path`` (never following a symlink in its directories); False when it was gone."""
    parent, name = split(path)
    try:
        dfd = open_dir(parent)
    except FileNotFoundError:
        return False
    try:
        os.unlink(name, dir_fd=dfd)
        return True
    except FileNotFoundError:
        return False
    finally:
        os.close(dfd)


def exists(path: str) -> bool:
    parent, name = split(path)
    try:
        dfd = open_dir(parent)
    except (FileNotFoundError, UnsafePath):
        return False
    try:
        os.stat(name, dir_fd=dfd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False
    finally:
        os.close(dfd)

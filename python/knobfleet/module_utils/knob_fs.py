"""Safe file access on a host where other users may own the directories knobfleet writes into.

Every path is opened from ``/`` one component at a time with ``O_NOFOLLOW`` (a symlink anywhere in it is
refused, never followed), files are created under random ``O_EXCL`` names in a directory file descriptor,
owner and mode are set on the descriptor (``fchown``/``fchmod``), and the file is renamed into place
relative to the same descriptor. Reads are bounded and refuse anything but a regular file. Standard
library only: ``ansible.module_utils.knob_fs`` on hosts, ``knobfleet.module_utils.knob_fs`` in tests."""

from __future__ import annotations

import errno
import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: the probe imports this file on every run, and ``typing`` costs it ~5 ms
    from collections.abc import Callable
    from typing import Any, TypeVar

    R = TypeVar("R")

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


def kind_of(mode: int) -> str:
    """What a file type is called in knobfleet's messages."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symlink"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def read_stat_at(dfd: int, name: str, limit: int = MAX_FILE, single_link: bool = False) -> tuple[bytes, os.stat_result]:
    """The regular file ``name`` in directory ``dfd`` and its stat. Opened ``O_NONBLOCK`` (a FIFO never blocks
    the open) and checked on the descriptor before a byte is read: a symlink, FIFO, device, socket or
    directory is refused, and so is a file larger than ``limit`` (by its size, without reading it) and, with
    ``single_link``, a file with more than one hard link (it may be another file's content)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(exc.errno, "is a symlink; knobfleet reads regular files only", name) from None
        if exc.errno in (errno.ENXIO, errno.EISDIR, errno.EOPNOTSUPP, errno.ENODEV):  # a socket, device, dir
            raise UnsafePath(exc.errno, "is not a regular file", name) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(errno.EINVAL, "is %s, not a regular file" % kind_of(st.st_mode), name)
        if single_link and st.st_nlink > 1:
            raise UnsafePath(errno.EMLINK, "has %d hard links (it may be another file's content)" % st.st_nlink, name)
        if st.st_size > limit:
            raise UnsafePath(errno.EFBIG, "is larger than %d bytes" % limit, name)
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 16, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:  # grew while read
            raise UnsafePath(errno.EFBIG, "is larger than %d bytes" % limit, name)
        return b"".join(chunks), st
    finally:
        os.close(fd)


def read_at(dfd: int, name: str, limit: int = MAX_FILE) -> bytes:
    """The regular file ``name`` in directory ``dfd`` (see ``read_stat_at``)."""
    return read_stat_at(dfd, name, limit)[0]


def read_stat(path: str, limit: int = MAX_FILE, single_link: bool = False) -> tuple[bytes, os.stat_result]:
    """The regular file at ``path`` and its stat, never following a symlink anywhere in the path."""
    return in_parent(path, lambda dfd, name: read_stat_at(dfd, name, limit, single_link))


def read(path: str, limit: int = MAX_FILE) -> bytes:
    return read_stat(path, limit)[0]


def lstat(path: str) -> os.stat_result:
    """The stat of whatever is at ``path`` (not following a final symlink, nor one in the directories)."""
    return in_parent(path, lambda dfd, name: os.stat(name, dir_fd=dfd, follow_symlinks=False))


def in_parent(path: str, fn: Callable[[int, str], R], create_mode: int | None = None) -> R:
    """``fn(dfd, name)``: ``path``'s last component ``name`` in its directory ``dfd``, opened without following
    any symlink (missing directories made ``create_mode`` when given), and closed after."""
    parent, name = split(path)
    dfd = open_dir(parent, create_mode=create_mode)
    try:
        return fn(dfd, name)
    finally:
        os.close(dfd)


def same_content(path: str, data: bytes, access: tuple[int, int, int] | None = None) -> bool:
    """Whether the file at ``path`` is a single-link regular file holding exactly ``data`` (and, with ``access``
    = (mode, uid, gid), with exactly that mode and owner). Compared by size first: a larger file, a FIFO or a
    device is read not at all (it simply differs), so an oversized or special file there can always be replaced."""
    try:
        st = lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1 or st.st_size != len(data):
        return False
    if access is not None and (st.st_mode & 0o7777, st.st_uid, st.st_gid) != access:
        return False
    try:
        return read_stat(path, max(len(data), 1), single_link=True)[0] == data
    except UnsafePath:
        return False


def entries(dfd: int) -> list[tuple[str, bool]]:
    """(name, is a real directory) of every entry of the directory ``dfd``; symlinks are never followed (a
    symlink to a directory is not a directory here)."""
    with os.scandir(dfd) as it:
        return sorted((e.name, e.is_dir(follow_symlinks=False)) for e in it)


def remove_tree_at(dfd: int, name: str, depth: int = 4) -> None:
    """Remove directory ``name`` of ``dfd`` and what it holds, never leaving it: each level is opened with
    ``O_NOFOLLOW`` relative to its parent, a symlink inside is unlinked (never followed), and nothing deeper
    than ``depth`` levels is touched (knobfleet's own directories are one level deep)."""
    fd = os.open(name, DIR_FLAGS, dir_fd=dfd)
    try:
        for child, is_dir in entries(fd):
            if is_dir:
                if depth <= 0:
                    raise UnsafePath(errno.ENOTEMPTY, "holds directories nested deeper than knobfleet makes", name)
                remove_tree_at(fd, child, depth - 1)
            else:
                os.unlink(child, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dfd)


def append_line(path: str, line: bytes, mode: int = 0o600) -> None:
    """Append ``line`` (one line, ending in a newline) to the regular file at ``path``, created ``mode`` when
    missing. Never blocks (``O_NONBLOCK``: a FIFO there is refused, not waited on), never follows a symlink,
    and starts on a fresh line: when the file's last byte is not a newline (a line cut short by a crash or a
    full disk) a newline goes first, so a truncated entry never swallows this one."""
    parent, name = split(path)
    dfd = open_dir(parent)
    try:
        try:
            fd = os.open(
                name,
                os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                mode,
                dir_fd=dfd,
            )
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.EOPNOTSUPP, errno.ENODEV):
                raise UnsafePath(
                    exc.errno, "is not a regular file; knobfleet appends to regular files only", path
                ) from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise UnsafePath(errno.EINVAL, "is %s, not a regular file" % kind_of(st.st_mode), path)
            if st.st_size and os.pread(fd, 1, st.st_size - 1) != b"\n":
                line = b"\n" + line
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        os.close(dfd)


def sha256(path: str) -> str | None:
    """sha256 of the regular file at ``path``; None when it does not exist."""
    import hashlib

    try:
        return hashlib.sha256(read(path)).hexdigest()
    except FileNotFoundError:
        return None


def write_at(
    dfd: int, name: str, data: bytes, mode: int, uid: int = 0, gid: int = 0, renamed: list[bool] | None = None
) -> None:
    """Create ``name`` in ``dfd`` atomically: a random O_EXCL temp file, owner and mode set on its descriptor,
    fsync, rename over ``name`` (a symlink there is replaced, never followed; ``renamed`` then gets True: the
    file changed), fsync of the directory."""
    tmp = ".%s.%s.knobfleet-tmp" % (name, os.urandom(8).hex())  # secrets.token_hex, without its import
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
        if renamed is not None:
            renamed.append(True)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        raise
    os.fsync(dfd)


def write(path: str, data: bytes, mode: int, uid: int = 0, gid: int = 0, create_dirs: int | None = None) -> None:
    in_parent(path, lambda dfd, name: write_at(dfd, name, data, mode, uid, gid), create_dirs)


def unlink(path: str) -> bool:
    """Remove the file at ``path`` (never following a symlink in its directories); False when it was gone."""
    try:
        in_parent(path, lambda dfd, name: os.unlink(name, dir_fd=dfd))
    except FileNotFoundError:
        return False
    return True


def exists(path: str) -> bool:
    """Whether anything (a symlink too) is at ``path``, reached without following a symlink on the way; a path
    without a file name is refused (``split``), a symlink on the way is not a file there."""
    split(path)
    try:
        in_parent(path, lambda dfd, name: os.stat(name, dir_fd=dfd, follow_symlinks=False))
    except (FileNotFoundError, UnsafePath):
        return False
    return True


def _let_go(dfd: int, keep: str | tuple[bytes, os.stat_result] | None) -> None:
    """The link kept of a file that did not change after all (``Install``)."""
    if isinstance(keep, str):
        try:
            os.unlink(keep, dir_fd=dfd)
        except OSError:
            pass


class Install:
    """Replace (or remove) several host files all or none. Before a file is replaced, the file there is kept
    under a hard link ``.NAME.knobfleet-prev`` in its own directory (no data copied, so a full disk cannot stop
    the way back); ``undo`` renames each back atomically, ``done`` drops the links. Where the filesystem has no
    hard links, the old file is read (bounded) and written back with its mode and owner."""

    def __init__(self) -> None:
        self.changed: list[
            tuple[str, str | tuple[bytes, os.stat_result] | None]
        ] = []  # (path, a link name, None (was absent), or (bytes, stat))

    def _keep(self, dfd: int, name: str, path: str) -> str | tuple[bytes, os.stat_result] | None:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if stat.S_ISDIR(st.st_mode):
            raise UnsafePath(errno.EISDIR, "is a directory; remove it and apply again", path)
        keep = ".%s.knobfleet-prev" % name
        try:
            os.unlink(keep, dir_fd=dfd)
        except FileNotFoundError:
            pass
        try:
            os.link(name, keep, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
            return keep
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV):
                raise
        return read_stat_at(dfd, name)

    def put(self, path: str, data: bytes, mode: int, uid: int = 0, gid: int = 0) -> None:
        parent, name = split(path)
        dfd = open_dir(parent, create_mode=0o755)
        renamed: list[bool] = []
        keep: str | tuple[bytes, os.stat_result] | None = None
        try:  # recorded once it changed: a file that could not be written (immutable) is never "put back"
            keep = self._keep(dfd, name, path)
            write_at(dfd, name, data, mode, uid, gid, renamed)
        finally:
            if renamed:
                self.changed.append((path, keep))
            else:
                _let_go(dfd, keep)
            os.close(dfd)

    def remove(self, path: str) -> None:
        parent, name = split(path)
        dfd = open_dir(parent)
        keep: str | tuple[bytes, os.stat_result] | None = None
        try:
            keep = self._keep(dfd, name, path)
            os.unlink(name, dir_fd=dfd)
            self.changed.append((path, keep))
        except BaseException:
            _let_go(dfd, keep)
            raise
        finally:
            os.close(dfd)

    def undo(self) -> tuple[list[str], list[str]]:
        """Every changed file back as it was; returns the paths put back and those that could not be."""
        back: list[str] = []
        stuck: list[str] = []
        for path, keep in reversed(self.changed):
            parent, name = split(path)
            try:
                dfd = open_dir(parent)
                try:
                    if keep is None:
                        try:
                            os.unlink(name, dir_fd=dfd)
                        except FileNotFoundError:
                            pass
                    elif isinstance(keep, str):
                        os.rename(keep, name, src_dir_fd=dfd, dst_dir_fd=dfd)
                        try:  # renaming a hard link onto its own file does nothing: the link is still there
                            os.unlink(keep, dir_fd=dfd)
                        except FileNotFoundError:
                            pass
                    else:
                        data, st = keep
                        write_at(dfd, name, data, st.st_mode & 0o7777, st.st_uid, st.st_gid)
                finally:
                    os.close(dfd)
                back.append(path)
            except OSError:
                stuck.append(path)
        self.changed = []
        return back, stuck

    def done(self) -> None:
        """Drop the kept links (best effort: one left behind is removed by the next ``put`` of that file)."""
        for path, keep in self.changed:
            if isinstance(keep, str):
                try:
                    unlink(os.path.join(split(path)[0], keep))
                except OSError:
                    pass
        self.changed = []


def writable_by_others(path: str) -> tuple[str, str] | None:
    """The first directory of ``path``'s parents that a non-root user can change (owned by another user, or
    group/other-writable — a sticky bit protects entries only in the directories above the file's own), with
    why; None when only root can (or when the path is refused anyway: a symlink on it, a missing directory
    that knobfleet creates root-owned 0755)."""
    parts = [x for x in os.path.dirname(path).split("/") if x]
    walked = ""
    for i in range(len(parts) + 1):
        walked = walked + "/" + parts[i - 1] if i else "/"
        try:
            st = os.stat(walked, follow_symlinks=False)
        except OSError:
            return None
        mode = st.st_mode
        if stat.S_ISLNK(mode):
            return None
        last = i == len(parts)
        if st.st_uid != 0:
            return walked, "owned by uid %d" % st.st_uid
        if mode & 0o002 and (last or not mode & stat.S_ISVTX):
            return walked, "writable by every user (mode %04o)" % (mode & 0o7777)
        if mode & 0o020 and st.st_gid != 0 and (last or not mode & stat.S_ISVTX):
            return walked, "writable by group %d (mode %04o)" % (st.st_gid, mode & 0o7777)
    return None


MAX_READ = 1024 * 1024  # never read more than this of any file (a link to /dev/zero must not exhaust memory)


def read_bounded_at(
    dfd: int | None, path: str, limit: int = MAX_READ, single_link: bool = True
) -> tuple[bytes, bool, os.stat_result]:
    """Up to ``limit`` bytes of the regular file ``path`` (relative to directory ``dfd``), whether it was cut,
    and its stat. Opened ``O_NONBLOCK`` and never through a symlink: a FIFO, device, socket or directory raises
    OSError before a byte is read, so no reader ever blocks or runs unbounded. ``single_link``: a file with more
    than one hard link (it may be another file's content, a root-only one) raises OSError(EMLINK) unread."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError as exc:
        if exc.errno in (errno.ENXIO, errno.EOPNOTSUPP, errno.ENODEV):  # a socket or a device without a driver
            raise OSError(errno.EINVAL, "not a regular file", path) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        if single_link and st.st_nlink > 1:
            raise OSError(errno.EMLINK, "has %d hard links (it may be another file's content), not read" % st.st_nlink,
                          path)  # fmt: skip
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(65536, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
        return data[:limit], len(data) > limit, st
    finally:
        os.close(fd)


def read_bounded(path: str, limit: int = MAX_READ, single_link: bool = True) -> tuple[bytes, bool, os.stat_result]:
    """``read_bounded_at`` of an absolute path, its directories opened without following any symlink."""
    return in_parent(path, lambda dfd, name: read_bounded_at(dfd, name, limit, single_link))

"""Files the operator names on the command line (or in knobfleet.toml / the environment), read and written safely.

Inputs are regular files only, opened non-blocking (a FIFO never hangs the command) and read with a size bound
(``/dev/zero`` never fills memory). Outputs never replace a device, a FIFO, a socket, a directory or a symlink:
they are written to a temp file in the same folder and renamed over a regular file or a new path.

Every refusal is a ``FileRefused`` whose text is one phrase without the path; callers prefix the path and the
option. Stdlib only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import Any

KIB = 1024
MIB = 1024 * KIB


class FileRefused(Exception):
    """Why a path cannot be read or written (one phrase, no path)."""


_KINDS = (
    (stat.S_ISDIR, "is a directory"),
    (stat.S_ISCHR, "is a character device"),
    (stat.S_ISBLK, "is a block device"),
    (stat.S_ISFIFO, "is a FIFO (named pipe)"),
    (stat.S_ISSOCK, "is a socket"),
    (stat.S_ISLNK, "is a symlink"),
)


def kind(mode: int) -> str:
    for test, phrase in _KINDS:
        if test(mode):
            return phrase
    return "is not a regular file"


def _strerror(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def _open(path: Path) -> int:
    """A read-only descriptor of ``path`` that neither blocks on a FIFO nor takes a terminal; FileRefused."""
    try:
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise FileRefused(f"cannot read ({_strerror(exc)})") from None


def _refuse(st: os.stat_result, max_bytes: int, what: str) -> None:
    """FileRefused unless ``st`` is a regular file of at most ``max_bytes``."""
    if not stat.S_ISREG(st.st_mode):
        raise FileRefused(f"{kind(st.st_mode)}; a {what} must be a regular file")
    if st.st_size > max_bytes:
        raise FileRefused(f"is larger than {_size(max_bytes)}; a {what} is smaller, check the path")


def read_bytes(path: Path, max_bytes: int, what: str = "file") -> bytes:
    """The bytes of the regular file at ``path`` (symlinks followed), at most ``max_bytes``; raises FileRefused."""
    fd = _open(path)
    try:
        _refuse(os.fstat(fd), max_bytes, what)
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, min(MIB, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise FileRefused(f"is larger than {_size(max_bytes)}; a {what} is smaller, check the path")
        return b"".join(chunks)
    except OSError as exc:
        raise FileRefused(f"cannot read ({_strerror(exc)})") from None
    finally:
        os.close(fd)


def read_text(path: Path, max_bytes: int, what: str = "file") -> str:
    """``read_bytes`` decoded as UTF-8; a byte that is not UTF-8 is a refusal naming its offset."""
    raw = read_bytes(path, max_bytes, what)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FileRefused(f"byte {exc.start}: not valid UTF-8; save the {what} as UTF-8") from None


def check_input(path: Path, max_bytes: int, what: str = "file") -> None:
    """Refuse (FileRefused) what ``read_bytes`` would refuse, reading nothing but the file's metadata."""
    fd = _open(path)
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    _refuse(st, max_bytes, what)


def is_present(path: Path) -> bool:
    """Whether a file knobfleet looks for is there: True for a regular file (or a symlink to one), False when
    nothing is at ``path``; FileRefused for anything else there (a FIFO, device, socket or folder, a dangling symlink,
    a symlink loop, an unreadable folder on the way), which a caller must name rather than skip in silence."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise FileRefused("is a symlink to nothing (a dangling link: its target does not exist)") from None
        return False
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FileRefused("is a symlink loop") from None
        raise FileRefused(f"cannot be checked ({_strerror(exc)})") from None
    if not stat.S_ISREG(st.st_mode):
        raise FileRefused(kind(st.st_mode))
    return True


def not_a(where: str, exc: FileRefused, what: str, fix: str = "replace it with a regular YAML file") -> str:
    """The one line for what ``is_present`` or ``list_dir`` refused: ``PATH: is a FIFO (named pipe), not a profile
    file; replace it with a regular YAML file``, or, for what cannot be read, how to make it readable."""
    if str(exc).startswith("is "):
        return f"{where}: {exc}, not a {what}; {fix}"
    return f"{where}: {exc}; make it readable by this user (or remove it)"


def list_dir(path: Path) -> list[str] | None:
    """The names in the folder at ``path`` (symlinks followed), sorted; None when nothing is there; FileRefused
    when something else is there or the folder cannot be read (an unreadable folder is never an empty one)."""
    try:
        with os.scandir(path) as entries:
            return sorted(e.name for e in entries)
    except FileNotFoundError:
        if os.path.islink(path):
            raise FileRefused("is a symlink to nothing (a dangling link: its target does not exist)") from None
        return None
    except NotADirectoryError:
        try:
            mode = os.stat(path).st_mode
        except OSError:
            raise FileRefused("is not a directory") from None
        raise FileRefused("is a regular file" if stat.S_ISREG(mode) else kind(mode)) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FileRefused("is a symlink loop") from None
        raise FileRefused(f"cannot be read ({_strerror(exc)})") from None


def _lstat(path: Path) -> os.stat_result | None:
    """The path's own status (a symlink's, not its target's); None when nothing is there; FileRefused."""
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise FileRefused(f"cannot check ({_strerror(exc)})") from None


def check_output(path: Path, what: str = "output file") -> None:
    """An output path must be a regular file (replaced) or not exist yet, in an existing or creatable folder;
    never a symlink, device, FIFO, socket or directory."""
    st = _lstat(path)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise FileRefused(f"{kind(st.st_mode)}; knobfleet never replaces one: name a regular file or a new path")
    parent = _existing_parent(path)
    try:
        pst = os.stat(parent)
    except OSError as exc:
        raise FileRefused(f"cannot check its folder {parent} ({_strerror(exc)})") from None
    if not stat.S_ISDIR(pst.st_mode):
        raise FileRefused(f"its folder {parent} {kind(pst.st_mode)}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise FileRefused(f"its folder {parent} is not writable")


def check_output_dir(path: Path, what: str = "output folder") -> None:
    """An output folder must be a real directory (not a symlink) or not exist yet under a writable folder."""
    st = _lstat(path)
    if st is not None:
        if not stat.S_ISDIR(st.st_mode):
            raise FileRefused(f"{kind(st.st_mode)}; an {what} must be a folder (knobfleet makes it when missing)")
        if not os.access(path, os.W_OK | os.X_OK):
            raise FileRefused(f"is not writable; an {what} must be")
        return
    parent = _existing_parent(path)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        raise FileRefused(f"cannot be made: {parent} is not a writable folder")


def _existing_parent(path: Path) -> Path:
    parent = path.absolute().parent
    while not os.path.lexists(parent) and parent != parent.parent:
        parent = parent.parent
    return parent


def write_bytes(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write ``data`` atomically: a temp file in the same folder, renamed over ``path``, which must be a regular
    file or absent (checked again just before the rename). ``mode``: the new file's mode; None keeps an existing
    file's mode (0644 for a new one). A refusal or an OS error is one KnobfleetError line naming the path; nothing
    is left behind."""
    from knobfleet.errors import KnobfleetError
    from knobfleet.rules import shown

    tmp = None
    try:
        check_output(path)
        if mode is None:
            try:
                st = os.lstat(path)
                mode = stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else 0o644
            except OSError:
                mode = 0o644
        path.parent.mkdir(parents=True, exist_ok=True)
        import tempfile  # imported when a file is written: the read path never is

        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        check_output(path)
        os.replace(tmp, path)
        tmp = None
    except FileRefused as exc:
        raise KnobfleetError(f"{shown(str(path))}: {exc}; nothing was written") from None
    except OSError as exc:
        raise KnobfleetError(f"{shown(str(path))}: cannot write ({_strerror(exc)}); nothing was written") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def write_text(path: Path, text: str, mode: int | None = None) -> None:
    write_bytes(path, text.encode("utf-8"), mode)


def open_lock(path: Path, what: str = "lock file") -> int:
    """A read-write descriptor of the lock file at ``path`` (made owner-only when absent) to take ``fcntl.flock``
    on: never through a symlink, never a FIFO, device, socket or folder (FileRefused). A lock file is written in place
    (``rewrite``), not by temp file and rename as other outputs are: a rename would hand whoever comes next another
    file to lock than the one its holder locked."""
    st = _lstat(path)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise FileRefused(f"{kind(st.st_mode)}; a {what} must be a regular file: remove it")
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        raise FileRefused(f"cannot open ({_strerror(exc)})") from None
    try:
        st = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        raise FileRefused(f"cannot check ({_strerror(exc)})") from None
    if not stat.S_ISREG(st.st_mode):  # swapped in between the check and the open
        os.close(fd)
        raise FileRefused(f"{kind(st.st_mode)}; a {what} must be a regular file: remove it")
    return fd


def rewrite(fd: int, data: bytes) -> None:
    """Replace the whole content of the open regular file ``fd`` in place (a lock file's holder)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def write_cache(path: Path, text: str) -> bool:
    """Write a cache file as every file is written (``write_bytes``: atomic, through a random temp name, never
    through a symlink, a FIFO or a device planted at ``path``), owner-only, in an owner-only folder; False instead of
    an error: a cache that cannot be written only costs time."""
    from knobfleet.errors import KnobfleetError

    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_bytes(path, text.encode("utf-8"), 0o600)
    except (KnobfleetError, OSError):
        return False
    return True


def _size(n: int) -> str:
    return f"{n // MIB} MiB" if n >= MIB and n % MIB == 0 else f"{n // KIB} KiB"


def read_cache(path: Path, max_bytes: int = 64 * MIB) -> str | None:
    """A cache file's text, or None for a miss: absent, not a regular file (a FIFO or device planted there is never
    opened for a blocking read), larger than ``max_bytes`` or not UTF-8. A cache is read only through this."""
    try:
        return read_text(path, max_bytes, "cache file")
    except FileRefused:
        return None


def loads_json(text: str | bytes, what: str = "file") -> Any:
    """JSON as a file of the operator's may hold it, refused (FileRefused, one phrase) for anything json.loads would
    let through or crash on: NaN and infinities (``NaN``, ``Infinity``: not JSON, and a timing of NaN poisons every
    fit), a decode error (its line and column), a number too long to convert, nesting too deep for the parser."""
    import json

    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not a number JSON allows")

    try:
        return json.loads(text, parse_constant=constant)
    except json.JSONDecodeError as exc:
        raise FileRefused(
            f"not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); check the {what}"
        ) from None
    except RecursionError:
        raise FileRefused(f"nested too deep to be a {what}") from None
    except ValueError as exc:
        raise FileRefused(f"not a valid {what} ({str(exc).splitlines()[0][:120]})") from None

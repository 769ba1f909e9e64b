"""The generation store of one knobfleet-managed service on a host: ``generations/NNNN`` (the files and
``meta.json`` of each), the ``current`` link, the append-only ledger, the per-service lock and pruning.

Part of the host transaction (knob_txn runs begin, mark, release and verify; knob_commit stages and commits;
knob_restore restores; knob_guards refuses a host before anything changes), which
roles/knob_serve/library/knob_generation.py calls with its AnsibleModule. Every path is opened without following a
symlink (knob_fs). Standard library only: the roles' modules import this file as ``ansible.module_utils.knob_store``,
the controller's tests as ``knobfleet.module_utils.knob_store``. Functions that refuse take the module (``Module``
below: what they use of AnsibleModule) and call its ``fail_json``, which does not return.
"""

from __future__ import annotations

import datetime
import errno
import json
import os
import re
import secrets

from .knob_fs import (
    DIR_FLAGS,
    UnsafePath,
    append_line,
    entries,
    open_dir,
    private_dir,
    remove_tree_at,
    write_at,
)
from .knob_fs import read as fs_read
from .knob_fs import sha256 as fs_sha256
from .knob_fs import write as fs_write

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only
    from collections.abc import Callable
    from typing import Any, NoReturn, Protocol

    class Module(Protocol):
        """What the host transaction uses of Ansible's AnsibleModule (tests hand it a stand-in)."""

        check_mode: bool
        _diff: bool
        params: dict[str, Any]
        fail_json: Callable[..., NoReturn]  # an attribute: a composite call wraps it to add its steps
        exit_json: Callable[..., NoReturn]

        def warn(self, warning: str) -> None: ...

        def run_command(self, args: list[str]) -> tuple[int, str, str]: ...


SCRIPT_MODE = 0o755
UNIT_MODE = 0o644
GEN_NAME = re.compile(r"[0-9]{4,9}")  # generations/NNNN; anything else there is not a generation
PRUNABLE = ("good", "failed", "rolled-back", "interrupted")  # never unreadable, installing or adopted ones


def now() -> str:
    # datetime.UTC is Python 3.11's; a host may run 3.8
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")  # noqa: UP017


def sha256(path: str) -> str | None:
    """sha256 of the regular file at path (None when absent); a symlink anywhere in the path is refused."""
    got: str | None = fs_sha256(path)
    return got


def write_atomic(path: str, data: bytes, mode: int, gid: int = 0, uid: int = 0) -> None:
    """Write bytes to path atomically, owned ``uid``:``gid``, never following a symlink (module_utils
    knob_fs: random O_EXCL temp name, fchown/fchmod on the descriptor, rename relative to the directory)."""
    fs_write(path, data, mode, uid, gid, create_dirs=0o755)


def read(path: str) -> bytes:
    data: bytes = fs_read(path)
    return data


def read_json_object(path: str) -> dict[str, Any]:
    data = json.loads(read(path).decode("utf-8"))
    if not isinstance(data, dict):
        raise ValueError("%s is not a JSON object" % path)
    return data


def live_name(current: int | None) -> str:
    return "none" if current is None else "%04d" % current


class Store:
    def __init__(self, state_dir: str) -> None:
        self.dir = state_dir.rstrip("/")
        self.gens = os.path.join(state_dir, "generations")
        self.staging = os.path.join(state_dir, "staging")
        self.lock = os.path.join(state_dir, "lock")
        self.ledger = os.path.join(state_dir, "ledger.jsonl")
        self.current_link = os.path.join(state_dir, "current")

    def listing(self) -> list[tuple[str, bool]]:
        """(name, is a real directory) of every entry of generations/ (none when it is missing); read through a
        descriptor, never following a symlink."""
        try:
            fd = open_dir(self.gens)
        except FileNotFoundError:
            return []
        try:
            got: list[tuple[str, bool]] = entries(fd)
            return got
        finally:
            os.close(fd)

    def numbers(self) -> list[int]:
        """The generations: real directories named NNNN. A symlink, file, FIFO or odd name there is none."""
        return sorted(
            int(n) for n, is_dir in self.listing() if is_dir and GEN_NAME.fullmatch(n) and "%04d" % int(n) == n
        )

    def next_number(self) -> int:
        """One past every number in use by anything in generations/ (a stray file named 0007 included)."""
        taken = [int(m.group(0)) for m in (re.search(r"[0-9]{1,9}", n) for n, _ in self.listing()) if m]
        return max([*taken, 0]) + 1

    def gen_dir(self, number: int) -> str:
        return os.path.join(self.gens, "%04d" % number)

    def current(self) -> int | None:
        try:
            target = os.readlink(self.current_link)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.EINVAL:  # not a symlink: knobfleet never makes that
                raise UnsafePath(
                    exc.errno, "is not a symlink to generations/NNNN; remove it and apply again", self.current_link
                ) from None
            raise
        name = os.path.basename(target)
        if target != os.path.join("generations", name) or not GEN_NAME.fullmatch(name):
            raise UnsafePath(
                errno.EINVAL,
                "points at %r, not at generations/NNNN; remove it and apply again" % target[:80],
                self.current_link,
            )
        return int(name)

    def meta(self, number: int) -> dict[str, Any]:
        return read_json_object(os.path.join(self.gen_dir(number), "meta.json"))

    def ensure(self) -> None:
        """Create the state directory root-only (or tighten one an older knobfleet left 0755); refuse one that
        another user owns or can write to. Everything through descriptors opened without following links."""
        parent = os.path.dirname(self.dir)
        os.close(open_dir(parent, create_mode=0o755))
        fd = open_dir(self.dir, create_mode=0o700)
        try:
            st = os.fstat(fd)
            if st.st_uid == 0 and st.st_mode & 0o077:
                os.fchmod(fd, 0o700)
        finally:
            os.close(fd)
        os.close(private_dir(self.dir))
        for d in (self.gens, self.staging):
            os.close(private_dir(d))

    def write_meta(self, number: int, meta: dict[str, Any]) -> None:
        write_atomic(os.path.join(self.gen_dir(number), "meta.json"), meta_bytes(meta), 0o644)

    def switch_current(self, number: int, keep_previous: bool = False) -> None:
        """Point ``current`` at generation ``number`` atomically. ``keep_previous``: first keep the old link
        under a hard link ``current.prev``, so ``unswitch`` needs no new inode (a full disk cannot stop it)."""
        tmp = "%s.%d.tmp" % (self.current_link, os.getpid())
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(os.path.join("generations", "%04d" % number), tmp)
        try:
            if keep_previous:
                self.drop_previous()
                try:
                    os.link(self.current_link, self.current_link + ".prev", follow_symlinks=False)
                except FileNotFoundError:
                    pass
            os.rename(tmp, self.current_link)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def drop_previous(self) -> None:
        try:
            os.unlink(self.current_link + ".prev")
        except FileNotFoundError:
            pass

    def append_ledger(self, entry: dict[str, Any]) -> None:
        """One JSON line, appended without blocking (a FIFO there is refused) and on a fresh line."""
        append_line(self.ledger, (json.dumps(entry, sort_keys=True) + "\n").encode())

    def unswitch(self, number: int, back_to: int | None) -> None:
        """Undo switch_current(number, keep_previous=True): ``current`` points at ``back_to`` again (or is
        removed when there was none), by renaming the kept link back."""
        try:
            moved = self.current() == number
        except (OSError, ValueError):
            moved = False
        prev = self.current_link + ".prev"
        if not moved:
            self.drop_previous()
        elif os.path.lexists(prev):
            os.rename(prev, self.current_link)
        elif back_to is None:
            os.unlink(self.current_link)
        else:
            self.switch_current(back_to)


def meta_bytes(meta: dict[str, Any]) -> bytes:
    return (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode()


def store_generation(store: Store, number: int, files: list[tuple[str, bytes, int]], meta: dict[str, Any]) -> None:
    """Write generations/NNNN atomically, meta.json included: fill a temp dir, then rename it into place. On any
    failure (a full disk at any byte) the temp dir is removed again and nothing is left behind."""
    name = "%04d" % number
    tmp = ".%s.tmp" % name
    gfd = open_dir(store.gens)
    try:
        try:
            remove_tree_at(gfd, tmp)
        except FileNotFoundError:
            pass
        os.mkdir(tmp, 0o700, dir_fd=gfd)
        try:
            tfd = os.open(tmp, DIR_FLAGS, dir_fd=gfd)
            try:
                for fname, data, mode in files:
                    write_at(tfd, fname, data, mode)
                write_at(tfd, "meta.json", meta_bytes(meta), 0o644)
            finally:
                os.close(tfd)
            os.rename(tmp, name, src_dir_fd=gfd, dst_dir_fd=gfd)
        except BaseException:
            try:
                remove_tree_at(gfd, tmp)
            except OSError:
                pass
            raise
    finally:
        os.close(gfd)


def remove_generation(store: Store, number: int) -> None:
    """Remove generations/NNNN, never following a symlink nor leaving generations/ (knob_fs.remove_tree_at)."""
    gfd = open_dir(store.gens)
    try:
        remove_tree_at(gfd, "%04d" % number)
    finally:
        os.close(gfd)


# --- the lock ------------------------------------------------------------------------------------------------


def lock_holder(store: Store) -> dict[str, Any] | None:
    try:
        return read_json_object(store.lock)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return {"run_id": "?", "operator": "?", "since": "?", "controller": "?", "corrupt": str(exc)}


def lock_refusal(store: Store, holder: dict[str, Any]) -> dict[str, Any]:
    """The fields of a refusal for another run's lock (the failure's ``lock``, with ``lock_held: true``): what the
    lock file records (``run_id``, ``operator``, ``since``, ``controller``; ``corrupt`` when it cannot be read), where
    it is (``path``), and the holder's ``holder_host`` and ``holder_pid``, read from ``controller`` (``host:pid``,
    as the controller writes it; None where it is not). The controller reads these, never the message's text."""
    host, colon, pid = str(holder.get("controller") or "").rpartition(":")
    fields = dict(holder)
    fields.update(
        path=store.lock,
        holder_host=host if colon and host else None,
        holder_pid=int(pid) if colon and pid.isdigit() else None,
    )
    return fields


def break_lock(store: Store, p: dict[str, Any]) -> bool:
    """Break a held lock atomically: rename it aside (only one breaker's rename can succeed; a second one
    finds nothing and must then win the O_EXCL create like anyone else)."""
    aside = "%s.broken-%s" % (store.lock, secrets.token_hex(8))  # never a name built from input
    try:
        os.rename(store.lock, aside)
    except FileNotFoundError:
        return False
    try:
        os.unlink(aside)
    except IsADirectoryError:  # whatever sat there, it is out of the lock's way now
        try:
            os.rmdir(aside)
        except OSError:
            pass
    return True


def take_lock(module: Module, store: Store, p: dict[str, Any]) -> None:
    entry = json.dumps(
        {"run_id": p["run_id"], "operator": p["operator"], "since": now(), "controller": p["controller"]}
    ).encode()
    try:
        fd = os.open(store.lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        other = lock_holder(store) or {}
        module.fail_json(
            msg="locked by %s (run %s) since %s from %s"
            % (other.get("operator"), other.get("run_id"), other.get("since"), other.get("controller")),
            lock=lock_refusal(store, other),
            lock_held=True,
        )
    try:
        try:
            view = memoryview(entry)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
    except BaseException:
        os.unlink(store.lock)  # a half-written lock would hold the host with nobody to release it
        raise


def release(module: Module, store: Store, p: dict[str, Any]) -> dict[str, Any]:
    holder = lock_holder(store)
    if module.check_mode or not holder or holder.get("run_id") != p["run_id"]:
        return {"changed": False}
    os.unlink(store.lock)
    return {"changed": False, "released": True}


# --- statuses and pruning ------------------------------------------------------------------------------------


def statuses(store: Store) -> dict[int, Any]:
    out: dict[int, Any] = {}
    for n in store.numbers():
        try:
            out[n] = store.meta(n).get("status")
        except (OSError, ValueError):
            out[n] = None
    return out


def previous_good(store: Store, before: int) -> int | None:
    """Newest generation older than ``before`` that was good (or adopted)."""
    st = statuses(store)
    for n in sorted(st, reverse=True):
        if n < before and st[n] in ("good", "adopted"):
            return n
    return None


def prune(store: Store, keep: int) -> list[int]:
    """Keep the last ``keep`` good generations, generation 0, current and the previous good one; failed,
    rolled-back and interrupted generations older than the oldest kept good one go too. Never the only way
    back, and never what it cannot read: a generation whose meta.json is unreadable (a FIFO, bad JSON, not an
    object), still installing, or a symlink in generations/ stays. Removal never follows a link or leaves
    generations/ (knob_fs.remove_tree_at); one that fails is left and reported, not fatal."""
    if not keep or keep < 1:
        return []
    st = statuses(store)
    current = store.current()
    good = [n for n in sorted(st) if st[n] == "good"]
    protect = {0, current, previous_good(store, current if current is not None else 1 << 30)}
    protect.update(good[-keep:])
    oldest_kept = min(list(good[-keep:]) or [0])
    removed = []
    for n in sorted(st):
        if n in protect or n >= oldest_kept or st[n] not in PRUNABLE:
            continue
        try:
            remove_generation(store, n)
        except OSError:
            continue
        removed.append(n)
    if removed:
        store.append_ledger({"time": now(), "event": "prune", "generations": removed, "keep": keep})
    return removed

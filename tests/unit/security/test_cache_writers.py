"""Issue 40, cause 1, the caches left over: every cache the controller keeps is written through
``safefile.write_cache`` (atomic, a random temp name, never through a symlink, a FIFO or a device planted at its
path) and read through a bounded reader that takes a hostile node, or JSON nested past the parser, as a miss. The
inventory cache, the read path's view, the probe cache's index, the ssh plan and the head start's record each wrote
a guessable ``.NAME.PID`` temp file with ``Path.write_text`` (following a symlink, blocking on a FIFO), and the head
start opened its record with a blocking ``open``. Hostile nodes are made in the test's temp dir only; a SIGALRM
guards against a hang (a detector, never a timing)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from knobfleet import headstart, safefile


@pytest.fixture(autouse=True)
def no_hang() -> Iterator[None]:
    def boom(_sig: int, _frame: object) -> None:
        raise TimeoutError("blocked on a hostile node")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def plant(kind: str, at: Path, outside: Path) -> None:
    if kind == "fifo":
        os.mkfifo(at)
    elif kind == "symlink":
        at.symlink_to(outside)
    elif kind == "dangling":
        at.symlink_to(outside.with_name("nowhere"))
    elif kind == "folder":
        at.mkdir()
    elif kind == "loop":
        at.symlink_to(at)


KINDS = ["fifo", "symlink", "dangling", "folder", "loop"]


def snapshot(root: Path) -> dict[str, tuple[int, bytes]]:
    out = {}
    for p in sorted(root.rglob("*")):
        st = os.lstat(p)
        body = p.read_bytes() if p.is_file() and not p.is_symlink() else b""
        out[str(p.relative_to(root))] = (st.st_mode, body)
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_write_cache_replaces_or_declines_and_never_writes_through(tmp_path: Path, kind: str) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("not the cache's")
    cache = tmp_path / "cache" / "entry.json"
    cache.parent.mkdir()
    plant(kind, cache, outside)
    before = os.lstat(cache)
    assert safefile.write_cache(cache, '{"a": 1}') is False  # declined: only costs time, never an error
    assert outside.read_text() == "not the cache's"  # never written through a link
    after = os.lstat(cache)  # the node is left as it was, not opened (a FIFO would have blocked)
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)
    assert [p.name for p in cache.parent.iterdir() if p.name.startswith(".")] == []  # no temp file left
    cache.parent.joinpath("fresh.json").unlink(missing_ok=True)
    assert safefile.write_cache(cache.parent / "fresh.json", "{}") is True
    assert (cache.parent / "fresh.json").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("kind", KINDS)
def test_the_head_start_never_waits_on_its_record_nor_writes_through_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    argv = ["drift", "--json"]
    key = headstart.recall_key(argv, os.getcwd(), os.environ)
    assert key is not None
    folder = Path(headstart.folder())
    folder.mkdir(parents=True)
    outside = tmp_path / "outside.txt"
    outside.write_text("not the record's")
    plant(kind, folder / f"recall-{key}", outside)
    try:
        assert headstart.start(argv) == 0  # a miss: nothing started, nothing waited on
        headstart.remember("plan", [("h", ["/bin/true"], True)], b"full", b"short")
    finally:
        headstart.stop()
        headstart.INVOCATION[0] = headstart.KEY[0] = None
    assert outside.read_text() == "not the record's"
    assert [p.name for p in folder.iterdir() if ".tmp" in p.name or p.name.count(".") > 1] == []


@pytest.mark.parametrize(
    "write",
    [
        pytest.param(lambda: _inventory_cache(), id="inventory"),
        pytest.param(lambda: _read_view(), id="read-view"),
        pytest.param(lambda: _probe_index(), id="probe-index"),
        pytest.param(lambda: _ssh_plan(), id="ssh-plan"),
    ],
)
def test_each_cache_writer_goes_through_write_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write: Callable[[], tuple[Path, Callable[[], object]]]
) -> None:
    """A FIFO planted at each cache's own path: its writer neither blocks on it nor replaces it with anything but
    nothing (the cache only costs time from then on), and leaves no temp file."""
    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))
    path, run = write()
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    run()  # would block on the FIFO with a plain write_text
    assert path.is_fifo()
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("depth", [100_000])
def test_a_cache_nested_past_the_parser_is_a_miss(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, depth: int) -> None:
    from knobfleet.fleet import inventory, readhost

    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))
    deep = "[" * depth + "]" * depth
    for path in (inventory._cache_dir() / "k.json", readhost._cache_file("k")):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(deep)
    assert inventory._read_cache("k") is None
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts: {}\n")
    monkeypatch.setattr(readhost, "key", lambda *_a: "k")
    assert readhost.load(inv, None) is None


def _inventory_cache() -> tuple[Path, Callable[[], object]]:
    from knobfleet.fleet import inventory

    return inventory._cache_dir() / "k.json", lambda: inventory._write_cache("k", [])


def _read_view() -> tuple[Path, Callable[[], object]]:
    from knobfleet.fleet import readhost

    plan = readhost.ReadPlan([], {}, "sglang")
    return readhost._cache_file("k"), lambda: readhost._save("k", plan)


def _probe_index() -> tuple[Path, Callable[[], object]]:
    from knobfleet import paths
    from knobfleet.fleet.transports.probecache import Known

    known = Known(paths.state_dir() / "probe-known")
    return known._path("k", "b" * 64), lambda: known.put("k", "b" * 64, "c" * 64)


def _ssh_plan() -> tuple[Path, Callable[[], object]]:
    from knobfleet import paths
    from knobfleet.fleet.transports import ssh

    path = ssh._plan_file("k", b"source", paths.control_dir())
    return path, lambda: ssh._save_plan(path, {"h": (["/bin/true"], True)})

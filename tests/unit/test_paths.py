"""Where knobfleet finds a project (``paths``): ``KNOBFLEET_HOME``, a ``knobfleet.toml`` on the way up and a
project's catalog overlay folder. Something other than what is expected there (nothing, a FIFO, a file, a device, a
dangling symlink, a symlink loop, a folder this user cannot read) is one line naming the path, what is there and the
fix, with its exit code, and nothing changes: never an empty project, never a skipped file (issue 56, cause 12).

Every node is made in the test's own temp folder; the unreadable folder is read by a forked child that drops to
uid 65534 when the tests run as root (root reads any folder)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from knobfleet import cli, paths
from knobfleet.errors import EXIT_ERROR, EXIT_OK, EXIT_USAGE

# What each node kind is called in the refusal.
PHRASE = {
    "fifo": "is a FIFO (named pipe)",
    "device": "is a character device",
    "dangling": "is a symlink to nothing (a dangling link: its target does not exist)",
    "loop": "is a symlink loop",
    "folder": "is a directory",
    "file": "is a regular file",
    "absent": "does not exist",
}


def plant(path: Path, kind: str) -> None:
    """Make a node of ``kind`` at ``path`` (its target, if any, next to it)."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero's numbers, our own node
    elif kind == "dangling":
        os.symlink(path.parent / "gone" / "target", path)
    elif kind == "loop":
        os.symlink(path.parent / f"{path.name}.other", path)
        os.symlink(path, path.parent / f"{path.name}.other")
    elif kind == "folder":
        path.mkdir()
        (path / "inside").write_text("kept\n")
    elif kind == "file":
        path.write_text("a file\n")
    else:
        assert kind == "absent"


def tree(root: Path) -> dict[str, tuple[int, int, object]]:
    """Every entry under ``root`` as lstat sees it: kind, mode, a link's target or a file's inode, size, mtime."""
    out: dict[str, tuple[int, int, object]] = {}
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            p = os.path.join(folder, name)
            st = os.lstat(p)
            extra: object = st.st_rdev
            if stat.S_ISLNK(st.st_mode):
                extra = os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                extra = (st.st_ino, st.st_size, st.st_mtime_ns)
            out[p] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), extra)
    return out


@contextlib.contextmanager
def no_hang(seconds: int = 10) -> Iterator[None]:
    def alarm(_signum: int, _frame: object) -> None:
        raise AssertionError(f"blocked for {seconds}s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def refused(capsys: pytest.CaptureFixture[str], argv: list[str], code: int) -> str:
    """Run ``argv``: it must end in ``code`` with one line on stderr and nothing on stdout; the line."""
    capsys.readouterr()
    with no_hang():
        rc = cli.run(argv)
    out, err = capsys.readouterr()
    assert rc == code and out == "", (rc, out, err)
    assert err.count("\n") == 1 and "Traceback" not in err and "internal error" not in err, err
    return err.strip()


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))  # never this machine's own state folder
    monkeypatch.delenv("KNOBFLEET_HOME", raising=False)
    monkeypatch.delenv("KNOBFLEET_EXAMPLES", raising=False)
    (tmp_path / "work").mkdir()
    return tmp_path / "work"


@pytest.mark.parametrize("kind", ["absent", "fifo", "device", "file", "dangling", "loop"])
def test_a_knobfleet_home_that_is_not_a_folder_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, work: Path, kind: str
) -> None:
    home = work / "home"
    plant(home, kind)
    monkeypatch.setenv("KNOBFLEET_HOME", str(home))
    monkeypatch.chdir(work)
    before = tree(work)
    line = refused(capsys, ["profiles", "list"], EXIT_USAGE)
    assert line == (
        f"KNOBFLEET_HOME={home}: {PHRASE[kind]}; point KNOBFLEET_HOME at a readable folder laid out like the "
        "knobfleet repository (profiles/, inventories/), or unset it"
    )
    assert tree(work) == before


def _as_unprivileged(home: str, cwd: Path, argv: list[str] | None) -> dict[str, object]:
    """In a forked child (uid 65534 when this runs as root): with KNOBFLEET_HOME=``home``, ``cli.run(argv)``'s exit
    code and output, or (``argv`` None) whether the home is found."""
    cli.run(["profiles", "list"])  # as this user first: every module the refusal needs is imported before the drop
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        result: dict[str, object] = {}
        try:
            os.chdir(cwd)  # the home is named relative to it: uid 65534 cannot search the test's 0700 temp folders
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            os.environ["KNOBFLEET_HOME"] = home
            paths._discover.cache_clear()
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                if argv is None:
                    result["root"] = str(paths.project_root())
                else:
                    result["rc"] = cli.run(argv)
            result["err"] = err.getvalue()
        except BaseException as exc:  # reported to the parent, which fails the test with it
            result["crash"] = repr(exc)
        os.write(write, json.dumps(result).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        data = fh.read()
    os.waitpid(pid, 0)
    return dict(json.loads(data))


def test_an_unreadable_knobfleet_home_is_refused_not_read_as_an_empty_project(
    monkeypatch: pytest.MonkeyPatch, work: Path
) -> None:
    pub = work / "pub"
    pub.mkdir(mode=0o755)
    os.chmod(pub, 0o755)
    home = pub / "home"
    (home / "profiles").mkdir(parents=True)
    (home / "profiles" / "mine.yaml").write_text("name: mine\n")
    os.chmod(home, 0o755)
    monkeypatch.setenv("KNOBFLEET_HOME", str(work / "placeholder"))
    plant(work / "placeholder", "fifo")  # warms the refusal's imports in this process (see _as_unprivileged)
    readable = _as_unprivileged("home", pub, None)
    assert "crash" not in readable and readable["root"].endswith("/pub/home"), readable  # type: ignore[union-attr]
    os.chmod(home, 0)
    try:
        got = _as_unprivileged("home", pub, ["profiles", "list"])
    finally:
        os.chmod(home, 0o755)
    assert "crash" not in got, got
    assert got["rc"] == EXIT_USAGE, got
    assert got["err"] == (
        "KNOBFLEET_HOME=home: cannot be read (Permission denied): this user cannot read it; point KNOBFLEET_HOME at "
        "a readable folder laid out like the knobfleet repository (profiles/, inventories/), or unset it\n"
    )


@pytest.mark.parametrize("kind", ["fifo", "device", "folder", "dangling", "loop"])
def test_a_knobfleet_toml_that_is_not_a_file_is_refused_not_skipped_for_the_project_above(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, work: Path, kind: str
) -> None:
    """Skipped, the search went on up: here to the outer project, whose profiles the command then used."""
    capsys.readouterr()
    assert cli.run(["init", str(work / "outer")]) == EXIT_OK
    inner = work / "outer" / "inner"
    inner.mkdir()
    plant(inner / "knobfleet.toml", kind)
    monkeypatch.chdir(inner)
    before = tree(work)
    line = refused(capsys, ["profiles", "list"], EXIT_USAGE)
    assert line == (
        f"{inner / 'knobfleet.toml'}: {PHRASE[kind]}, not a project file; replace it with a regular TOML file "
        "(`knobfleet init --help`)"
    )
    assert tree(work) == before


@pytest.mark.parametrize("kind", ["fifo", "device", "file", "dangling", "loop"])
def test_a_catalog_overlay_folder_that_is_not_a_folder_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, work: Path, kind: str
) -> None:
    from knobfleet.profiles import catalog

    capsys.readouterr()
    assert cli.run(["init", str(work / "proj")]) == EXIT_OK
    (work / "proj" / "catalogs" / "README.md").unlink()
    (work / "proj" / "catalogs").rmdir()
    plant(work / "proj" / "catalogs", kind)
    monkeypatch.chdir(work / "proj")
    catalog.catalog_for.cache_clear()  # type: ignore[attr-defined]
    catalog.default_engine.cache_clear()
    before = tree(work)
    line = refused(capsys, ["profiles", "validate"], EXIT_ERROR)
    assert line == (
        f"catalogs: {PHRASE[kind]}, not a catalog overlay folder; point `catalogs` in knobfleet.toml at a folder of "
        "<engine>.overlay.yaml files (or remove what is there)"
    )
    assert tree(work) == before


def test_a_project_without_a_catalogs_folder_has_no_overlays(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli.run(["init", str(work / "proj")]) == EXIT_OK
    (work / "proj" / "catalogs" / "README.md").unlink()
    (work / "proj" / "catalogs").rmdir()
    monkeypatch.chdir(work / "proj")
    assert paths.catalog_overlay_dirs() == []

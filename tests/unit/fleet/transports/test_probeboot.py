"""The host's half of the probe cache: an entry runs only when it is exactly what the controller named, in a
directory only this user controls; anything planted there is refused, never followed, never run.

Everything happens under a temp state root (the cache directory is an argument); the unprivileged planter is
``nobody`` in a child process (``subprocess``'s ``user=``), in a temp folder of its own."""

from __future__ import annotations

import hashlib
import io
import json
import marshal
import os
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from knobfleet.fleet.transports import probeboot as pb

MODULE = "def f(a):\n    return {'got': a, 'twice': twice(a['x'])}\nfrom ansible.module_utils.u import twice\n"
BODY: dict[str, Any] = {"utils": [["u", "def twice(x):\n    return 2 * x\n"]], "module": MODULE, "args": {"k": "s"}}
NOBODY = 65534


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The bootstrap's log lines (never this machine's syslog)."""
    lines: list[str] = []
    monkeypatch.setattr(pb, "log", lines.append)
    return lines


@pytest.fixture
def state(tmp_path: Path) -> Path:
    root = tmp_path / "state"
    root.mkdir(mode=0o700)
    return root


def call(monkeypatch: pytest.MonkeyPatch, root: Path, digest: str, body: dict[str, Any] | None) -> tuple[int, str, str]:
    stdin = io.TextIOWrapper(io.BytesIO(json.dumps(body).encode() if body is not None else b""))
    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = stdin, out, err
    try:
        rc = pb.main([str(root / ".probe"), digest, "m", "f", json.dumps({"x": 21})])
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
    return rc, out.getvalue(), err.getvalue()


def stored(monkeypatch: pytest.MonkeyPatch, state: Path) -> str:
    rc, out, err = call(monkeypatch, state, "-", BODY)
    assert rc == 0 and json.loads(out) == {"got": {"x": 21, "k": "s"}, "twice": 42}
    assert err.startswith(pb.MARK + " stored ")
    return err.split()[2]


def test_the_first_call_stores_a_root_only_entry_named_by_its_hash_and_the_next_one_runs_it(
    monkeypatch: pytest.MonkeyPatch, state: Path, logged: list[str]
) -> None:
    digest = stored(monkeypatch, state)
    entry = state / ".probe" / digest
    assert stat.S_IMODE((state / ".probe").stat().st_mode) == 0o700
    assert stat.S_IMODE(entry.stat().st_mode) == 0o400
    assert hashlib.sha256(entry.read_bytes()).hexdigest() == digest
    rc, out, err = call(monkeypatch, state, digest, {"args": {"k": "s"}})  # no bundle: the cached code runs
    assert (rc, json.loads(out), err) == (0, {"got": {"x": 21, "k": "s"}, "twice": 42}, f"{pb.MARK} hit {digest}\n")
    assert logged == []


def test_a_missing_entry_without_the_bundle_is_a_miss_that_asks_for_it(
    monkeypatch: pytest.MonkeyPatch, state: Path
) -> None:
    rc, out, err = call(monkeypatch, state, "a" * 64, {"args": {}})
    assert (rc, out) == (pb.EXIT_MISS, "")
    assert err == f"{pb.MARK} miss no cache directory\n"


def evil_blob(marker: Path) -> bytes:
    """An entry that would write ``marker`` if it ever ran."""
    code = compile(f"open({str(marker)!r}, 'w').write('ran')\ndef f(a):\n    return 'evil'\n", "m", "exec")
    return pb.header() + marshal.dumps(([], code))


def test_a_tampered_entry_is_never_run_it_is_removed_logged_and_replaced(
    monkeypatch: pytest.MonkeyPatch, state: Path, logged: list[str], tmp_path: Path
) -> None:
    digest = stored(monkeypatch, state)
    entry = state / ".probe" / digest
    entry.chmod(0o600)
    entry.write_bytes(evil_blob(tmp_path / "ran"))  # same name, other bytes
    entry.chmod(0o400)
    rc, _out, err = call(monkeypatch, state, digest, {"args": {}})
    assert rc == pb.EXIT_MISS and "miss tampered: " in err and "its content hashes to" in err
    assert not (tmp_path / "ran").exists() and not entry.exists()
    assert len(logged) == 1 and "refused and removed, never run" in logged[0]
    entry.write_bytes(evil_blob(tmp_path / "ran"))
    entry.chmod(0o400)
    rc, out, err = call(monkeypatch, state, digest, BODY)  # with the bundle: replaced in the same call
    assert rc == 0 and json.loads(out)["twice"] == 42 and err.startswith(f"{pb.MARK} replaced {digest} entry ")
    assert hashlib.sha256(entry.read_bytes()).hexdigest() == digest and not (tmp_path / "ran").exists()


@pytest.mark.parametrize("kind", ["symlink", "fifo", "hardlink", "group-readable", "directory"])
def test_what_is_planted_at_an_entry_is_refused_and_never_followed(
    monkeypatch: pytest.MonkeyPatch, state: Path, logged: list[str], tmp_path: Path, kind: str
) -> None:
    digest = stored(monkeypatch, state)
    entry = state / ".probe" / digest
    good = entry.read_bytes()
    outside = tmp_path / "outside"
    outside.write_bytes(good)  # the right bytes, elsewhere
    outside.chmod(0o400)
    entry.unlink()
    if kind == "symlink":
        entry.symlink_to(outside)
    elif kind == "fifo":
        os.mkfifo(entry, 0o600)
    elif kind == "hardlink":
        os.link(outside, entry)
    elif kind == "group-readable":
        entry.write_bytes(good)
        entry.chmod(0o440)
    else:
        entry.mkdir(mode=0o700)
    rc, out, err = call(monkeypatch, state, digest, {"args": {}})  # returns at once: a FIFO is never waited on
    assert (rc, out) == (pb.EXIT_MISS, "") and "miss tampered: " in err
    assert outside.read_bytes() == good  # the target of a link is never touched
    assert logged and "never run" in logged[0]


def test_a_symlinked_cache_directory_is_never_followed(
    monkeypatch: pytest.MonkeyPatch, state: Path, logged: list[str], tmp_path: Path
) -> None:
    digest = stored(monkeypatch, state)
    real = tmp_path / "elsewhere"
    (state / ".probe").rename(real)
    (state / ".probe").symlink_to(real)
    rc, _out, err = call(monkeypatch, state, digest, {"args": {}})
    assert rc == pb.EXIT_MISS and "symlink" in err
    rc, out, err = call(monkeypatch, state, digest, BODY)  # the bundle runs, nothing is written through the link
    assert rc == 0 and json.loads(out)["twice"] == 42 and err.startswith(f"{pb.MARK} nocache ")
    assert os.listdir(real) == [digest]


def test_an_entry_from_another_python_is_a_plain_miss(monkeypatch: pytest.MonkeyPatch, state: Path) -> None:
    digest = stored(monkeypatch, state)
    monkeypatch.setattr(sys, "hexversion", sys.hexversion + 1)
    with pytest.raises(pb.Refused, match="another python") as got:
        pb.load(str(state / ".probe"), digest)
    assert not got.value.tampered


def test_only_the_newest_entries_are_kept(state: Path) -> None:
    root = str(state / ".probe")
    digests = [pb.store(root, ([], compile(f"x = {i}\n", "m", "exec"))) for i in range(pb.KEEP + 3)]
    left = set(os.listdir(root))
    assert len(left) == pb.KEEP and digests[-1] in left


# --- an unprivileged user plants things (nobody, in a child) ----------------------------------------------------------


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A temp folder nobody can reach (0755, root's), removed afterwards."""
    where = Path(tempfile.mkdtemp(prefix="kf-probeboot-"))
    where.chmod(0o755)
    try:
        yield where
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(where)], check=False)


def as_nobody(code: str) -> None:
    subprocess.run(["/usr/bin/python3", "-I", "-c", code], user=NOBODY, group=NOBODY, check=True, timeout=30)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as nobody")
def test_an_entry_planted_by_another_user_is_neither_run_nor_followed(
    monkeypatch: pytest.MonkeyPatch, open_tmp: Path, logged: list[str]
) -> None:
    state = open_tmp / "state"
    state.mkdir(mode=0o755)
    os.chown(state, NOBODY, NOBODY)  # a misconfigured state root: another user owns it
    marker = open_tmp / "ran"
    blob = evil_blob(marker)
    digest = hashlib.sha256(blob).hexdigest()
    as_nobody(
        "import os\n"
        f"os.mkdir({str(state / '.probe')!r}, 0o700)\n"
        f"fd = os.open({str(state / '.probe' / digest)!r}, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)\n"
        f"os.write(fd, {blob!r})\n"
    )
    rc, out, err = call(monkeypatch, state, digest, {"args": {}})  # even asked for exactly that digest
    assert (rc, out) == (pb.EXIT_MISS, "") and "owned by uid 65534" in err
    rc, out, err = call(monkeypatch, state, digest, BODY)  # the bundle runs; nothing is stored there
    assert rc == 0 and json.loads(out)["twice"] == 42 and err.startswith(f"{pb.MARK} nocache ")
    assert not marker.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as nobody")
def test_a_cache_directory_symlink_planted_by_another_user_is_never_followed(
    monkeypatch: pytest.MonkeyPatch, open_tmp: Path, logged: list[str]
) -> None:
    state = open_tmp / "state"
    state.mkdir(mode=0o755)
    os.chown(state, NOBODY, NOBODY)
    target = open_tmp / "root-only"
    target.mkdir(mode=0o700)
    as_nobody(f"import os\nos.symlink({str(target)!r}, {str(state / '.probe')!r})\n")
    rc, out, err = call(monkeypatch, state, "-", BODY)
    assert rc == 0 and json.loads(out)["twice"] == 42 and err.startswith(f"{pb.MARK} nocache ")
    assert os.listdir(target) == [] and (state / ".probe").is_symlink()


# --- session mode (drift --watch): one interpreter, one line per call ------------------------------------------------


def boot_process(state: Path, digest: str, idle_s: float) -> subprocess.Popen[bytes]:
    """The bootstrap as a host runs it (probecache.command's program text), in session mode."""
    from knobfleet.fleet.transports import probecache

    argv = [sys.executable, "-I", "-S", "-c", probecache.boot_text(), str(state / ".probe"), digest, "m", "f"]
    argv += [json.dumps({"x": 21}), "serve", str(idle_s)]
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_a_session_answers_each_line_with_the_one_shot_document_and_ends_at_end_of_input(
    monkeypatch: pytest.MonkeyPatch, state: Path
) -> None:
    digest = stored(monkeypatch, state)
    proc = boot_process(state, digest, 30)
    assert proc.stdin is not None and proc.stdout is not None
    # the first line and the first call arrive in one write: nothing of the second may be lost
    proc.stdin.write(json.dumps({"args": {"k": "s"}}).encode() + b"\n{}\n")
    proc.stdin.flush()
    first = json.loads(proc.stdout.readline())
    proc.stdin.write(b'{"x": 5}\n')
    proc.stdin.flush()
    second = json.loads(proc.stdout.readline())
    out, err = proc.communicate(b"", timeout=30)  # end of input: the session ends
    assert first == {"got": {"x": 21, "k": "s"}, "twice": 42}  # what the one-shot call printed
    assert second == {"got": {"x": 5, "k": "s"}, "twice": 10}
    assert (proc.returncode, out, err.decode()) == (0, b"", f"{pb.MARK} hit {digest}\n")


def test_an_idle_session_ends_by_itself(monkeypatch: pytest.MonkeyPatch, state: Path) -> None:
    digest = stored(monkeypatch, state)
    proc = boot_process(state, digest, 0.5)
    assert proc.stdin is not None
    proc.stdin.write(json.dumps({"args": {"k": "s"}}).encode() + b"\n")
    proc.stdin.flush()
    assert proc.wait(timeout=30) == 0  # the pipe is still open: it left on its own


def test_a_session_on_a_missing_entry_is_a_miss_before_any_answer(state: Path) -> None:
    proc = boot_process(state, "0" * 64, 30)
    out, err = proc.communicate(json.dumps({"args": {}}).encode() + b"\n{}\n", timeout=30)
    assert (proc.returncode, out) == (pb.EXIT_MISS, b"") and b"miss" in err

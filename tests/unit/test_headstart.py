"""knobfleet.headstart: the entry starts, before any heavy import, the ssh probes the same command line started
last time; the transport takes them only for its own plan key. Real processes (``/bin/sh``, not ssh) in the test's
own state folder; the record's key depends on everything that changes what a command line reads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from knobfleet import headstart

ENV = {"HOME": "/root"}


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("KNOBFLEET_HEADSTART", raising=False)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    headstart.stop()
    headstart.INVOCATION[0] = headstart.KEY[0] = None


@pytest.mark.parametrize(
    "argv",
    [[], ["apply", "ctas512"], ["drift", "--help"], ["verify", "-h"], ["drift", "--watch", "5"],
     ["drift", "--watch=5"], ["drift", "--via", "ansible"], ["drift", "--via=ansible"]],
)  # fmt: skip
def test_only_one_shot_reads_over_ssh_start_early(argv: list[str]) -> None:
    assert headstart.recall_key(argv, "/x", ENV) is None


def test_the_key_follows_the_folder_the_arguments_and_the_environment() -> None:
    base = headstart.recall_key(["drift", "--json"], "/x", ENV)
    assert base and base == headstart.recall_key(["drift", "--json"], "/x", dict(ENV))
    others = {
        headstart.recall_key(["drift", "--json"], "/y", ENV),
        headstart.recall_key(["drift", "--json-lines"], "/x", ENV),
        headstart.recall_key(["verify", "--json"], "/x", ENV),
        headstart.recall_key(["drift", "--json"], "/x", {**ENV, "KNOBFLEET_INVENTORY": "inv"}),
        headstart.recall_key(["drift", "--json"], "/x", {**ENV, "ANSIBLE_CONFIG": "a.cfg"}),
        headstart.recall_key(["drift", "--json"], "/x", {**ENV, "KNOBFLEET_LIMIT": "lab1"}),
    }
    assert base not in others and len(others) == 6
    assert headstart.recall_key(["drift"], "/x", {**ENV, "KNOBFLEET_HEADSTART": "0"}) is None


def sh(out: str) -> list[str]:
    return ["/bin/sh", "-c", f"cat >/dev/null; printf '%s' {out}"]


def test_a_remembered_command_line_starts_its_processes_first_thing(isolated: Path) -> None:
    argv = ["drift", "--json"]
    assert headstart.start(argv) == 0  # nothing recorded yet
    headstart.remember("probe:k1", [("lab1", sh("one"), True), ("lab2", sh("two"), False)], b"FULL" * 30000, b"S")
    assert headstart.start(argv) == 2
    got = headstart.take("probe:k1")
    assert sorted(got) == ["lab1", "lab2"] and headstart.STARTED == {}
    assert [got[h][1].communicate(timeout=10) for h in ("lab1", "lab2")] == [(b"one", b""), (b"two", b"")]
    assert got["lab1"][1].returncode == 0 and got["lab1"][0] == sh("one")


def test_processes_started_for_another_plan_are_stopped_not_taken(isolated: Path) -> None:
    argv = ["drift"]
    headstart.start(argv)
    headstart.remember("probe:old", [("lab1", ["/bin/sh", "-c", "exec sleep 30"], True)], b"x", b"y")
    assert headstart.start(argv) == 1
    (proc,) = [p for _a, p in headstart.STARTED.values()]
    assert headstart.take("probe:new") == {}
    assert proc.returncode is not None and proc.returncode < 0  # killed, reaped
    assert headstart.STARTED == {}


def test_a_timeout_is_subprocess_s_and_kill_reaps(isolated: Path) -> None:
    proc = headstart.Spawned(["/bin/sh", "-c", "exec sleep 30"], b"")
    with pytest.raises(subprocess.TimeoutExpired):
        proc.communicate(timeout=0.2)
    proc.kill()
    proc.communicate()
    assert proc.poll() == -9


def test_a_missing_program_raises_oserror_and_leaks_no_descriptor(isolated: Path) -> None:
    import os

    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError):
        headstart.Spawned(["/nonexistent/ssh"], b"")
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_torn_record_starts_nothing(isolated: Path) -> None:
    argv = ["drift"]
    headstart.start(argv)
    headstart.remember("probe:k", [("lab1", sh("x"), True)], b"x", b"y")
    (record,) = Path(headstart.folder()).iterdir()
    record.write_bytes(record.read_bytes()[:10])
    assert headstart.start(argv) == 0


def test_the_entry_imports_nothing_heavy_before_it_starts(isolated: Path) -> None:
    code = (
        "import sys; from knobfleet import headstart; headstart.start(['drift']); "
        "print(sorted(m for m in ('subprocess', 'pathlib', 'typing', 'json', 'argparse') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_record_never_holds_the_fleets_key(isolated: Path) -> None:
    """The key the hosts need travels on stdin; the record holds a placeholder, and the key is read back from its
    own owner-only file at launch (no key file, or one others can read: nothing starts)."""
    key = "ab" * 32
    key_file = isolated / "secret.key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    argv = ["drift"]
    headstart.start(argv)
    echo = ["/bin/sh", "-c", "cat"]
    payload = b'{"args": {"secret_key": "' + key.encode() + b'"}}'
    headstart.remember("probe:k", [("lab1", echo, False)], b"FULL " + payload, payload, (key, str(key_file)))
    written = b"".join(p.read_bytes() for p in Path(headstart.folder()).iterdir())
    assert key.encode() not in written and headstart.KEY_PLACEHOLDER in written
    assert headstart.start(argv) == 1
    (proc,) = [p for _a, p in headstart.take("probe:k").values()]
    assert proc.communicate(timeout=10)[0] == payload  # the host gets the key itself
    key_file.chmod(0o644)
    assert headstart.start(argv) == 0
    key_file.unlink()
    assert headstart.start(argv) == 0


@pytest.mark.parametrize(
    ("argv", "env", "collects"),
    [
        (["drift", "--json"], {}, False),  # a one-shot read: its garbage is bounded by the answers
        (["verify"], {}, False),
        (["drift", "--watch", "5"], {}, True),  # a long command
        (["apply", "ctas512"], {}, True),
        (["tune", "run", "x"], {}, True),
        (["drift"], {"KNOBFLEET_HEADSTART": "0"}, True),
    ],
)
def test_the_collector_is_off_only_for_one_shot_reads(
    isolated: Path, argv: list[str], env: dict[str, str], collects: bool
) -> None:
    """The entry loads the command line's modules with the cyclic collector off, and turns it back on before any
    command other than a one-shot read runs."""
    code = (
        "import gc, sys\n"
        "import knobfleet.cli\n"
        "knobfleet.cli.main = lambda: print(gc.isenabled()) or 0\n"
        "from knobfleet._entry import main\n"
        "sys.argv = ['knobfleet', *sys.argv[1:]]\n"
        "main()\n"
    )
    run_env = {**ENV, "KNOBFLEET_STATE_DIR": str(isolated / "state"), **env}
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=run_env)
    assert out.stdout.strip() == str(collects), out.stderr


def test_a_host_whose_master_is_up_is_asked_through_it_the_others_by_ssh_and_none_once_the_config_changed(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record says, per host, which ControlMaster ``ssh -G`` named: the entry opens a session there (no ssh
    client) while that master answers, starts the command as before when it does not, and uses none of it once an
    ssh config file changed (a Host block may now send the name elsewhere)."""
    from knobfleet import sshmux
    from tests.unit.test_sshmux import Master, exits

    monkeypatch.setenv("LANG", "C.UTF-8")
    conf = isolated / "ssh_config"
    conf.write_text("Host *\n")
    argv = ["/bin/sh", "-c", "cat", "-F", str(conf), "x"]  # -F: the config file the stamp follows
    master = Master(isolated / "cp", exits(0))
    ways = {"lab1": (str(isolated / "cp"), ["LANG", "LC_*"], []), "lab2": (str(isolated / "gone"), [], [])}
    headstart.start(["drift"])
    headstart.remember("probe:k", [("lab1", argv, False), ("lab2", argv, False)], b"FULL", b"SHORT", None,
                       (sshmux.stamp(argv, ["/root"]), ways))  # fmt: skip
    assert headstart.start(["drift"]) == 2
    got = {h: p for h, (_a, p) in headstart.take("probe:k").items()}
    assert type(got["lab1"]).__name__ == "Passenger" and type(got["lab2"]).__name__ == "Spawned"
    assert got["lab1"].communicate(timeout=10) == (b"out:SHORT", b"x") and got["lab1"].returncode == 0
    assert got["lab2"].communicate(timeout=10) == (b"SHORT", b"")
    master.thread.join(5)
    assert master.seen == [("x", ["LANG=C.UTF-8"])]
    monkeypatch.setenv("KNOBFLEET_SSH_MUX", "0")  # the operator's opt-out: ssh clients only
    assert headstart.start(["drift"]) == 2
    assert kinds_reaped(headstart.take("probe:k")) == {"Spawned"}
    monkeypatch.delenv("KNOBFLEET_SSH_MUX")
    conf.write_text("Host *\n  HostName elsewhere\n")
    assert headstart.start(["drift"]) == 2
    assert kinds_reaped(headstart.take("probe:k")) == {"Spawned"}


def kinds_reaped(taken: dict[str, tuple[list[str], Any]]) -> set[str]:
    """The kinds of process taken, each run to its end and reaped (no child outlives the test)."""
    for _argv, proc in taken.values():
        proc.communicate(timeout=10)
    return {type(p).__name__ for _a, p in taken.values()}

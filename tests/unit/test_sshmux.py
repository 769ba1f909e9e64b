"""knobfleet.sshmux: the passenger side of OpenSSH's ControlMaster protocol, the head start's way to a host's probe
without an ssh client. The encoder and the frame parser round-trip (hypothesis); ``ssh -G``'s answer decides when
a passenger session is what ``ssh`` would send (data-driven); ``Passenger`` is checked against a master that speaks
the protocol as PROTOCOL.mux writes it, on a real Unix socket with real descriptors passed (the lab's own
ControlMaster is tests/integration/test_probe_paths.py's)."""

from __future__ import annotations

import fnmatch
import os
import select
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from knobfleet import sshmux


def decode_request(data: bytes) -> tuple[int, str, list[str]]:
    """(the hello's version, the command, the environment) of what ``request`` wrote: the master's reading."""
    frames, rest = sshmux.split_frames(data)
    assert rest == b"" and [k for k, _ in frames] == [sshmux.HELLO, sshmux.NEW_SESSION]
    body = frames[1][1]
    at = 4  # request id
    strings: list[bytes] = []

    def string() -> bytes:
        nonlocal at
        n = int.from_bytes(body[at : at + 4], "big")
        at += 4 + n
        return body[at - n : at]

    assert string() == b""  # reserved
    flags = [int.from_bytes(body[at + 4 * i : at + 4 * i + 4], "big") for i in range(5)]
    assert flags == [0, 0, 0, 0, sshmux.NO_ESCAPE]  # no tty, X11, agent, subsystem; no escape character
    at += 20
    assert string() == b""  # terminal type
    command = string().decode("utf-8", "surrogateescape")
    while at < len(body):
        strings.append(string())
    return int.from_bytes(frames[0][1][:4], "big"), command, [s.decode("utf-8", "surrogateescape") for s in strings]


@given(st.text(), st.lists(st.text(max_size=30), max_size=5))
@example("printf caf\udce9", ["LANG=\udcff"])  # bytes that are not UTF-8 travel as ssh sends them
def test_a_request_reads_back_as_the_master_reads_it(command: str, env: list[str]) -> None:
    assert decode_request(sshmux.request(command, env)) == (4, command, env)


@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.binary(max_size=64)), max_size=6), st.data())
def test_frames_split_at_any_cut_come_out_whole_and_in_order(
    msgs: list[tuple[int, bytes]], data: st.DataObject
) -> None:
    wire = b"".join(sshmux.frame(k.to_bytes(4, "big") + body) for k, body in msgs)
    cut = data.draw(st.integers(0, len(wire)))
    first, rest = sshmux.split_frames(wire[:cut])
    second, left = sshmux.split_frames(rest + wire[cut:])
    assert first + second == msgs and left == b""


@pytest.mark.parametrize("length", [0, 3, sshmux.MAX_FRAME + 1])
def test_a_frame_no_master_would_send_is_a_protocol_error(length: int) -> None:
    with pytest.raises(sshmux.ProtocolError):
        sshmux.split_frames(length.to_bytes(4, "big") + b"\0" * 8)


def test_a_refusal_s_reason_is_the_string_after_the_request_id() -> None:
    assert sshmux._reason(b"\0\0\0\1" + b"\0\0\0\3" + b"abcXYZ") == "abc"  # only the string's own length
    assert sshmux._reason(b"\0\0\0\1" + b"\0\0\0\2" + b"\xffz") == "\ufffdz"
    assert sshmux._reason(b"\0\0\0\1\0\0\0") == ""  # too short to hold a length


G = """user root
hostname 127.0.1.1
port 22
controlmaster false
controlpath /state/cp/bba8e3ba
requesttty auto
sessiontype default
stdinnull no
forkafterauthentication no
tunnel false
forwardagent no
forwardx11 no
permitlocalcommand no
sendenv LANG
sendenv LC_*
"""


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("", ("/state/cp/bba8e3ba", ["LANG", "LC_*"], [])),
        ("setenv A=1\nsetenv B=x y\n", ("/state/cp/bba8e3ba", ["LANG", "LC_*"], ["A=1", "B=x y"])),  # a line each
        ("requesttty false\n", ("/state/cp/bba8e3ba", ["LANG", "LC_*"], [])),  # RequestTTY no
        ("requesttty true\n", ("/state/cp/bba8e3ba", ["LANG", "LC_*"], [])),  # yes: a TTY only for a terminal stdin
        ("controlpath none\n", None),  # no master to talk to
        ("requesttty force\n", None),  # ssh would ask for a TTY
        ("forkafterauthentication yes\n", None),
        ("tunnel point-to-point\n", None),
        ("tunnel ethernet\n", None),
        ("remotecommand echo hi\n", None),  # ssh refuses a command then; a passenger would run it
        ("forwardagent yes\n", None),
        ("forwardagent /run/agent.sock\n", None),
        ("forwardx11 yes\n", None),
        ("permitlocalcommand yes\n", None),
        ("sessiontype subsystem\n", None),
        ("stdinnull yes\n", None),
        ("localforward 8080 [127.0.0.1]:80\n", None),
        ("dynamicforward 1080\n", None),
    ],
)
def test_ssh_g_says_when_a_passenger_session_is_what_ssh_would_send(
    change: str, expected: tuple[str, list[str], list[str]] | None
) -> None:
    key = change.split(" ")[0]
    text = "".join(line + "\n" for line in G.splitlines() if key == "" or not line.startswith(key + " ")) + change
    assert sshmux.plan(text) == expected


@given(st.text("ab*?", max_size=6), st.text("abc", max_size=6))
def test_patterns_match_as_ssh_config_s(pattern: str, name: str) -> None:
    assert sshmux.matches(pattern, name) == fnmatch.fnmatchcase(name, pattern)


def test_the_environment_is_what_sendenv_names_then_setenv() -> None:
    environ = {"LANG": "C.UTF-8", "LC_ALL": "C", "LC_TIME": "en_GB", "HOME": "/root", "LANGUAGE": "en"}
    got = sshmux.environment(["LANG", "LC_*", "-LC_ALL"], ["X=1"], environ)
    assert got == ["LANG=C.UTF-8", "LC_TIME=en_GB", "X=1"]


def test_config_files_are_the_f_file_alone_when_given() -> None:
    assert sshmux.config_files(["ssh", "h", "-F"], ["/root"])[0] == "/root/.ssh/config"  # the remote command
    assert sshmux.config_files(["ssh", "-F", "/etc/kf.conf", "h", "cmd"], ["/root"]) == ["/etc/kf.conf"]
    assert sshmux.config_files(["ssh", "-F/etc/kf.conf", "h", "cmd"], ["/root"]) == ["/etc/kf.conf"]
    assert sshmux.config_files(["ssh", "h", "cmd"], ["/home/u", "/root"])[:2] == ["/home/u/.ssh/config",
                                                                                "/root/.ssh/config"]  # fmt: skip


def test_both_homes_are_watched_when_home_is_not_the_users_own(monkeypatch: pytest.MonkeyPatch) -> None:
    import pwd

    own = pwd.getpwuid(os.geteuid()).pw_dir
    monkeypatch.setenv("HOME", "/nonexistent-home")  # as sudo may leave it
    assert sshmux.homes() == ["/nonexistent-home", own]
    monkeypatch.setenv("HOME", own)
    assert sshmux.homes() == [own]


def test_the_stamp_changes_with_any_config_file_and_only_then(tmp_path: Path) -> None:
    conf = tmp_path / "config"
    argv = ["ssh", "-F", str(conf), "h", "true"]
    assert sshmux.stamp(argv, [str(tmp_path)]) == f"{conf}:-"  # none there yet: its absence is what is stamped
    conf.write_text("Host *\n")
    first = sshmux.stamp(argv, [str(tmp_path)])
    assert sshmux.stamp(argv, [str(tmp_path)]) == first
    os.utime(conf, ns=(1, 1))  # the same bytes, another time (an editor that saved without a change)
    assert sshmux.stamp(argv, [str(tmp_path)]) not in (first, f"{conf}:-")
    conf.write_text("Host *\n  HostName elsewhere\n")
    assert sshmux.stamp(argv, [str(tmp_path)]) != first
    folder = tmp_path / "d"
    folder.mkdir()
    argv = ["ssh", "-F", str(folder), "h", "true"]
    before = sshmux.stamp(argv, [str(tmp_path)])
    (folder / "10-new.conf").write_text("Host x\n")
    assert sshmux.stamp(argv, [str(tmp_path)]) != before


class Master:
    """A ControlMaster as PROTOCOL.mux describes it: reads the hello and the request, takes three descriptors, then
    does what ``script`` says with them (the command, stdin's bytes, and the descriptors)."""

    def __init__(
        self, path: Path, script: Callable[[socket.socket, str, bytes, list[int]], None], opens: bool = True
    ) -> None:
        self.opens = opens  # False: the script answers in place of MUX_S_SESSION_OPENED (a refusal)
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(4)
        self.script = script
        self.seen: list[tuple[str, list[str]]] = []
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        conn, _ = self.server.accept()
        with conn:
            try:
                conn.sendall(sshmux.frame(sshmux.HELLO.to_bytes(4, "big") + (4).to_bytes(4, "big")))
            except BrokenPipeError:  # the client went at once (it refused this master)
                return
            wire = b""
            for _ in range(2):  # exactly each frame's length, as ssh's master reads: what follows carries the fds
                try:
                    head = conn.recv(4, socket.MSG_WAITALL)
                except ConnectionResetError:
                    head = b""
                if len(head) < 4:  # the client went before asking
                    return
                wire += head + conn.recv(int.from_bytes(head, "big"), socket.MSG_WAITALL)
            _v, command, env = decode_request(wire)
            self.seen.append((command, env))
            fds: list[int] = []
            while len(fds) < 3:
                _msg, anc, _flags, _addr = conn.recvmsg(1, socket.CMSG_SPACE(4))
                fds += [int.from_bytes(data[:4], "little") for _l, _t, data in anc]
            if not self.opens:
                self.script(conn, command, b"", fds)
                for fd in fds:
                    os.close(fd)
                return
            conn.sendall(sshmux.frame((sshmux.S_SESSION_OPENED).to_bytes(4, "big") + b"\0\0\0\1\0\0\0\7"))
            stdin = b""
            while chunk := os.read(fds[0], 65536):
                stdin += chunk
            self.script(conn, command, stdin, fds)
            for fd in fds:
                os.close(fd)


def exits(code: int) -> Callable[[socket.socket, str, bytes, list[int]], None]:
    def script(conn: socket.socket, command: str, stdin: bytes, fds: list[int]) -> None:
        os.write(fds[1], b"out:" + stdin)
        os.write(fds[2], command.encode())
        conn.sendall(sshmux.frame(sshmux.S_EXIT_MESSAGE.to_bytes(4, "big") + b"\0\0\0\7" + code.to_bytes(4, "big")))

    return script


@pytest.fixture
def sock_path(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "cp"


def test_a_session_runs_the_command_with_its_stdin_and_returns_its_status(sock_path: Path) -> None:
    master = Master(sock_path, exits(3))
    proc = sshmux.Passenger(str(sock_path), "probe --x", ["LANG=C"], b"payload", ["ssh", "h", "probe --x"])
    assert proc.communicate(timeout=10) == (b"out:payload", b"probe --x")
    assert proc.returncode == 3 and proc.poll() == 3 and proc.args == ["ssh", "h", "probe --x"]
    assert not proc.refused
    master.thread.join(5)
    assert master.seen == [("probe --x", ["LANG=C"])]


def test_output_the_master_still_holds_after_the_exit_message_is_read_to_the_end(sock_path: Path) -> None:
    """sshd sends the exit status when the command exits and forwards what is still in its pipes after it; a
    passenger that hangs up at the exit message has that output dropped (the master's
    ``mux_master_control_cleanup_cb``), so the session ends when the master hangs up, as ``ssh``'s does. (CI saw a
    drift document cut short this way; the lab's real master: tests/integration/test_probe_paths.py.)"""

    def late(conn: socket.socket, command: str, stdin: bytes, fds: list[int]) -> None:
        conn.sendall(sshmux.frame(sshmux.S_EXIT_MESSAGE.to_bytes(4, "big") + b"\0\0\0\7" + b"\0\0\0\0"))
        readable, _w, _x = select.select([conn], [], [], 0.5)
        if readable and conn.recv(1, socket.MSG_PEEK) == b"":
            return  # the passenger hung up: what OpenSSH still held is dropped
        os.write(fds[1], b'{"late": true}')

    Master(sock_path, late)
    proc = sshmux.Passenger(str(sock_path), "probe", [], b"", ["ssh"])
    assert proc.communicate(timeout=10) == (b'{"late": true}', b"") and proc.returncode == 0


def test_a_session_polled_to_its_end_and_waited_for_leaves_no_descriptor(sock_path: Path) -> None:
    master = Master(sock_path, exits(5))
    before = open_fds()
    proc = sshmux.Passenger(str(sock_path), "x", [], b"in", ["ssh"])
    deadline = time.monotonic() + 10
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.returncode == 5 and proc.wait(5) == 5
    assert proc.communicate(timeout=5) == (b"out:in", b"x")
    master.thread.join(5)
    assert open_fds() <= before  # the control socket and all six pipe ends are closed


def test_a_master_that_hangs_up_without_a_status_is_ssh_s_255(sock_path: Path) -> None:
    Master(sock_path, lambda conn, c, s, fds: None)
    proc = sshmux.Passenger(str(sock_path), "true", [], b"", ["ssh"])
    assert proc.communicate(timeout=10) == (b"", b"") and proc.returncode == sshmux.LOST


def refuse(conn: socket.socket, c: str, s: bytes, fds: list[int]) -> None:
    """What the master sends when sshd will not open one more session (its MaxSessions)."""
    reason = b"session open refused by peer"
    conn.sendall(sshmux.frame(sshmux.S_FAILURE.to_bytes(4, "big") + b"\0\0\0\1" + len(reason).to_bytes(4, "big")
                              + reason))  # fmt: skip


def test_a_refusal_is_255_with_the_master_s_reason(sock_path: Path) -> None:
    Master(sock_path, refuse, opens=False)
    proc = sshmux.Passenger(str(sock_path), "true", [], b"", ["ssh"])
    _out, err = proc.communicate(timeout=10)
    assert proc.returncode == sshmux.LOST and b"session open refused by peer" in err and proc.refused


def test_a_timeout_is_subprocess_s_and_kill_ends_the_session_at_once(sock_path: Path) -> None:
    release = threading.Event()
    Master(sock_path, lambda conn, c, s, fds: release.wait(10))
    proc = sshmux.Passenger(str(sock_path), "sleep", [], b"", ["ssh", "h", "sleep"])
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.communicate(timeout=0.2)
    started = time.monotonic()
    proc.kill()
    assert proc.communicate(timeout=5) == (b"", b"") and proc.wait(5) == sshmux.KILLED
    assert time.monotonic() - started < 5
    release.set()


def test_one_poll_sees_a_session_whose_status_and_hang_up_are_both_there(sock_path: Path) -> None:
    master = Master(sock_path, exits(3))
    proc = sshmux.Passenger(str(sock_path), "x", [], b"", ["ssh"])
    master.thread.join(5)  # the exit message sent and the socket closed: both wait to be read
    assert proc.poll() == 3
    assert proc.communicate(timeout=5) == (b"out:", b"x")


def test_kill_from_another_thread_ends_a_communicate_in_progress(sock_path: Path) -> None:
    """As ``ssh.py``'s fan-out stops a session a worker thread is reading: nothing is closed under the reader."""
    release = threading.Event()
    Master(sock_path, lambda conn, c, s, fds: release.wait(10))
    proc = sshmux.Passenger(str(sock_path), "sleep", [], b"", ["ssh", "h", "sleep"])
    got: list[object] = []
    reader = threading.Thread(target=lambda: got.append(proc.communicate(timeout=10)))
    reader.start()
    time.sleep(0.2)  # the reader is waiting in poll()
    assert proc.poll() is None  # it leaves the socket to the reader
    started = time.monotonic()
    proc.kill()
    reader.join(5)
    release.set()
    assert got == [(b"", b"")] and proc.returncode == sshmux.KILLED and time.monotonic() - started < 5


def open_fds() -> set[str]:
    """This process's open descriptors, less the one the listing itself used (closed once listed)."""
    return {fd for fd in os.listdir("/proc/self/fd") if os.path.lexists(f"/proc/self/fd/{fd}")}


def test_no_master_or_another_user_s_is_an_oserror_and_leaks_no_descriptor(
    sock_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    master = Master(sock_path, exits(0))
    before = open_fds()
    with pytest.raises(FileNotFoundError):
        sshmux.Passenger(str(sock_path.with_name("gone")), "true", [], b"", ["ssh"])
    sock_path.with_name("file").write_text("not a socket")
    with pytest.raises(ConnectionRefusedError):
        sshmux.Passenger(str(sock_path.with_name("file")), "true", [], b"", ["ssh"])
    monkeypatch.setattr(os, "geteuid", lambda: 4242)  # as if the master ran as someone else
    with pytest.raises(PermissionError):
        sshmux.Passenger(str(sock_path), "true", [], b"", ["ssh"])
    master.thread.join(5)
    assert not master.thread.is_alive() and master.seen == []  # it was never asked for a session
    assert open_fds() <= before  # nothing opened here is left open (a collected object may close one of before)

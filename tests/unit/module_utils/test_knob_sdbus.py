"""The unit-property reader that asks systemd over its private socket (module_utils/knob_sdbus.py): the wire
format both ways, systemctl's formatting of each type, every doubt raised as ``Unsure`` (the probe then runs
systemctl), and a whole exchange with a stand-in peer on a socket in a temp dir. Equality with real systemd's
``systemctl show`` is held by tests/integration/test_probe_paths.py."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knobfleet.module_utils import knob_observe as ko
from knobfleet.module_utils import knob_sdbus as sd

# --- a test-side encoder of replies (little- or big-endian), independent of the module's encoder -------------


def _pad(buf: bytearray, n: int) -> None:
    buf += b"\0" * (-len(buf) % n)


def _put(buf: bytearray, sig: str, value: Any, order: str) -> None:
    o: Any = order
    if sig in ("s", "o"):
        _pad(buf, 4)
        raw = value.encode()
        buf += len(raw).to_bytes(4, o) + raw + b"\0"
    elif sig == "g":
        buf += bytes((len(value),)) + value.encode() + b"\0"
    elif sig == "b":
        _pad(buf, 4)
        buf += int(bool(value)).to_bytes(4, o)
    elif sig in sd.INTS:
        size, signed = sd.INTS[sig]
        _pad(buf, size)
        buf += value.to_bytes(size, o, signed=signed)
    elif sig == "v":
        inner, val = value
        _put(buf, "g", inner, order)
        _put(buf, inner, val, order)
    elif sig.startswith("a"):
        _pad(buf, 4)
        at = len(buf)
        buf += b"\0\0\0\0"
        _pad(buf, sd.ALIGN[sig[1]])
        start = len(buf)
        for item in value:
            _put(buf, sig[1:], item, order)
        buf[at : at + 4] = (len(buf) - start).to_bytes(4, o)
    elif sig.startswith("("):
        _pad(buf, 8)
        inner = sig[1:-1]
        j = 0
        for item in value:
            end = sd._type_end(inner, j)
            _put(buf, inner[j:end], item, order)
            j = end
    else:
        raise AssertionError(sig)


def message(
    kind: int, serial: int, fields: list[tuple[int, str, Any]], body_sig: str, body: list[Any], order: str = "little"
) -> bytes:
    o: Any = order
    body_buf = bytearray()
    j = 0
    for value in body:
        end = sd._type_end(body_sig, j)
        _put(body_buf, body_sig[j:end], value, order)
        j = end
    if body_sig:
        fields = [*fields, (8, "g", body_sig)]
    head = bytearray((b"l" if order == "little" else b"B") + bytes((kind, 0, 1)))
    head += len(body_buf).to_bytes(4, o) + serial.to_bytes(4, o)
    _put(head, "a(yv)", [(code, (sig, value)) for code, sig, value in fields], order)
    _pad(head, 8)
    return bytes(head + body_buf)


def reply(serial: int, sig: str, value: Any, order: str = "little") -> bytes:
    return message(sd.METHOD_RETURN, 1000 + serial, [(5, "u", serial)], "v", [(sig, value)], order)


# --- pure parts ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("unit", "path"),
    [
        ("sglang-dsv4-decode.service", "/org/freedesktop/systemd1/unit/sglang_2ddsv4_2ddecode_2eservice"),
        ("ssh.service", "/org/freedesktop/systemd1/unit/ssh_2eservice"),
        ("1x.service", "/org/freedesktop/systemd1/unit/_31x_2eservice"),  # a leading digit is escaped too
        ("a_b@1.service", "/org/freedesktop/systemd1/unit/a_5fb_401_2eservice"),
        ("", "/org/freedesktop/systemd1/unit/_"),
    ],
)
def test_object_path_escapes_as_sd_bus_does(unit: str, path: str) -> None:
    assert sd.object_path(unit) == path


def test_a_call_decodes_to_what_was_encoded() -> None:
    raw = sd.encode_call(7, "/org/x", sd.PROPS_IFACE, "Get", (sd.SERVICE, "MainPID"))
    assert len(raw) == sd.message_size(raw)
    kind, fields, body = sd.decode_message(raw)
    assert kind == sd.METHOD_CALL
    assert fields == {1: "/org/x", 6: sd.DEST, 2: sd.PROPS_IFACE, 3: "Get", 8: "ss"}
    assert body == [sd.SERVICE, "MainPID"]
    assert int.from_bytes(raw[8:12], "little") == 7


@settings(max_examples=200, deadline=None)
@given(
    serial=st.integers(1, 2**32 - 1),
    path=st.text(min_size=1, max_size=80),
    member=st.text(max_size=40),
    args=st.lists(st.text(max_size=60), max_size=4),
)
def test_any_call_round_trips(serial: int, path: str, member: str, args: list[str]) -> None:
    raw = sd.encode_call(serial, path, "i.f", member, tuple(args))
    assert sd.message_size(raw) == len(raw)
    kind, fields, body = sd.decode_message(raw)
    assert (kind, fields[1], fields[3], body) == (sd.METHOD_CALL, path, member, args)


VALUES = st.one_of(
    st.tuples(st.just("s"), st.text(max_size=30)),
    st.tuples(st.just("b"), st.booleans()),
    st.tuples(st.just("u"), st.integers(0, 2**32 - 1)),
    st.tuples(st.just("i"), st.integers(-(2**31), 2**31 - 1)),
    st.tuples(st.just("t"), st.integers(0, 2**64 - 1)),
    st.tuples(st.just("x"), st.integers(-(2**63), 2**63 - 1)),
    st.tuples(st.just("as"), st.lists(st.text(max_size=10), max_size=5)),
)


@settings(max_examples=300, deadline=None)
@given(value=VALUES, order=st.sampled_from(["little", "big"]), serial=st.integers(1, 50))
def test_replies_of_either_byte_order_decode_to_their_variant(value: tuple[str, Any], order: str, serial: int) -> None:
    raw = reply(serial, *value, order=order)
    assert sd.message_size(raw) == len(raw)
    kind, fields, body = sd.decode_message(raw)
    assert (kind, fields[5], body) == (sd.METHOD_RETURN, serial, [value])


def test_a_body_of_several_values_including_a_signature_decodes_in_order() -> None:
    raw = message(sd.METHOD_RETURN, 9, [(5, "u", 3)], "gsu", ["as", "x", 5])
    assert sd.decode_message(raw) == (sd.METHOD_RETURN, {5: 3, 8: "gsu"}, ["as", "x", 5])


def test_a_message_cut_short_is_unsure_never_a_wrong_value() -> None:
    raw = reply(1, "s", "active")
    for cut in range(16, len(raw)):
        try:
            _kind, _fields, body = sd.decode_message(raw[:cut])
        except (sd.Unsure, IndexError, UnicodeDecodeError):
            continue
        assert body in ([], [("s", "active")]), cut


@pytest.mark.parametrize(
    ("name", "sig", "value", "shown"),
    [
        ("ActiveState", "s", "active", "active"),
        ("FragmentPath", "s", "", ""),
        ("NeedDaemonReload", "b", True, "yes"),
        ("NeedDaemonReload", "b", False, "no"),
        ("MainPID", "u", 4242, "4242"),
        ("Byte", "y", 7, "7"),
        ("ExecMainStatus", "i", -1, "-1"),
        ("ExecMainStartTimestampMonotonic", "t", 35178621626, "35178621626"),
        ("ExecMainStartTimestamp", "t", 0, ""),
        ("ExecMainStartTimestamp", "t", 2**64 - 1, ""),
        ("DropInPaths", "as", [], ""),
        ("DropInPaths", "as", ["/etc/a.conf", "/run/b.conf"], "/etc/a.conf /run/b.conf"),
    ],
)
def test_values_are_shown_as_systemctl_prints_them(name: str, sig: str, value: Any, shown: str) -> None:
    assert sd.shown(name, sig, value) == shown


def test_timestamps_are_local_time_with_systemds_weekday_and_the_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    for tz, want in (("UTC", "Wed 2026-12-02 01:22:59 UTC"), ("Asia/Kolkata", "Wed 2026-12-02 06:52:59 IST")):
        monkeypatch.setenv("TZ", tz)
        time.tzset()
        try:
            assert sd.shown("ExecMainStartTimestamp", "t", 1796174579_123456) == want
        finally:
            monkeypatch.undo()
            time.tzset()


@pytest.mark.parametrize(
    ("name", "sig", "value"),
    [
        ("FragmentPath", "s", "/etc/x\n.service"),  # systemctl's line would split
        ("Description", "s", "a\x1b[31m"),
        ("DropInPaths", "as", ["/etc/with space.conf"]),
        ("DropInPaths", "as", [""]),
        ("Environment", "a(ss)", []),
        ("CPUUsageNSec", "d", 1.0),
    ],
)
def test_what_systemctl_might_print_otherwise_is_unsure(name: str, sig: str, value: Any) -> None:
    with pytest.raises(sd.Unsure):
        sd.shown(name, sig, value)


# --- a whole exchange with a stand-in peer ------------------------------------------------------------------------


class Peer:
    """A unix-socket peer speaking systemd's side: EXTERNAL auth, then one reply per Get, from ``props``
    (name -> (signature, value)); a name it does not know gets an error reply. It answers all calls only after
    it has read them all (they arrive in one write) and sends a signal first, as a real bus may."""

    def __init__(
        self, path: Path, props: dict[str, tuple[str, Any]], auth: bytes = b"OK 1234abcd\r\n", expect: int = 0
    ) -> None:
        self.path, self.props, self.auth, self.expect = path, props, auth, expect or len(props) or 1
        self.calls: list[tuple[int, dict[int, Any], list[Any]]] = []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(1)
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        conn, _ = self.server.accept()
        with conn:
            conn.settimeout(5)
            buf = b""
            while b"\r\n" not in buf:
                buf += conn.recv(4096)
            assert buf.startswith(b"\0AUTH EXTERNAL " + str(os.geteuid()).encode().hex().encode())
            conn.sendall(self.auth)
            if not self.auth.startswith(b"OK"):
                return
            buf = b""
            while not buf.startswith(b"BEGIN\r\n"):
                buf += conn.recv(4096)
            buf = buf[len(b"BEGIN\r\n") :]
            wanted = self.expect
            serials: list[int] = []
            while len(self.calls) < wanted:
                while len(buf) < 16 or len(buf) < sd.message_size(buf):
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                size = sd.message_size(buf)
                serials.append(int.from_bytes(buf[8:12], "little"))
                self.calls.append(sd.decode_message(buf[:size]))
                buf = buf[size:]
            out = message(4, 1, [(3, "s", "UnitNew")], "", [])  # a signal: never taken for an answer
            for serial, (_kind, _fields, (_iface, name)) in zip(serials, self.calls, strict=True):
                if name in self.props:
                    out += reply(serial, *self.props[name])
                else:
                    unknown = "org.freedesktop.DBus.Error.UnknownProperty"
                    out += message(sd.ERROR, 900, [(5, "u", serial), (4, "s", unknown)], "s", ["no"])
            conn.sendall(out)

    def close(self) -> None:
        self.thread.join(5)
        self.server.close()


@pytest.fixture
def sock_path(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "private"


SYSTEMD = {
    "Restart": ("s", "always"),
    "MainPID": ("u", 76),
    "ExecMainStartTimestamp": ("t", 1796174579_123456),
    "ControlGroup": ("s", "/system.slice/e.service"),
    "ActiveState": ("s", "active"),
    "DropInPaths": ("as", []),
    "NeedDaemonReload": ("b", False),
}


def test_a_whole_exchange_reads_every_property_in_one_write(sock_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    peer = Peer(sock_path, SYSTEMD)
    try:
        got = sd.unit_properties("e.service", tuple(SYSTEMD), 5.0, str(sock_path))
    finally:
        peer.close()
        monkeypatch.undo()
        time.tzset()
    assert list(got.items()) == [
        ("Restart", "always"),
        ("MainPID", "76"),
        ("ExecMainStartTimestamp", "Wed 2026-12-02 01:22:59 UTC"),
        ("ControlGroup", "/system.slice/e.service"),
        ("ActiveState", "active"),
        ("DropInPaths", ""),
        ("NeedDaemonReload", "no"),
    ]
    paths = {fields[1] for _k, fields, _b in peer.calls}
    assert paths == {"/org/freedesktop/systemd1/unit/e_2eservice"}
    assert [(b[0], b[1]) for _k, _f, b in peer.calls] == [(sd.INTERFACE[n], n) for n in SYSTEMD]


def test_an_error_reply_or_a_refused_login_is_unsure(sock_path: Path) -> None:
    peer = Peer(sock_path, {"ActiveState": ("s", "active")}, expect=2)
    try:
        with pytest.raises(sd.Unsure, match="UnknownProperty"):
            sd.unit_properties("e.service", ("ActiveState", "SubState"), 5.0, str(sock_path))
    finally:
        peer.close()
    sock_path.unlink()
    peer = Peer(sock_path, {}, auth=b"REJECTED EXTERNAL\r\n")
    try:
        with pytest.raises(sd.Unsure, match="authentication"):
            sd.unit_properties("e.service", ("ActiveState",), 5.0, str(sock_path))
    finally:
        peer.close()


def test_a_property_without_a_known_interface_is_unsure_before_any_connection(tmp_path: Path) -> None:
    with pytest.raises(sd.Unsure, match="LoadState"):
        sd.unit_properties("e.service", ("ActiveState", "LoadState"), 1.0, str(tmp_path / "none"))


def test_unit_props_asks_systemd_directly_and_runs_systemctl_when_unsure(
    sock_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the direct reader is used as root only (systemd's private socket is root's)")
    ran: list[list[str]] = []

    def systemctl(argv: list[str], timeout: float) -> str:
        ran.append(argv)
        return "ActiveState=from-systemctl\n"

    monkeypatch.setattr(ko, "run_output", systemctl)
    everything: dict[str, tuple[str, Any]] = {n: ("s", "x") for n in ko.PROPS}
    everything.update({"MainPID": ("u", 1), "NRestarts": ("u", 0), "ExecMainStatus": ("i", 0)})
    everything.update({"ExecMainStartTimestamp": ("t", 0), "ExecMainStartTimestampMonotonic": ("t", 0)})
    everything.update({"NeedDaemonReload": ("b", False), "DropInPaths": ("as", [])})
    peer = Peer(sock_path, everything)
    try:
        props = ko.unit_props("e.service", str(sock_path))
    finally:
        peer.close()
    assert list(props) == list(ko.PROPS) and props["MainPID"] == "1" and props["ExecMainStartTimestamp"] == ""
    assert ran == []
    sock_path.unlink()
    peer = Peer(sock_path, {**everything, "FragmentPath": ("s", "/etc/a\nb")})  # unsure: systemctl answers
    try:
        props = ko.unit_props("e.service", str(sock_path))
    finally:
        peer.close()
    assert props == {"ActiveState": "from-systemctl"} and ran and ran[0][:2] == ["systemctl", "show"]
    ran.clear()
    assert ko.unit_props("e.service", str(sock_path.with_name("absent"))) == {"ActiveState": "from-systemctl"}
    assert ran


def test_a_peer_that_never_answers_is_unsure_in_time(sock_path: Path) -> None:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(sock_path))
    server.listen(1)
    held: list[socket.socket] = []

    def silent() -> None:  # logs the client in, then reads and never answers
        conn, _ = server.accept()
        held.append(conn)
        conn.recv(4096)
        conn.sendall(b"OK 1234abcd\r\n")

    thread = threading.Thread(target=silent, daemon=True)
    thread.start()
    try:
        with pytest.raises((sd.Unsure, OSError), match=r"in time|timed out"):  # the caller runs systemctl then
            sd.unit_properties("e.service", ("ActiveState",), 0.3, str(sock_path))
    finally:
        thread.join(5)
        for conn in held:
            conn.close()
        server.close()

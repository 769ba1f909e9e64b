"""A unit's properties from systemd itself, as ``systemctl show -p NAME,...`` prints them, without starting
``systemctl``: the probe's hot path (issue 29) spent ~7 ms of host CPU per drift spawning it, more than
everything else it reads together. Standard library only; no ``socket``, ``struct`` or ``enum`` imports.

How: the D-Bus wire protocol spoken over systemd's private socket (``/run/systemd/private``, the one ``systemctl``
itself uses as root; a direct connection, so no bus daemon and no ``Hello``), one ``Properties.Get`` per property,
all sent in one write. The values are formatted as systemd's own ``bus_print_property`` does for the types the
probe reads: strings as they are, booleans ``yes``/``no``, integers in decimal, ``…Timestamp`` microseconds as
``Wed 2026-12-02 01:22:59 UTC`` (empty for 0), string arrays joined by spaces.

Anything this reader is not sure to print exactly as ``systemctl`` would (no such socket or not root, an error
reply, a type it does not format, a string with a control character or an array item with a space, a timestamp
without a zone name) makes ``unit_properties`` return None, and the caller runs ``systemctl`` as before. So the
probe document is the same either way; tests/integration/test_probe_paths.py holds the two equal on real systemd.

``encode_call`` and ``decode_message`` are pure (tests/unit/module_utils/test_knob_sdbus.py).
"""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only (``typing`` costs a probe ~5 ms)
    from typing import Any, Literal

    Order = Literal["little", "big"]

PRIVATE = "/run/systemd/private"
DEST = "org.freedesktop.systemd1"
UNIT = "org.freedesktop.systemd1.Unit"
SERVICE = "org.freedesktop.systemd1.Service"
PROPS_IFACE = "org.freedesktop.DBus.Properties"
# Which interface of a service unit's object holds each property the probe reads.
INTERFACE = {
    "ActiveState": UNIT,
    "SubState": UNIT,
    "FragmentPath": UNIT,
    "DropInPaths": UNIT,
    "UnitFileState": UNIT,
    "NeedDaemonReload": UNIT,
    "Restart": SERVICE,
    "MainPID": SERVICE,
    "Result": SERVICE,
    "NRestarts": SERVICE,
    "ExecMainStartTimestamp": SERVICE,
    "ExecMainStartTimestampMonotonic": SERVICE,
    "ExecMainStatus": SERVICE,
    "ControlGroup": SERVICE,
}
METHOD_CALL, METHOD_RETURN, ERROR = 1, 2, 3
MAX_MESSAGE = 1 << 20
ALIGN = {"y": 1, "b": 4, "n": 2, "q": 2, "i": 4, "u": 4, "x": 8, "t": 8, "d": 8, "h": 4, "s": 4, "o": 4, "g": 1}
ALIGN.update({"a": 4, "(": 8, "{": 8, "v": 1})
INTS = {"y": (1, False), "n": (2, True), "q": (2, False), "i": (4, True), "u": (4, False), "h": (4, False)}
INTS.update({"x": (8, True), "t": (8, False), "b": (4, False)})
WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")  # systemd's own table: never the locale's
USEC_INFINITY = (1 << 64) - 1


class Unsure(Exception):
    """Something this reader would not print exactly as ``systemctl show`` does: the caller runs systemctl."""


def object_path(unit: str) -> str:
    """The unit's object path (sd_bus_path_encode: every byte but ``[A-Za-z0-9]`` as ``_xx``; a leading digit too)."""
    out = []
    for i, byte in enumerate(unit.encode("utf-8")):
        ch = chr(byte)
        plain = ("a" <= ch <= "z") or ("A" <= ch <= "Z") or (i > 0 and "0" <= ch <= "9")
        out.append(ch if plain else "_%02x" % byte)
    return "/org/freedesktop/systemd1/unit/" + ("".join(out) or "_")


def _pad(buf: bytearray, n: int) -> None:
    buf += b"\0" * (-len(buf) % n)


def _string(buf: bytearray, value: str) -> None:
    _pad(buf, 4)
    raw = value.encode("utf-8")
    buf += len(raw).to_bytes(4, "little") + raw + b"\0"


def encode_call(serial: int, path: str, interface: str, member: str, args: tuple[str, ...]) -> bytes:
    """A little-endian METHOD_CALL message whose body is ``args``, all strings (signature ``s`` * n)."""
    body = bytearray()
    for a in args:
        _string(body, a)
    signature = "s" * len(args)
    fields = bytearray()
    wanted = ((1, "o", path), (6, "s", DEST), (2, "s", interface), (3, "s", member), (8, "g", signature))
    for code, sig, value in wanted:
        _pad(fields, 8)  # each field is a struct (yv); the array starts 8-aligned at offset 16
        fields += bytes((code, 1)) + sig.encode() + b"\0"
        if sig == "g":
            fields += bytes((len(value),)) + value.encode() + b"\0"
        else:
            _string(fields, value)
    head = bytearray(b"l" + bytes((METHOD_CALL, 0, 1)))
    head += len(body).to_bytes(4, "little") + serial.to_bytes(4, "little") + len(fields).to_bytes(4, "little")
    head += fields
    _pad(head, 8)
    return bytes(head + body)


def _type_end(sig: str, i: int) -> int:
    """The index just past the one complete type starting at ``sig[i]``."""
    c = sig[i]
    if c == "a":
        return _type_end(sig, i + 1)
    if c in "({":
        close = ")" if c == "(" else "}"
        j = i + 1
        while sig[j] != close:
            j = _type_end(sig, j)
        return j + 1
    if c in ALIGN:
        return i + 1
    raise Unsure("signature %r: type %r" % (sig, c))


def _read(data: bytes, pos: int, sig: str, i: int, order: Order) -> tuple[Any, int, int]:
    """(value, new pos, new signature index) of the complete type at ``sig[i]`` read from ``data[pos:]``."""
    c = sig[i]
    pos += -pos % ALIGN.get(c, 1)
    if c in INTS:
        size, signed = INTS[c]
        if pos + size > len(data):
            raise Unsure("message cut short")
        value = int.from_bytes(data[pos : pos + size], order, signed=signed)
        return (bool(value) if c == "b" else value), pos + size, i + 1
    if c in "so":
        n = int.from_bytes(data[pos : pos + 4], order)
        end = pos + 4 + n
        if end >= len(data) or data[end] != 0:
            raise Unsure("a string cut short")
        return data[pos + 4 : end].decode("utf-8"), end + 1, i + 1
    if c == "g":
        n = data[pos]
        return data[pos + 1 : pos + 1 + n].decode("ascii"), pos + 2 + n, i + 1
    if c == "v":
        inner, pos, _ = _read(data, pos, "g", 0, order)
        value, pos, _ = _read(data, pos, inner, 0, order)
        if _type_end(inner, 0) != len(inner):
            raise Unsure("variant of %r" % inner)
        return (inner, value), pos, i + 1
    if c == "a":
        n = int.from_bytes(data[pos : pos + 4], order)
        elem_end = _type_end(sig, i + 1)
        pos += 4
        pos += -pos % ALIGN[sig[i + 1]]
        end, items = pos + n, []
        if end > len(data):
            raise Unsure("an array cut short")
        while pos < end:
            value, pos, _ = _read(data, pos, sig, i + 1, order)
            items.append(value)
        return items, pos, elem_end
    if c in "({":
        close = ")" if c == "(" else "}"
        j, fields = i + 1, []
        while sig[j] != close:
            value, pos, j = _read(data, pos, sig, j, order)
            fields.append(value)
        return tuple(fields), pos, j + 1
    raise Unsure("type %r (in %r)" % (c, sig))


def message_size(data: bytes) -> int:
    """The size of the message that starts ``data`` (at least 16 bytes of it), as its fixed header says."""
    order: Order = "little" if data[:1] == b"l" else "big"
    fields = int.from_bytes(data[12:16], order)
    head = 16 + fields + (-(16 + fields) % 8)
    return head + int.from_bytes(data[4:8], order)


def decode_message(data: bytes) -> tuple[int, dict[int, Any], list[Any]]:
    """(message type, header fields by code, body values) of one whole message."""
    if data[:1] not in (b"l", b"B") or len(data) < 16:
        raise Unsure("not a D-Bus message")
    order: Order = "little" if data[:1] == b"l" else "big"
    kind = data[1]
    fields_raw, pos, _ = _read(data, 12, "a(yv)", 0, order)
    fields = {code: value for code, (_sig, value) in fields_raw}
    pos += -pos % 8
    body: list[Any] = []
    signature = fields.get(8, "")
    j = 0
    while j < len(signature):
        value, pos, j = _read(data, pos, signature, j, order)
        body.append(value)
    return kind, fields, body


def timestamp(usec: int) -> str:
    """A ``…Timestamp`` property as ``systemctl show`` prints it (format_timestamp, local time; empty for none)."""
    if usec <= 0 or usec == USEC_INFINITY:
        return ""
    tm = time.localtime(usec // 1000000)
    zone = getattr(tm, "tm_zone", None)
    if not zone or tm.tm_year > 9999:
        raise Unsure("no zone name for a timestamp")
    return "%s %04d-%02d-%02d %02d:%02d:%02d %s" % (
        WEEKDAYS[tm.tm_wday],
        tm.tm_year,
        tm.tm_mon,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec,
        zone,
    )


def _text(value: str) -> str:
    if not value.isprintable():
        raise Unsure("a value with a control character")
    return value


def shown(name: str, sig: str, value: Any) -> str:
    """One property's value as ``systemctl show`` prints it (bus_print_property), for the types the probe reads."""
    if sig in ("s", "o"):
        return _text(value)
    if sig == "b":
        return "yes" if value else "no"
    if sig == "t" and name.endswith("Timestamp"):
        return timestamp(value)
    if sig in ("y", "n", "q", "i", "u", "x", "t"):
        return str(value)
    if sig == "as":
        if any(not _text(v) or " " in v for v in value):
            raise Unsure("an array item with a space")
        return " ".join(value)
    raise Unsure("%s: type %r" % (name, sig))


def _recv_line(sock: Any) -> bytes:
    got = b""
    while not got.endswith(b"\r\n"):
        chunk = sock.recv(512)
        if not chunk or len(got) > 4096:
            raise Unsure("the socket closed during authentication")
        got += chunk
    return got


def unit_properties(unit: str, names: tuple[str, ...], timeout: float = 5.0, path: str = PRIVATE) -> dict[str, str]:
    """``names`` of ``unit`` (a service) as ``systemctl show -p`` prints them, in the order of ``names``.
    Raises Unsure (or OSError) whenever the answer could differ from systemctl's: the caller runs systemctl then."""
    import _socket

    unknown = [n for n in names if n not in INTERFACE]
    if unknown:
        raise Unsure("no interface known for %s" % ", ".join(unknown))
    obj = object_path(unit)
    calls = b"".join(encode_call(k + 1, obj, PROPS_IFACE, "Get", (INTERFACE[n], n)) for k, n in enumerate(names))
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        uid = str(os.geteuid()).encode().hex()
        sock.sendall(b"\0AUTH EXTERNAL " + uid.encode() + b"\r\n")
        if not _recv_line(sock).startswith(b"OK "):
            raise Unsure("authentication refused")
        sock.sendall(b"BEGIN\r\n" + calls)
        answers: dict[int, tuple[str, Any]] = {}
        buf = b""
        deadline = time.monotonic() + timeout
        while len(answers) < len(names):
            while len(buf) < 16 or len(buf) < message_size(buf):
                if time.monotonic() > deadline or len(buf) > MAX_MESSAGE:
                    raise Unsure("no whole answer in time")
                chunk = sock.recv(65536)
                if not chunk:
                    raise Unsure("systemd closed the connection")
                buf += chunk
            size = message_size(buf)
            kind, fields, body = decode_message(buf[:size])
            buf = buf[size:]
            serial = fields.get(5)
            if kind == ERROR:
                raise Unsure("systemd answered %s" % fields.get(4, "an error"))
            if kind != METHOD_RETURN or not isinstance(serial, int) or not 1 <= serial <= len(names):
                continue  # a signal or something else not ours
            if len(body) != 1 or not isinstance(body[0], tuple):
                raise Unsure("an answer that is not one variant")
            answers[serial] = body[0]
    finally:
        sock.close()
    return {n: shown(n, *answers[k + 1]) for k, n in enumerate(names)}

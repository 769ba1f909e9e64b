"""The standard hostile set, per class (``VALUES``), and how each value is made for one case: a string on the command
line (``TEXT``), a node or a file of the option's kind made in the case's own folders (``make_path``), or the URL of
a server bound to 127.0.0.1 (``Servers``). Every node is made under the case's folder in pytest's temp dir; the
only things outside it a node may name are /dev/zero and /dev/null.

The secret-shaped values are new for every case (``Secrets``): a ``ghp_`` token, the password of an
``https://user:PASSWORD@host`` URL and the plain text of an Ansible-vault-encrypted value, so that one found in a
file says which case wrote it."""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.unit.security.test_hostile_bounds import deep, sweep

# Every (class, value) pair is thrown at some option of the class (plan.py); the names are the case ids' last part.
VALUES: dict[str, tuple[str, ...]] = {
    "path": (
        "fifo",
        "device",
        "zero_link",
        "outside_link",
        "dangling",
        "loop",
        "folder",
        "sparse",
        "deep",
        "digits",
        "nan",
        "controls",
        "secrets",
        "vault",
        "bidi_name",
        "ansi_name",
        "long_name",
    ),
    "place": (  # a project file: a node or a document there (its name is the project's)
        "fifo",
        "device",
        "zero_link",
        "outside_link",
        "dangling",
        "loop",
        "folder",
        "sparse",
        "deep",
        "digits",
        "nan",
        "controls",
        "secrets",
        "vault",
    ),
    "url": ("url_close", "url_trickle", "url_redirect", "url_creds", "ansi", "bidi", "long"),
    "number": ("digits", "nan", "inf", "neg_inf", "overflow", "ansi", "bidi", "blank", "long", "nul", "token"),
    "duration": ("digits", "digits_hours", "nan", "inf", "ansi", "blank", "long"),
    "string": ("bidi", "ansi", "nul", "blank", "long", "token", "url_creds", "vault_value"),
    "choice": ("bidi", "ansi", "blank", "long", "nul"),
    "flag": ("explicit_ansi", "explicit_bidi", "explicit_blank", "repeat"),
}

DEPTH = 100_000  # levels of a deeply nested document
DIGITS = "9" * 5000
SPARSE = 2 * 1024**3  # a 2 GiB sparse file: no block is written
ANSI = "\x1b[2J\x1b]0;owned\x07\x1b[31mred"
BIDI = "abc\u202edcba\u2066x"
BLANK = "\u3164\u3164\u115f"
# Raw in what a command prints, each would hide or fake text on a terminal: what must come out escaped.
INVISIBLE = ("\x1b", "\u202e", "\u2066", "\u3164", "\u115f", "\x00", "\x07")


@dataclass(frozen=True)
class Secrets:
    """The secret-shaped values of one case."""

    token: str  # ghp_…
    password: str  # of url
    vaulted: str  # the plain text of a vault-encrypted value
    host: str = "host"

    @classmethod
    def of(cls, seed: int, case: int) -> Secrets:
        def h(what: str, n: int) -> str:
            return hashlib.sha256(f"{seed}:{case}:{what}".encode()).hexdigest()[:n]

        return cls(token="ghp_" + h("ghp", 36), password="pw" + h("pw", 14), vaulted="vaultsecret" + h("v", 12))

    def url(self, host: str | None = None) -> str:
        return f"https://knobuser:{self.password}@{host or self.host}"

    @property
    def markers(self) -> tuple[str, ...]:
        return (self.token, self.password, self.vaulted)


MARKER_SHAPES = r"ghp_[0-9a-f]{36}|pw[0-9a-f]{14}|vaultsecret[0-9a-f]{12}"  # what Secrets.of makes

# Values given as they are on the command line (``url_creds`` and the URLs of ``Servers`` are made per case).
TEXT: dict[str, Callable[[Secrets], str]] = {
    "digits": lambda s: DIGITS,
    "digits_hours": lambda s: DIGITS + "h",
    "nan": lambda s: "NaN",
    "inf": lambda s: "Infinity",
    "neg_inf": lambda s: "-Infinity",
    "overflow": lambda s: "1e400",
    "ansi": lambda s: ANSI,
    "bidi": lambda s: BIDI,
    "blank": lambda s: BLANK,
    "long": lambda s: "A" * 100_000,
    "nul": lambda s: "a\x00b",
    "token": lambda s: s.token,
    "url_creds": lambda s: s.url(),
    "vault_value": lambda s: encrypted(s.vaulted),
}
# Flag values: the flag given an explicit value (``--json=…``), or given 1,000 times.
EXPLICIT = {"explicit_ansi": ANSI, "explicit_bidi": BIDI, "explicit_blank": BLANK}
REPEAT = 1000
# Values whose secret must not show in what the command prints either: a URL's password is redacted, a file's
# secret is never quoted. A secret typed as a plain option value may be echoed back to whoever typed it.
NEVER_SHOWN = {("url", "url_creds"), ("path", "secrets"), ("path", "vault"), ("place", "secrets"), ("place", "vault")}


VAULT_PASSWORD = "pw"


def encrypted(text: str) -> str:
    from tests.unit.security.test_vault_files import encrypted as vault_encrypted

    return vault_encrypted(text)  # with the password VAULT_PASSWORD


# --- files of each documented kind ------------------------------------------------------------------------------

SPACE = """\
schema_version: 1
name: {name}
base: mybase
knobs:
  SGLANG_SM120_MMA_TARGET_CTAS: [256, {n}]
{extra}traffic: {{48: 0.5, 64: {n}}}
budget: {{wall: 2h, host_minutes: 60}}
stages:
  model: {{keep: 4, margin: 0.10}}
  kernel: {{skip: "no GPU host"}}
  engine: {{host: gpu1, keep: 3}}
  live: {{hosts: 1}}
"""


def _yaml_str(text: str) -> str:
    """A YAML double-quoted scalar holding ``text`` (escapes for every control character)."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ch in "\u202e\u2066\u3164\u115f":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


CONTROLS = ANSI + BIDI + BLANK + "\x00\r\n"


@dataclass(frozen=True)
class Shape:
    """One document: ``n`` a number's raw text, ``s`` a string's, ``secret`` holds the case's secrets."""

    n: str = "1"
    s: str = "plain"
    secret: Secrets | None = None


def yaml_n(n: str) -> str:
    return {"NaN": ".nan", "Infinity": ".inf"}.get(n, n)


def profile_doc(sh: Shape) -> str:
    secret = (
        f"  SGLANG_UPSTREAM: {_yaml_str(sh.secret.token)}\n  SGLANG_MIRROR: {_yaml_str(sh.secret.url())}\n"
        if sh.secret
        else ""
    )
    return (
        "schema_version: 1\nname: mybase\nversion: 1\nengine: sglang\n"
        f"description: {_yaml_str(sh.s)}\nenv:\n  SGLANG_OPT_USE_MULTI_STREAM_OVERLAP: {yaml_n(sh.n)}\n{secret}"
        "args:\n  tp-size: 1\n"
    )


def overlay_doc(sh: Shape) -> str:
    secret = f"    default_url: {_yaml_str(sh.secret.url())}\n    note: {sh.secret.token}\n" if sh.secret else ""
    return (
        "engine: sglang\nknobs:\n  SGLANG_HOSTILE_KNOB:\n    type: int\n"
        f"    default: {yaml_n(sh.n)}\n    help: {_yaml_str(sh.s)}\n{secret}"
    )


def space_doc(sh: Shape) -> str:
    extra = f"  SGLANG_UPSTREAM: [{_yaml_str(sh.secret.token)}, {_yaml_str(sh.secret.url())}]\n" if sh.secret else ""
    return SPACE.format(name=_yaml_str(sh.s) if sh.s != "plain" else "seed", n=yaml_n(sh.n), extra=extra)


def record_doc(sh: Shape) -> str:
    import json

    from tests.unit.cli.test_bench_output import bench_doc

    doc = {"kind": "bench", **bench_doc()}
    doc["host"] = sh.s if sh.s != "plain" else "gpu1"
    if sh.secret:
        doc["profile"] = sh.secret.url()
        doc["runs"] = [[f"C48 {sh.secret.token}"]]
    text = json.dumps(doc)
    return text.replace('"mean": 2789.04', f'"mean": {sh.n}') if sh.n != "1" else text


def sweep_doc(sh: Shape) -> str:
    """A kernel bench sweep the fit can use (8 batch sizes x 3 launches, a time per token fitted); the
    first row's time is ``n``."""
    rows = []
    for b in (8, 16, 24, 32, 40, 48, 56, 64):
        for ctas, nsplit in ((256, 2), (512, 4), (1024, 8)):
            attn = 10.5 + b / 10 + nsplit
            shown = sh.n if not rows and sh.n != "1" else f"{attn:.2f}"
            rows.append(
                f'{{"batch": {b}, "heads": 16, "context": 4096, "block_h": 16, "target_ctas": {ctas}, '
                f'"nsplit": {nsplit}, "ctas": {ctas}, "attn_us": {shown}, "combine_us": 1.5, '
                f'"total_us": {attn + 1.5:.2f}}}'
            )
    text = sweep("[" + ", ".join(rows) + "]")
    if sh.s != "plain":
        text = text.replace('"name": "H200"', '"name": ' + _json_str(sh.s))
    if sh.secret:
        text = text.replace('"name": "H200"', '"name": ' + _json_str(sh.secret.token))
        text = text.replace('"check": {"ok": true}', '"check": {"ok": true, "url": ' + _json_str(sh.secret.url()) + "}")
    return text


def _json_str(text: str) -> str:
    import json

    return json.dumps(text)


def _host_env(sh: Shape) -> str:
    """A flow mapping of host env values: the case's secrets, or ``s``."""
    if sh.secret:
        return f"SGLANG_UPSTREAM: {_yaml_str(sh.secret.token)}, SGLANG_MIRROR: {_yaml_str(sh.secret.url())}"
    return f"SGLANG_NOTE: {_yaml_str(sh.s)}"


def inventory_doc(sh: Shape, address: str = "127.0.77.1", port: int = 1) -> str:
    env = _host_env(sh)
    return (
        "all:\n  hosts:\n    gpu1:\n"
        f"      ansible_host: {address}\n      ansible_port: {port}\n      ansible_user: root\n"
        "      knob_serve_service: sglang-decode\n"
        f"      knob_serve_port: {yaml_n(sh.n) if sh.n != '1' else port}\n"
        f"      knob_serve_host_env: {{{env}}}\n"
    )


def vault_doc(sh: Shape) -> str:
    """A vault password file: its whole content is the password."""
    if sh.secret:
        return sh.secret.token + "\n"
    return (sh.n if sh.n != "1" else sh.s if sh.s != "plain" else VAULT_PASSWORD) + "\n"


def vars_doc(sh: Shape) -> str:
    """A group_vars file."""
    env = _host_env(sh)
    return f"knob_serve_readiness_timeout_s: {yaml_n(sh.n)}\nknob_serve_host_env: {{{env}}}\n"


def json_doc(sh: Shape) -> str:
    text = '{"value": ' + sh.n + ', "text": ' + _json_str(sh.s)
    if sh.secret:
        text += ', "token": ' + _json_str(sh.secret.token) + ', "url": ' + _json_str(sh.secret.url())
    return text + "}"


@dataclass(frozen=True)
class Kind:
    ext: str
    doc: Callable[[Shape], str]


KIND: dict[str, Kind] = {
    "profile": Kind(".yaml", profile_doc),
    "overlay": Kind(".yaml", overlay_doc),
    "space": Kind(".yaml", space_doc),
    "record": Kind(".json", record_doc),
    "sweep": Kind(".json", sweep_doc),
    "inventory": Kind(".yml", inventory_doc),
    "vault": Kind(".pw", vault_doc),
    "vars": Kind(".yml", vars_doc),
    "calibrations": Kind(".json", json_doc),
    "html": Kind(".html", lambda sh: "<p>" + sh.s + "</p>"),
    "prom": Kind(".prom", lambda sh: "# " + sh.s + "\n"),
    "folder": Kind("", json_doc),
    "program": Kind("", lambda sh: "#!/bin/sh\nexit 1\n"),
    "json": Kind(".json", json_doc),
}

CONTENT: dict[str, Callable[[Secrets], Shape]] = {
    "digits": lambda s: Shape(n=DIGITS),
    "nan": lambda s: Shape(n="NaN"),
    "controls": lambda s: Shape(s=CONTROLS),
    "secrets": lambda s: Shape(secret=s),
}


@dataclass
class Made:
    """A hostile path made for one case: the value to give, and the environment it needs."""

    value: str
    env: dict[str, str] = field(default_factory=dict)


def make_path(name: str, kind: str, target: Path, outside: Path, secrets: Secrets, shared: Path) -> Made:
    """Make the hostile path ``name`` at ``target`` (its folder exists) for a path of ``kind``; ``outside`` is a
    folder of the case out of the project. The value to give is the path made, relative to ``target``'s folder."""
    k = KIND.get(kind, KIND["json"])
    where, p = target.parent, target
    benign = k.doc(Shape())
    if name == "fifo":
        os.mkfifo(p)
    elif name == "device":
        try:  # a character device like /dev/null, made here; where mknod is not allowed, a link to /dev/null
            os.mknod(p, stat.S_IFCHR | 0o600, os.makedev(1, 3))
        except OSError:
            os.symlink("/dev/null", p)
    elif name == "zero_link":
        os.symlink("/dev/zero", p)
    elif name == "outside_link":
        out = outside / ("target" + k.ext)
        if kind == "folder":
            out.mkdir()
        else:
            out.write_text(benign)
        os.symlink(out, p)
    elif name == "dangling":
        os.symlink(outside / ("missing" + k.ext), p)
    elif name == "loop":
        other = where / f"loop-{p.name}"
        os.symlink(other, p)
        os.symlink(p, other)
    elif name == "folder":
        p.mkdir()
        (p / f"inside{k.ext}").write_text(benign)
    elif name == "sparse":
        with p.open("wb") as fh:
            fh.truncate(SPARSE)
    elif name == "deep":
        p.write_bytes(deep(DEPTH))
    elif name in CONTENT:
        p.write_text(k.doc(CONTENT[name](secrets)))
    elif name == "vault":
        env = {"ANSIBLE_VAULT_PASSWORD_FILE": str(shared / "vault.pw")}
        if kind == "inventory" and p.suffix != ".yml":  # the usual layout: the host's env in group_vars/all/vault.yml
            (p / "group_vars" / "all").mkdir(parents=True)
            (p / "hosts.yml").write_text(inventory_doc(Shape()))
            (p / "group_vars" / "all" / "vault.yml").write_text(
                encrypted(f"knob_serve_host_env:\n  SGLANG_UPSTREAM: {secrets.vaulted}\n")
            )
        else:  # the whole file encrypted, its plain text holding the case's vault secret
            p.write_text(encrypted(k.doc(Shape(s=secrets.vaulted))))
        return Made(p.name, env)
    elif name in ("bidi_name", "ansi_name"):  # a file there, named with the characters a terminal must not get raw
        p = where / (("prof" + BIDI if name == "bidi_name" else "prof" + ANSI) + k.ext)
        if kind == "folder":
            p.mkdir()
        elif kind not in ("html", "prom", "calibrations"):  # an output: a new path of that name
            p.write_text(benign)
        return Made(p.name)
    elif name == "long_name":
        return Made("a" * 100_000 + k.ext)
    else:
        raise KeyError(name)
    return Made(p.name)


# --- servers on 127.0.0.1 ----------------------------------------------------------------------------------------

REDIRECT_TARGET = "http://192.0.2.1:9/api/v1/query"  # TEST-NET-1: never to be connected to (the driver blocks it)


class Servers:
    """Three servers bound to 127.0.0.1, each answering every connection in a thread of its own: ``close`` closes
    it at once, ``trickle`` answers a 100,000-byte body one byte a second, ``redirect`` answers 302 to a
    non-loopback address. ``closed`` is a port nothing listens on."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._socks: list[socket.socket] = []
        self.hits: dict[str, int] = {"close": 0, "trickle": 0, "redirect": 0}
        self.close = self._serve("close", self._close)
        self.trickle = self._serve("trickle", self._trickle)
        self.redirect = self._serve("redirect", self._redirect)
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.closed = f"http://127.0.0.1:{s.getsockname()[1]}"
        s.close()

    def _serve(self, name: str, answer: Callable[[socket.socket], None]) -> str:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        listener.settimeout(0.2)
        self._socks.append(listener)

        def one(conn: socket.socket) -> None:
            with conn:
                conn.settimeout(5)
                with contextlib.suppress(OSError):
                    answer(conn)

        def loop() -> None:
            while not self._stop.is_set():
                try:
                    conn, _ = listener.accept()
                except OSError:
                    continue
                self.hits[name] += 1
                threading.Thread(target=one, args=(conn,), daemon=True).start()

        threading.Thread(target=loop, daemon=True).start()
        return f"http://127.0.0.1:{listener.getsockname()[1]}"

    def _close(self, conn: socket.socket) -> None:
        pass  # closed by ``one`` before anything is read or sent

    def _trickle(self, conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
        while not self._stop.is_set():
            conn.sendall(b"{")
            time.sleep(1.0)

    def _redirect(self, conn: socket.socket) -> None:
        conn.recv(65536)
        head = f"HTTP/1.1 302 Found\r\nLocation: {REDIRECT_TARGET}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        conn.sendall(head.encode())

    def url(self, name: str, secrets: Secrets) -> str:
        return {
            "url_close": self.close,
            "url_trickle": self.trickle,
            "url_redirect": self.redirect,
            "url_creds": secrets.url(self.closed.removeprefix("http://")).replace("https://", "http://"),
        }[name]

    def stop(self) -> None:
        self._stop.set()
        for s in self._socks:
            s.close()

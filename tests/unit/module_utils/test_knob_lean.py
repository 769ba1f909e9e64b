"""knob_lean: json's, hashlib's, hmac's and socket's answers without their imports. Each twin is held equal to the
standard-library function it stands for (property tests), and the probe's whole import chain is held free of the
modules they replace (a fresh ``python3 -I -S``, as a host runs it)."""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knobfleet import paths
from knobfleet.fleet.transports.base import bundle
from knobfleet.fleet.transports.probecache import boot_text
from knobfleet.module_utils import knob_lean

UTILS = paths.module_utils_dir()
PROBE = Path(__file__).resolve().parents[3] / "roles" / "knob_probe" / "library" / "knob_probe.py"
# The probe's module_utils in the order its bundle registers them (each after the ones it imports): the fast path's
# own list (transports/base.bundle), so a file split out of one of them is loaded here as on a host.
PROBE_UTILS = tuple(n for n, _text in json.loads(bundle(PROBE.read_bytes(), UTILS))["utils"])
# Under `make mutation` the module_utils carry mutmut's trampolines, which import mutmut: a fresh `python3 -I -S`
# cannot load them. The tests that run them there say so instead of failing the mutation run's clean pass.
fresh_interpreter = pytest.mark.skipif(
    any("mutmut" in (UTILS / f"{n}.py").read_text() for n in PROBE_UTILS),
    reason="module_utils are mutmut-instrumented (a mutation run): a fresh interpreter cannot load them",
)

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text()
trees = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
)


def same(a: Any, b: Any) -> bool:
    """Equal, NaN included, and of the same types all the way down."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


@given(trees)
@settings(max_examples=300)
def test_dumps_is_json_dumps_and_loads_reads_it_back(tree: Any) -> None:
    text = knob_lean.dumps(tree)
    assert text == json.dumps(tree)
    assert same(knob_lean.loads(text), json.loads(text))
    assert same(knob_lean.loads(text.encode()), json.loads(text.encode()))


@given(st.text(max_size=40) | st.binary(max_size=40).map(lambda b: b.decode("latin-1")))
@settings(max_examples=400)
def test_loads_of_any_text_is_json_loads_or_its_very_error(text: str) -> None:
    for given_ in (text, text.encode("utf-8", "surrogatepass")):
        try:
            want: Any = json.loads(given_)
        except ValueError as exc:
            with pytest.raises(type(exc)) as got:
                knob_lean.loads(given_)
            assert str(got.value) == str(exc)
        else:
            assert same(knob_lean.loads(given_), want)


@pytest.mark.parametrize(
    "raw",
    [
        b'\xef\xbb\xbf{"a": 1}',  # a UTF-8 BOM: json detects utf-8-sig
        '{"a": 1}'.encode("utf-16"),
        '{"a": 1}'.encode("utf-32-le"),
        b' \t\n{"a": [1, 2.5, "x", null, true]} \r\n',
        b"NaN",
        b"[Infinity, -Infinity]",
        b'{"a": 1} x',
        b"",
        b'"\\ud800"',
    ],
)
def test_loads_takes_bytes_as_json_does(raw: bytes) -> None:
    try:
        want: Any = json.loads(raw)
    except ValueError as exc:
        with pytest.raises(ValueError, match=None) as got:
            knob_lean.loads(raw)
        assert str(got.value) == str(exc)
    else:
        assert same(knob_lean.loads(raw), want)


def test_dumps_refuses_what_json_refuses_with_its_message() -> None:
    with pytest.raises(TypeError, match="Object of type set is not JSON serializable"):
        knob_lean.dumps({"a": {1}})
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference detected"):
        knob_lean.dumps(loop)


@given(st.binary(max_size=300), st.binary(max_size=100))
def test_sha256_and_hmac_are_hashlibs_and_hmacs(key: bytes, data: bytes) -> None:
    assert knob_lean.sha256(data).hexdigest() == hashlib.sha256(data).hexdigest()
    assert knob_lean.hmac_sha256(key, data) == hmac.new(key, data, hashlib.sha256).hexdigest()


def test_connect_reaches_a_loopback_listener_and_says_why_it_could_not() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        accepted: list[bytes] = []

        def serve() -> None:
            conn, _ = server.accept()
            with conn:
                accepted.append(conn.recv(16))

        t = threading.Thread(target=serve)
        t.start()
        sock = knob_lean.connect("127.0.0.1", port, 5.0)
        try:
            sock.sendall(b"ping")
        finally:
            sock.close()
        t.join(5)
        assert accepted == [b"ping"]
    with pytest.raises(ConnectionRefusedError):
        knob_lean.connect("127.0.0.1", port, 5.0)  # the listener is closed


HEAVY = (
    *("re", "json", "hashlib", "hmac", "socket", "typing", "enum", "functools", "collections", "urllib"),
    *("encodings.idna", "unicodedata"),  # getaddrinfo of a str host runs the idna codec
)

IMPORTS_OF = """
import sys, types
for name in {utils}:
    m = types.ModuleType("ansible.module_utils." + name)
    sys.modules[m.__name__] = m
    path = sys.argv[1] + "/" + name + ".py"
    exec(compile(open(path).read(), path, "exec"), m.__dict__)
lean, redact = sys.modules["ansible.module_utils.knob_lean"], sys.modules["ansible.module_utils.knob_redact"]
try:  # the hot path's calls: a loopback connection (refused or not), a secret check, a digest, JSON both ways
    lean.connect("127.0.0.1", 9, 1.0).close()
except OSError:
    pass
redact.redact_env({"apiKey": "x", "PATH": "/bin"}, ("VLLM_API_KEY",), "k")
lean.loads(lean.dumps({"a": [1.5, None]}))
lean.sha256(b"x").hexdigest()
print(" ".join(sorted(n for n in sys.modules if n in {heavy})))
""".replace("{heavy}", repr(set(HEAVY))).replace("{utils}", repr(PROBE_UTILS))


@fresh_interpreter
def test_the_probe_imports_none_of_the_heavy_modules_on_a_host() -> None:
    """What a host's ``python3 -I -S`` loads for the probe's module_utils (as the bundle registers them) and the
    bootstrap: none of the modules knob_lean stands in for. Each costs a probe milliseconds of host CPU."""
    got = subprocess.run(
        [sys.executable, "-I", "-S", "-c", IMPORTS_OF, str(UTILS)], capture_output=True, text=True, check=True
    )
    assert got.stdout.split() == [], f"the probe's module_utils import {got.stdout.strip()}"
    boot = boot_text() + f"\nprint(' '.join(sorted(n for n in sys.modules if n in {set(HEAVY)!r})))\n"
    boot = boot.replace('if __name__ == "__main__":\n    sys.exit(main(sys.argv[1:]))', "")
    got = subprocess.run([sys.executable, "-I", "-S", "-c", boot], capture_output=True, text=True, check=True)
    assert got.stdout.split() == [], f"the probe's bootstrap imports {got.stdout.strip()}"


FRESH_ERRORS = """
import sys, types
m = types.ModuleType("knob_lean")
exec(compile(open(sys.argv[1]).read(), sys.argv[1], "exec"), m.__dict__)
for text in ("{bad", "[1, 2", '{"a": 1} x', "", "\\ufeff{}", '"\\\\x"', "nul"):
    try:
        print(repr(m.loads(text)))
    except ValueError as exc:
        print(type(exc).__name__, exc)
"""


@fresh_interpreter
def test_a_syntax_error_in_a_fresh_interpreter_is_jsons_own() -> None:
    """On a host json is not loaded when the probe parses a damaged meta.json; CPython's scanner then cannot build
    its JSONDecodeError (it looks json.decoder up in sys.modules only) and raised SystemError: a probe that failed
    on a corrupt generation instead of reporting it (caught by the lab's transaction tests)."""
    got = subprocess.run(
        [sys.executable, "-I", "-S", "-c", FRESH_ERRORS, str(UTILS / "knob_lean.py")],
        capture_output=True,
        text=True,
        check=True,
    )
    want = []
    for text in ("{bad", "[1, 2", '{"a": 1} x', "", "\ufeff{}", '"\\x"', "nul"):
        try:
            want.append(repr(json.loads(text)))
        except ValueError as exc:
            want.append(f"{type(exc).__name__} {exc}")
    assert got.stdout.splitlines() == want

"""What the probe needs from ``json``, ``hashlib`` and ``socket``, from the C modules under them.

The probe starts a fresh interpreter on every host for every ``drift``. Importing ``json`` pulls in ``re`` (and
``enum``, ``functools``, ``collections``), ``hashlib`` loads OpenSSL and ``socket`` builds its enums: about 20 ms
of host CPU per probe before it reads a byte (docs/PERFORMANCE.md). The C modules those wrap (``_json``,
``_sha256``/``_sha2``, ``_socket``) load in well under a millisecond.

Each function gives what its standard-library twin gives: ``loads`` and ``dumps`` run the very C scanner and
encoder ``json`` runs with its default settings, and hand anything they do not take on exactly (an error, an
unusual encoding, an interpreter without ``_json``) to ``json`` itself, so the result or the exception is
``json``'s own. Standard library only; safe to import on any host python (3.8+). Sent ahead of the probe's
bootstrap as text (fleet/transports/probecache.boot_text) and shipped as a module_utils file with the modules.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only (never evaluated: ``from __future__ import annotations``)
    from typing import Any

_INF = float("inf")


class _Decoding:
    """The settings ``json.JSONDecoder()`` hands its C scanner."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": -_INF, "Infinity": _INF, "NaN": _INF - _INF}.__getitem__


_scan: Any = None
_encode: Any = None


def _json_default(o: Any) -> Any:
    raise TypeError("Object of type %s is not JSON serializable" % o.__class__.__name__)


def loads(s: str | bytes) -> Any:
    """``json.loads(s)``."""
    global _scan
    try:
        if isinstance(s, bytes):
            if s[:1] in (b"\xef", b"\xfe", b"\xff") or b"\x00" in s[:4]:
                raise ValueError("not plain UTF-8")  # a BOM or UTF-16/32: json detects the encoding
            s = s.decode("utf-8", "surrogatepass")
        if _scan is None:
            import _json

            _scan = _json.make_scanner(_Decoding())  # type: ignore[arg-type]
        end, n = 0, len(s)
        while end < n and s[end] in " \t\n\r":
            end += 1
        obj, end = _scan(s, end)
        while end < n and s[end] in " \t\n\r":
            end += 1
        if end != n:
            raise ValueError("extra data")
        return obj
    except (ValueError, StopIteration, ImportError, TypeError, AttributeError, RecursionError, SystemError):
        # SystemError: CPython's scanner reports a syntax error through json.decoder's JSONDecodeError, which it
        # looks up in sys.modules without importing it; with json not loaded yet it fails "without setting an
        # exception". json.loads then gives the error json gives.
        import json

        return json.loads(s)  # json's own answer, or its own exception


def dumps(obj: Any) -> str:
    """``json.dumps(obj)``."""
    global _encode
    try:
        if _encode is None:
            import _json

            _encode = _json.make_encoder  # called as json.JSONEncoder.iterencode calls it
        chunks = _encode({}, _json_default, _encode_str(), None, ": ", ", ", False, False, True)(obj, 0)
        return "".join(chunks)
    except (ValueError, TypeError, ImportError, AttributeError, RecursionError, OverflowError):
        import json

        return json.dumps(obj)


def _encode_str() -> Any:
    import _json

    return _json.encode_basestring_ascii


def sha256(data: bytes = b"") -> Any:
    """A sha256 object: the interpreter's built-in one where it has it (no ``hashlib``, which loads OpenSSL: ~5 ms
    of every probe), else hashlib's. Both give the same digest."""
    impl = _SHA256[0]
    if impl is None:
        try:
            from _sha2 import sha256 as impl  # type: ignore[import-not-found,no-redef,unused-ignore]  # Python 3.12+
        except ImportError:
            try:
                from _sha256 import sha256 as impl  # type: ignore[import-not-found,no-redef,unused-ignore]  # 3.11
            except ImportError:
                from hashlib import sha256 as impl
        _SHA256[0] = impl  # found once: a failed import is not cached, and Python 3.11 has no _sha2
    return impl(data)


_SHA256: list[Any] = [None]


def hmac_sha256(key: bytes, data: bytes) -> str:
    """HMAC-SHA256 (RFC 2104) as hex: the digest ``hmac.new(key, data, hashlib.sha256).hexdigest()`` gives, over
    ``sha256`` above (``hmac`` imports hashlib)."""
    if len(key) > 64:
        key = sha256(key).digest()
    key = key.ljust(64, b"\0")
    inner = sha256(bytes(k ^ 0x36 for k in key) + data).digest()
    return str(sha256(bytes(k ^ 0x5C for k in key) + inner).hexdigest())


def connect(address: str, port: int, timeout: float) -> Any:
    """``socket.create_connection((address, port), timeout)`` over ``_socket``: each address ``getaddrinfo``
    gives, in order, until one connects; the last error otherwise. The caller closes it."""
    import _socket

    error: OSError | None = None
    # an ASCII host as bytes: a str goes through the "idna" codec, whose import pulls in re and unicodedata
    host: str | bytes = address.encode("ascii") if address.isascii() else address
    for family, kind, proto, _name, where in _socket.getaddrinfo(host, port, 0, _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(where)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    raise error if error is not None else OSError("getaddrinfo returns an empty list")

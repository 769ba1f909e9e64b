"""The engine's HTTP endpoints as the probe reads them: health and info by a bounded GET (a loopback ``http://``
URL over a plain socket, anything else through urllib), and the liveness witness (a one-token completion).
Standard library only; no ``urllib``, ``json`` or ``socket`` import on the probe's hot path (knob_lean's twins).
Part of the probe (knob_observe); callers import these names from here: the controller as
``knobfleet.module_utils.knob_http``, the roles' modules as ``ansible.module_utils.knob_http``.
"""

from __future__ import annotations

import os
import sys
import time

from .knob_lean import connect, dumps, loads

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: ``typing`` would cost every probe ~5 ms
    from typing import Any

MAX_BODY = 1 << 20
REDIRECTS = (301, 302, 303, 307, 308)


def http_get(url: str, timeout: float) -> tuple[int | None, bytes | None]:
    """The status of a GET of ``url`` and, for a 2xx, its body (1 MiB at most); (None, None) when it got no answer.
    A loopback ``http://`` URL is read over a plain socket (``loopback_get``: no urllib import on the probe's hot
    path); everything else, and any answer that one does not handle exactly as urllib would, goes through urllib
    (redirects, proxies)."""
    if not url:
        return None, None
    fast = loopback_get(url, timeout)
    return fast if fast is not None else urllib_get(url, timeout)


def urllib_get(url: str, timeout: float) -> tuple[int | None, bytes | None]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status), resp.read(MAX_BODY)
    except urllib.error.HTTPError as exc:
        return int(exc.code), None
    except (urllib.error.URLError, OSError, ValueError):
        return None, None


def loopback_target(url: str) -> tuple[str, int, str, str] | None:
    """(address, port, Host header, request target) of a plain ``http://`` URL to a loopback address that urllib
    would fetch directly (no ``*_proxy`` variable set); None for anything else."""
    if not url.startswith("http://") or not url.isascii() or any(c in url for c in " \t\r\n@"):
        return None
    if any(k.lower().endswith("_proxy") and v for k, v in os.environ.items()):
        return None  # urllib would consult the proxy settings
    netloc, slash, rest = url[len("http://") :].partition("/")
    target = (slash + rest).split("#", 1)[0] or "/"
    if not target.startswith("/"):
        target = "/" + target
    host, colon, port_s = netloc.rpartition(":") if netloc.count(":") == 1 else (netloc, "", "")
    if not colon:
        host, port_s = netloc, "80"
    if not port_s.isdigit() or not 0 < int(port_s) < 65536:
        return None
    parts = host.split(".")
    if host == "localhost":
        address = host  # resolved as urllib would
    elif len(parts) == 4 and parts[0] == "127" and all(p.isdigit() and int(p) < 256 for p in parts):
        address = host
    else:
        return None
    return address, int(port_s), netloc, target


def loopback_get(url: str, timeout: float) -> tuple[int | None, bytes | None] | None:
    """``http_get`` of a loopback URL over a socket with the request urllib sends (HTTP/1.1, ``Connection:
    close``); None where urllib would do more or differently (a redirect, a status line or framing it would treat
    otherwise, a URL it parses itself)."""
    where = loopback_target(url)
    if where is None:
        return None
    address, port, host, target = where
    request = (
        "GET %s HTTP/1.1\r\nAccept-Encoding: identity\r\nHost: %s\r\nUser-Agent: Python-urllib/%d.%d\r\n"
        "Connection: close\r\n\r\n" % (target, host, sys.version_info[0], sys.version_info[1])
    ).encode("ascii")
    try:
        sock = connect(address, port, timeout)
        try:
            sock.sendall(request)
            raw = b""
            while b"\r\n\r\n" not in raw:
                chunk = sock.recv(65536)
                if not chunk or len(raw) > 65536:
                    return None  # no complete head: let urllib say what that is
                raw += chunk
            head, _, body = raw.partition(b"\r\n\r\n")
            lines = head.decode("iso-8859-1").split("\r\n")
            version, _, rest = lines[0].partition(" ")
            code = rest[:3]
            if version not in ("HTTP/1.0", "HTTP/1.1") or not code.isdigit() or rest[3:4] not in ("", " "):
                return None
            status = int(code)
            if status < 200 or status in REDIRECTS:
                return None
            if status >= 300:
                return status, None
            headers = {}
            for line in lines[1:]:
                name, colon, value = line.partition(":")
                if not colon:
                    return None
                headers[name.strip().lower()] = value.strip()
            if headers.get("transfer-encoding", "identity").lower() != "identity":
                return None  # chunked (or anything else): urllib decodes it
            length = headers.get("content-length")
            if length is not None and not length.isdigit():
                return None
            want = min(int(length), MAX_BODY) if length is not None else MAX_BODY
            while len(body) < want:
                chunk = sock.recv(min(65536, want - len(body)))
                if not chunk:
                    if length is not None:
                        return None  # cut short: urllib raises IncompleteRead there
                    break
                body += chunk
            return status, body[:want]
        finally:
            sock.close()
    except OSError:
        return None, None


def liveness(url: str, timeout: float) -> dict[str, Any]:
    """A liveness witness for an engine whose health check does not generate (vLLM's /health stays 200 while a
    stopped worker hangs every request): one bounded one-token completion at ``url`` (an OpenAI
    ``/v1/completions``), for the first model ``/v1/models`` lists. ``status`` 200 when it finished in time."""
    started = time.time()
    base = url.split("/v1/", 1)[0]
    model = None
    status, raw = http_get(base + "/v1/models", timeout)
    if status == 200 and raw:
        try:
            model = loads(raw)["data"][0]["id"]
        except (ValueError, KeyError, IndexError, TypeError):
            model = None
    body = dumps({"model": model, "prompt": "ping", "max_tokens": 1, "temperature": 0}).encode()
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read(1 << 16)
            got: int | None = int(resp.status)
    except urllib.error.HTTPError as exc:
        got = int(exc.code)
    except (urllib.error.URLError, OSError, ValueError):
        got = None
    return {"url": url, "status": got, "timeout_s": timeout, "seconds": round(time.time() - started, 3)}

"""A small client of Prometheus's HTTP API (``/api/v1/query``, ``/api/v1/alerts``, ``/-/ready``).

Every failure is one line naming the Prometheus URL and what to do: unreachable, an HTTP error, a PromQL error,
an answer of the wrong shape. Standard library only; the URL is the operator's (the lab's is on loopback).

- Only ``http://`` and ``https://`` URLs are opened (never ``file:`` or another urllib scheme).
- Credentials in the URL's userinfo are sent as HTTP basic auth and never shown: every message names the URL
  as ``http://***@host:port``.
- Each request has one deadline for the whole exchange (connect, headers, body), not a timeout per socket read,
  so a server that trickles its answer a byte at a time cannot hold a canary or ``load-profile`` past it.
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from knobfleet.errors import KnobfleetError

MAX_BODY = 32 * 1024 * 1024
CHUNK = 64 * 1024
# No proxy, whatever http_proxy says: Prometheus is the operator's own server (the lab's is on loopback); the
# client speaks HTTP itself (http.client), so no proxy variable is ever read.


def series(name: str, matchers: str = "") -> str:
    """A PromQL selector of metric ``name`` in either spelling Prometheus may have stored it under.

    Engines name their metrics with colons (``sglang:num_running_reqs``); prometheus_client 0.2x answers a scrape
    that asks for OpenMetrics 1.0 (Prometheus's default Accept) with ``escaping=underscores`` and every colon turned
    into ``_`` (seen with real SGLang 0.5.23 under Prometheus 2.42: ``sglang_num_running_reqs``), while a plain-text
    scrape keeps the colons. ``matchers``: more label matchers, e.g. ``host=~"lab1|lab2"``. Pure."""
    escaped = name.replace(":", "_")
    if escaped == name:
        return f"{name}{{{matchers}}}" if matchers else name
    both = f'__name__=~"{name}|{escaped}"'
    return f"{{{both}, {matchers}}}" if matchers else f"{{{both}}}"


class PromError(KnobfleetError):
    """Prometheus could not answer the question."""


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class Alert:
    name: str
    state: str  # pending | firing
    labels: dict[str, str]


def redacted(url: str) -> str:
    """``url`` with any userinfo (user:password@) shown as ``***@``: all before the last ``@`` but the scheme, so a
    password typed with a ``/``, ``?``, ``#`` or ``@`` in it (which ends the URL's host part early) is hidden too."""
    if "@" in url:
        scheme, sep, _rest = url.partition("://")
        keep = scheme + sep if sep and "@" not in scheme else ""
        return f"{keep}***@{url.rsplit('@', 1)[1]}"
    try:
        urllib.parse.urlsplit(url)
    except ValueError:
        return "<an unparsable URL>"
    return url


def said(value: object) -> str:
    """What the server said, for a one-line message: its whitespace (newlines included) folded, at most 200
    characters."""
    return " ".join(str(value).split())[:200]


class Prometheus:
    def __init__(self, url: str, timeout_s: float = 6.0) -> None:  # the whole request (issue 40: no hang over 10 s)
        self.url = redacted(url.rstrip("/"))  # what every message shows
        self.timeout_s = timeout_s
        try:
            parts = urllib.parse.urlsplit(url.rstrip("/"))
            port = parts.port
        except ValueError:
            raise PromError(f"{self.url}: not a URL; pass --prometheus http://HOST:PORT") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PromError(
                f"{self.url}: Prometheus is reached over http:// or https:// only; pass --prometheus http://HOST:PORT"
            )
        self._scheme, self._host, self._port = parts.scheme, parts.hostname, port
        self._base = parts.path.rstrip("/")
        self._auth = None
        if parts.username is not None:
            cred = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
            try:  # bytes a shell passed through undecoded come back as they were typed (surrogateescape)
                raw = cred.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:
                raise PromError(
                    f"{self.url}: the user name or password is not text that can be sent (a lone surrogate "
                    "character); type it again, or percent-encode it"
                ) from None
            self._auth = "Basic " + base64.b64encode(raw).decode("ascii")

    def _exchange(self, target: str, deadline: float) -> tuple[int, bytes]:
        """(status, body) of one GET, the whole of it within ``deadline`` (monotonic); raises OSError/TimeoutError."""
        from knobfleet.deadline_http import exchange

        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        netloc = f"[{self._host}]" if ":" in str(self._host) else str(self._host)
        url = f"{self._scheme}://{netloc}:{self._port}{target}"
        headers = {"Authorization": self._auth} if self._auth else {}
        return exchange(url, "GET", None, headers, left, max_body=MAX_BODY + 1)

    def _get(self, path: str, params: dict[str, str] | None = None) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            status, body = self._exchange(f"{self._base}{path}{query}", time.monotonic() + self.timeout_s)
        except TimeoutError:
            raise PromError(
                f"{self.url}{path}: no complete answer within {self.timeout_s:g}s; check Prometheus or pass "
                "--prometheus URL"
            ) from None
        except (OSError, http.client.HTTPException, ValueError) as exc:
            reason = getattr(exc, "strerror", None) or type(exc).__name__
            raise PromError(
                f"{self.url}: Prometheus unreachable ({reason}); start it (`knobfleet lab up --monitoring` in the "
                "lab) or pass --prometheus URL"
            ) from None
        if len(body) > MAX_BODY:
            raise PromError(f"{self.url}{path}: answer larger than {MAX_BODY} bytes; narrow the query")
        if status >= 400:
            detail = ""
            try:
                doc = json.loads(body[:65536] or b"{}")
                detail = said(doc.get("error", "")) if isinstance(doc, dict) else ""
            except (ValueError, RecursionError):
                detail = ""
            raise PromError(f"{self.url}{path}: HTTP {status}{': ' + detail if detail else ''}")
        return body

    def ready(self) -> bool:
        try:
            self._get("/-/ready")
        except PromError:
            return False
        return True

    def _api(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        try:
            doc = json.loads(self._get(path, params))
        except (ValueError, RecursionError):
            raise PromError(f"{self.url}{path}: not a Prometheus API answer (invalid JSON)") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            why = doc.get("error", "failed") if isinstance(doc, dict) else "not a Prometheus API answer (not an object)"
            raise PromError(f"{self.url}{path}: {said(why)}")
        data = doc.get("data")
        if not isinstance(data, dict):
            raise PromError(f"{self.url}{path}: not a Prometheus API answer (no data object)")
        return data

    def _shape(self, path: str) -> PromError:
        return PromError(f"{self.url}{path}: not a Prometheus API answer (unexpected shape)")

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        """An instant vector (or scalar) at ``at`` (default: now)."""
        params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
        data = self._api("/api/v1/query", params)
        kind, result = data.get("resultType"), data.get("result")
        try:
            if kind == "scalar":
                return [Sample({}, float(result[1]))]  # type: ignore[index]
            if kind != "vector":
                raise PromError(f"{self.url}: query {expr!r} gave a {said(kind)}, expected an instant vector")
            return [Sample({str(k): str(v) for k, v in r.get("metric", {}).items()}, float(r["value"][1]))
                    for r in result]  # type: ignore[union-attr]  # fmt: skip
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            raise self._shape("/api/v1/query") from None

    def query_range(
        self, expr: str, start: float, end: float, step_s: float
    ) -> list[tuple[dict[str, str], list[float]]]:
        """Each series of a range query with its values (timestamps dropped: the step is fixed)."""
        if not all(math.isfinite(x) for x in (start, end, step_s)) or step_s <= 0:
            raise PromError(f"{self.url}: range query with start {start}, end {end}, step {step_s}: not finite")
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"}
        data = self._api("/api/v1/query_range", params)
        kind = data.get("resultType")
        if kind != "matrix":
            raise PromError(f"{self.url}: range query {expr!r} gave a {said(kind)}, expected a matrix")
        try:
            return [(dict(r.get("metric", {})), [float(v[1]) for v in r.get("values", [])]) for r in data["result"]]
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            raise self._shape("/api/v1/query_range") from None

    def alerts(self) -> list[Alert]:
        data = self._api("/api/v1/alerts")
        try:
            return [
                Alert(str(a["labels"].get("alertname", "")), str(a.get("state", "")), dict(a["labels"]))
                for a in data.get("alerts", [])
            ]
        except (KeyError, TypeError, AttributeError, ValueError):
            raise self._shape("/api/v1/alerts") from None

"""A small client of Prometheus's HTTP API (``/api/v1/query``, ``/api/v1/alerts``, ``/-/ready``).

Every failure is one line naming the Prometheus URL and what to do: unreachable, an HTTP error, a PromQL error.
Standard library only; the URL is the operator's (the lab's is on loopback).
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from knobfleet.errors import KnobfleetError

MAX_BODY = 32 * 1024 * 1024
# No proxy, whatever http_proxy says: Prometheus is the operator's own server (the lab's is on loopback).
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


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


class Prometheus:
    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def _get(self, path: str, params: dict[str, str] | None = None) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with _OPENER.open(f"{self.url}{path}{query}", timeout=self.timeout_s) as resp:
                body = resp.read(MAX_BODY + 1)
        except urllib.error.HTTPError as exc:
            detail = ""
            with contextlib.suppress(ValueError, OSError, AttributeError):
                detail = str(json.loads(exc.read(65536) or b"{}").get("error", ""))
            raise PromError(f"{self.url}{path}: HTTP {exc.code}{': ' + detail if detail else ''}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise PromError(
                f"{self.url}: Prometheus unreachable ({reason}); start it (`knobfleet lab up --monitoring` in the "
                "lab) or pass --prometheus URL"
            ) from None
        if len(body) > MAX_BODY:
            raise PromError(f"{self.url}{path}: answer larger than {MAX_BODY} bytes; narrow the query")
        return body

    def ready(self) -> bool:
        try:
            self._get("/-/ready")
        except PromError:
            return False
        return True

    def _api(self, path: str, params: dict[str, str] | None = None) -> Any:
        try:
            doc = json.loads(self._get(path, params))
        except ValueError:
            raise PromError(f"{self.url}{path}: not a Prometheus API answer (invalid JSON)") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            raise PromError(f"{self.url}{path}: {doc.get('error', 'failed') if isinstance(doc, dict) else doc}")
        return doc.get("data")

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        """An instant vector (or scalar) at ``at`` (default: now)."""
        params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
        data = self._api("/api/v1/query", params)
        kind, result = data.get("resultType"), data.get("result")
        if kind == "scalar":
            return [Sample({}, float(result[1]))]
        if kind != "vector":
            raise PromError(f"{self.url}: query {expr!r} gave a {kind}, expected an instant vector")
        return [Sample(dict(r.get("metric", {})), float(r["value"][1])) for r in result]

    def query_range(
        self, expr: str, start: float, end: float, step_s: float
    ) -> list[tuple[dict[str, str], list[float]]]:
        """Each series of a range query with its values (timestamps dropped: the step is fixed)."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"}
        data = self._api("/api/v1/query_range", params)
        if data.get("resultType") != "matrix":
            raise PromError(f"{self.url}: range query {expr!r} gave a {data.get('resultType')}, expected a matrix")
        return [(dict(r.get("metric", {})), [float(v[1]) for v in r.get("values", [])]) for r in data["result"]]

    def alerts(self) -> list[Alert]:
        data = self._api("/api/v1/alerts")
        return [
            Alert(str(a["labels"].get("alertname", "")), str(a.get("state", "")), dict(a["labels"]))
            for a in data.get("alerts", [])
        ]

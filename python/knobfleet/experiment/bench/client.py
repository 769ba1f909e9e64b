#!/usr/bin/env python3
"""knobfleet bench client: closed-loop load and an output-consistency check for OpenAI-compatible engines.

Stdlib only, so it runs on any GPU host next to the engine (SGLang, vLLM, or the lab's stand-in):

    python3 client.py --url http://127.0.0.1:30000 --conc 48,64,80,96 --n-mult 4 --max-tokens 256 --out bench.json
    python3 client.py --url … --consistency --cons-prompts 16 --conc 16 --max-tokens 64 --out cons.json

Load: for each concurrency C, C worker threads keep C streaming /v1/completions requests in flight
(greedy, ignore_eos, fixed-seed prompts) until n requests finish; ``--warmup`` requests per bucket run
first and are not measured. With ``--warmup-max`` above it, the warm-up goes on in chunks (each as long as
all before it) until the engine has converged (``warmed``: the last chunk's median ITL and TTFT no longer
better than the chunk before by more than ``--warmup-tol``), at most ``--warmup-max`` requests; what was set
aside is in the bucket's ``warmup`` and ``warmup_detail``. Every bucket is bounded by ``--timeout`` seconds;
requests that fail or do not finish are counted as errors, never dropped. Prints one summary line per bucket and
writes JSON.

Consistency: each fixed prompt runs alone (serial), then all of them at once (repeatedly, so they share
batches); each concurrent output is compared token by token with its serial output. Reports the first
divergent token index, n-gram loops and finish reasons. Any divergence fails.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import sys
import threading
import time
import urllib.parse
from typing import Any

_WORDS = (
    "explain describe compare summarize list the a of and in to kernel attention cache decode batch model "
    "throughput latency memory expert router wave split token stream graph layer tensor"
)
WORDS = tuple(_WORDS.split())


def prompt(seed: int, i: int, length: int = 24) -> str:
    rng = random.Random(f"{seed}:{i}")
    return " ".join(rng.choice(WORDS) for _ in range(length))


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    k = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[k]


class Target:
    def __init__(self, url: str, model: str | None, timeout: float) -> None:
        u = urllib.parse.urlparse(url)
        if u.scheme != "http" or not u.hostname:
            raise SystemExit(f"--url {url!r}: expected http://HOST:PORT")
        self.host, self.port, self.timeout = u.hostname, u.port or 80, timeout
        self.model = model

    def get_json(self, path: str) -> Any:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read()
            return json.loads(body) if resp.status == 200 else None
        except (OSError, ValueError, http.client.HTTPException):
            return None
        finally:
            conn.close()

    def discover_model(self) -> str:
        if self.model:
            return self.model
        models = self.get_json("/v1/models") or {}
        data = models.get("data") or [{}]
        self.model = str(data[0].get("id") or "default")
        return self.model

    def complete(self, text: str, max_tokens: int, deadline: float, stall_s: float | None = None) -> dict[str, Any]:
        """One streaming completion; returns latency, ttft, token texts, finish reason, or an error. ``stall_s``: a
        stream whose next token (the first included) does not come within that many seconds of the request or the
        last token is closed, with ``stalled`` set and the error ``stalled`` (the canary's hung-stream probes)."""
        body = json.dumps(
            {
                "model": self.model,
                "prompt": text,
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
            }
        ).encode()
        started = time.perf_counter()
        out: dict[str, Any] = {
            "latency": None,
            "ttft": None,
            "tokens": 0,
            "texts": [],
            "finish_reason": None,
            "error": None,
            "itl": None,
            "stalled": False,
        }
        stamps: list[float] = []
        timeout = max(1.0, min(self.timeout, deadline - time.time()))
        conn = http.client.HTTPConnection(self.host, self.port, timeout=min(timeout, stall_s or timeout))
        sent, last = False, 0.0  # the request went out; when it did, then each token: what a stall counts from
        resp: http.client.HTTPResponse | None = None
        try:
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            sent, last = True, time.perf_counter()
            resp = conn.getresponse()
            if resp.status != 200:
                out["error"] = f"HTTP {resp.status}"
                resp.read()
                return out
            usage = None
            for raw in resp:
                if time.time() > deadline:
                    out["error"] = "timeout"
                    return out
                if stall_s is not None and time.perf_counter() - last > stall_s:
                    out["error"], out["stalled"] = "stalled", True  # lines came, tokens did not
                    return out
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                choice = (chunk.get("choices") or [{}])[0]
                piece = choice.get("text") or ""
                if piece:
                    now = last = time.perf_counter()
                    stamps.append(now)
                    out["texts"].append(piece)
                    if out["ttft"] is None:
                        out["ttft"] = now - started
                if choice.get("finish_reason"):
                    out["finish_reason"] = choice["finish_reason"]
                usage = chunk.get("usage") or usage
            out["latency"] = time.perf_counter() - started
            out["tokens"] = int((usage or {}).get("completion_tokens") or len(out["texts"]))
            if len(stamps) > 1:
                out["itl"] = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
        except TimeoutError as exc:
            if stall_s is not None and sent:  # sent, then no token within the bound
                out["error"], out["stalled"] = "stalled", True
            else:
                out["error"] = type(exc).__name__ + (f": {exc}" if str(exc) else "")
        except (OSError, ValueError, http.client.HTTPException) as exc:
            out["error"] = type(exc).__name__ + (f": {exc}" if str(exc) else "")
        finally:
            if resp is not None:
                resp.close()  # its file holds the socket open: a stalled stream ends here, for the server too
            conn.close()
        return out


def closed_loop(
    t: Target, conc: int, prompts: list[str], max_tokens: int, deadline: float
) -> tuple[list[dict[str, Any]], float]:
    """Keep ``conc`` requests in flight until every prompt is done (or the deadline passes)."""
    results: list[dict[str, Any] | None] = [None] * len(prompts)
    nxt = {"i": 0}
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                i = nxt["i"]
                if i >= len(prompts) or time.time() > deadline:
                    return
                nxt["i"] = i + 1
            results[i] = t.complete(prompts[i], max_tokens, deadline)

    started = time.perf_counter()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(conc, len(prompts)))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=max(0.0, deadline - time.time()) + 30)
    wall = time.perf_counter() - started
    done = [
        r
        if r is not None
        else {
            "error": "not started: bucket deadline passed",
            "tokens": 0,
            "latency": None,
            "ttft": None,
            "texts": [],
            "finish_reason": None,
            "itl": None,
        }
        for r in results
    ]
    return done, wall


def _medians(reqs: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    ok = [r for r in reqs if not r["error"]]
    itl = [r["itl"] for r in ok if r["itl"] is not None]
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    return (statistics.median(itl) if itl else None, statistics.median(ttft) if ttft else None)


def warmed(chunks: list[tuple[float | None, float | None]], tol: float) -> bool:
    """Whether the engine has converged: neither the median ITL nor the median TTFT of the last chunk is better
    than the chunk before by more than ``tol`` (a warming engine gets faster chunk by chunk; noise either way
    within ``tol``, or a chunk that got worse, ends it). Pure."""
    if len(chunks) < 2:
        return False
    for before, last in zip(chunks[-2], chunks[-1], strict=True):
        if before is not None and last is not None and before > 0 and (before - last) / before > tol:
            return False
    return True


def warm_up(
    t: Target, conc: int, least: int, most: int, tol: float, seed: int, max_tokens: int, deadline: float
) -> dict[str, Any]:
    """Unmeasured requests before a bucket: ``least``, then chunks (each as many requests as all before it, at least
    ``conc``) until ``warmed`` or ``most``. A restarted engine converges over its first ~50-100 requests: a chunk
    of a few requests improves on the one before by less than the noise long before that."""
    chunks: list[tuple[float | None, float | None]] = []
    sent = 0
    while time.time() <= deadline:
        if sent == 0:
            k = least if least > 0 else min(max(conc, 1), most)
        elif sent < most and not warmed(chunks, tol):
            k = min(max(conc, sent, 1), most - sent)  # chunks double: a slow trend shows over a longer span
        else:
            break
        if k <= 0:
            break
        reqs, _ = closed_loop(t, conc, [prompt(seed, -1 - sent - j) for j in range(k)], max_tokens, deadline)
        sent += k
        chunks.append(_medians(reqs))
        if most <= least:
            break
    return {
        "requests": sent,
        "converged": warmed(chunks, tol) if most > least else None,
        "bound": most,
        "itl_p50": [c[0] for c in chunks],
        "ttft_p50": [c[1] for c in chunks],
    }


def bucket(
    t: Target,
    conc: int,
    n: int,
    max_tokens: int,
    warmup: int,
    seed: int,
    timeout: float,
    warmup_max: int = 0,
    warmup_tol: float = 0.03,
) -> dict[str, Any]:
    deadline = time.time() + timeout
    warm = None
    if warmup or warmup_max:
        warm = warm_up(t, conc, warmup, max(warmup_max, warmup), warmup_tol, seed, max_tokens, deadline)
    reqs, wall = closed_loop(t, conc, [prompt(seed, i) for i in range(n)], max_tokens, deadline)
    ok = [r for r in reqs if not r["error"]]
    toks = sum(r["tokens"] for r in ok)
    lat = [r["latency"] for r in ok]
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    itl = [r["itl"] for r in ok if r["itl"] is not None]
    per_req = [r["tokens"] / r["latency"] for r in ok if r["latency"]]
    kinds: dict[str, int] = {}
    for r in reqs:
        if r["error"]:
            kinds[r["error"]] = kinds.get(r["error"], 0) + 1
    return {
        "concurrency": conc,
        "n": n,
        "max_tokens": max_tokens,
        "warmup": warm["requests"] if warm else 0,
        "warmup_detail": warm,
        "wall_s": round(wall, 4),
        "tokens": toks,
        "errors": len(reqs) - len(ok),
        "error_kinds": kinds,
        "agg_tok_s": toks / wall if wall > 0 else 0.0,
        "per_req_tok_s": conc * statistics.mean(per_req) if per_req else 0.0,
        "latency": {"p50": pct(lat, 50), "p90": pct(lat, 90), "p99": pct(lat, 99)},
        "ttft": {"p50": pct(ttft, 50), "p90": pct(ttft, 90), "p99": pct(ttft, 99)},
        "itl": {"p50": pct(itl, 50), "p90": pct(itl, 90), "p99": pct(itl, 99)},
        "requests": [{k: r[k] for k in ("latency", "ttft", "itl", "tokens", "error", "finish_reason")} for r in reqs],
    }


def summary_line(b: dict[str, Any]) -> str:
    p50 = b["latency"]["p50"]
    return (
        f"C={b['concurrency']} n={b['n']} max_tokens={b['max_tokens']} | agg={b['agg_tok_s']:.1f} tok/s | "
        f"per-req~{b['per_req_tok_s']:.1f} tok/s | p50 lat={p50 if p50 is None else f'{p50:.2f}s'} | "
        f"toks={b['tokens']} errs={b['errors']} wall={b['wall_s']:.1f}s"
    )


def loop_period(tokens: list[str], min_repeats: int = 4, max_period: int = 8) -> int | None:
    """The period of a loop the output ends in (an n-gram repeated >= min_repeats times), else None."""
    for p in range(1, max_period + 1):
        span = p * min_repeats
        if len(tokens) >= span and all(tokens[-i] == tokens[-i - p] for i in range(1, span - p + 1)):
            return p
    return None


def first_divergence(a: list[str], b: list[str]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def consistency(
    t: Target, conc: int, n_prompts: int, max_tokens: int, seed: int, repeats: int, timeout: float
) -> dict[str, Any]:
    deadline = time.time() + timeout
    prompts = [prompt(seed + 1000, i) for i in range(n_prompts)]
    serial = [t.complete(p, max_tokens, deadline) for p in prompts]
    cases = []
    finish: dict[str, int] = {}
    errors = sum(1 for s in serial if s["error"])
    for _ in range(repeats):
        reqs, _ = closed_loop(t, conc, prompts, max_tokens, deadline)
        for i, (s, r) in enumerate(zip(serial, reqs, strict=True)):
            if r["error"] or s["error"]:
                errors += 1 if r["error"] else 0
                continue
            finish[str(r["finish_reason"])] = finish.get(str(r["finish_reason"]), 0) + 1
            div = first_divergence(s["texts"], r["texts"])
            cases.append(
                {
                    "prompt": i,
                    "first_divergent_token": div,
                    "loop_period": loop_period(r["texts"]),
                    "serial_loop_period": loop_period(s["texts"]),
                }
            )
    diverged = [c for c in cases if c["first_divergent_token"] is not None]
    loops = [c for c in cases if c["loop_period"] and not c["serial_loop_period"]]
    return {
        "concurrency": conc,
        "prompts": n_prompts,
        "repeats": repeats,
        "max_tokens": max_tokens,
        "compared": len(cases),
        "diverged": len(diverged),
        "loops": len(loops),
        "errors": errors,
        "finish_reasons": finish,
        "passed": not diverged and not loops and errors == 0 and bool(cases),
        "divergences": diverged[:20],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", default=None)
    ap.add_argument("--conc", default="48,64,80,96")
    ap.add_argument("--n", type=int, default=None, help="requests per bucket (default: n-mult x C)")
    ap.add_argument("--n-mult", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=None, help="unmeasured requests per bucket (default: C)")
    ap.add_argument("--warmup-max", type=int, default=0, help="go on warming up until converged, at most this many")
    ap.add_argument("--warmup-tol", type=float, default=0.03, help="a chunk better than the last by more: not warm")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per bucket")
    ap.add_argument("--consistency", action="store_true")
    ap.add_argument("--cons-prompts", type=int, default=16)
    ap.add_argument("--cons-repeats", type=int, default=2)
    ap.add_argument("--out", default=None, help="write JSON here (default: stdout)")
    args = ap.parse_args(argv)
    concs = [int(c) for c in args.conc.split(",") if c]
    if not concs or min(concs) < 1 or args.max_tokens < 1:
        raise SystemExit("--conc and --max-tokens must be positive")
    t = Target(args.url, args.model, args.timeout)
    t.discover_model()
    doc: dict[str, Any] = {
        "url": args.url,
        "model": t.model,
        "started": time.time(),
        "server_info": t.get_json("/get_server_info") or t.get_json("/server_info"),
    }
    if args.consistency:
        doc["consistency"] = consistency(
            t, concs[0], args.cons_prompts, args.max_tokens, args.seed, args.cons_repeats, args.timeout
        )
        c = doc["consistency"]
        print(
            f"consistency C={c['concurrency']} prompts={c['prompts']} compared={c['compared']} "
            f"diverged={c['diverged']} loops={c['loops']} errs={c['errors']} -> "
            f"{'PASS' if c['passed'] else 'FAIL'}",
            file=sys.stderr,
            flush=True,
        )
    else:
        doc["buckets"] = []
        for c in concs:
            n = args.n or args.n_mult * c
            least = c if args.warmup is None else args.warmup
            b = bucket(t, c, n, args.max_tokens, least, args.seed, args.timeout, args.warmup_max, args.warmup_tol)
            doc["buckets"].append(b)
            print(summary_line(b), file=sys.stderr, flush=True)
    text = json.dumps(doc)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""HTTP API of the stand-in engine: SGLang's native endpoints and the OpenAI completions and chat APIs.

Outputs are greedy and deterministic: the tokens depend on the prompt only (``model.greedy_token``), never
on batching (unless multi-stream overlap corrupts them, as modelled in ``engine``). A chat request's prompt
is its messages rendered with a fixed ChatML-like template (``chat_prompt``).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from . import __version__
from .engine import Engine
from .hang import Hang

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
CHAT_DEFAULT_MAX_TOKENS = 2048


def _message_text(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError("only text content parts are supported: {'type': 'text', 'text': ...}")
            parts.append(part["text"])
        return "".join(parts)
    raise ValueError("message content must be a string or a list of content parts")


def chat_prompt(messages: Any) -> str:
    """The prompt a chat request decodes from: the messages in a fixed template, then the assistant's turn."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list")
    out = []
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in CHAT_ROLES:
            raise ValueError(f"each message needs a 'role' in {', '.join(CHAT_ROLES)}")
        out.append(f"<|im_start|>{m['role']}\n{_message_text(m.get('content'))}<|im_end|>\n")
    return "".join(out) + "<|im_start|>assistant\n"


def _usage(prompt: str, completion_tokens: int) -> dict[str, int]:
    n = len(prompt.split())
    return {"prompt_tokens": n, "completion_tokens": completion_tokens, "total_tokens": n + completion_tokens}


class State:
    """What the handlers read: readiness, args, env knobs, the engine."""

    def __init__(
        self, server_args: dict[str, Any], env_vars: dict[str, str], engine: Engine, expose_env: bool, model_name: str
    ) -> None:
        self.server_args = server_args
        self.env_vars = env_vars
        self.engine = engine
        self.expose_env = expose_env
        self.model_name = model_name
        self.ready = threading.Event()
        self.never_ready = False
        self.worker_pids: list[int] = []  # the scheduler/detokenizer processes a generation goes through
        self.health_timeout_s = 20.0  # SGLang's SGLANG_HEALTH_CHECK_TIMEOUT
        self.draining = threading.Event()  # set on SIGTERM: health 503, new requests refused, in-flight ones finish
        self.version = __version__  # the engine version server info reports (the launcher reads sglang_sim/VERSION)
        self.ranks: Callable[[], list[dict[str, Any]]] | None = None  # rank 0 of a multi-node engine: who joined
        self.hang: Hang | None = None  # SGLANG_SIM_HANG: the streams that stop sending tokens, status 200 (hang.py)
        self._active = 0
        self._lock = threading.Lock()

    def enter(self) -> bool:
        """Count one request in, unless the server drains (then the caller answers 503)."""
        with self._lock:
            if self.draining.is_set():
                return False
            self._active += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self._active -= 1

    @property
    def active(self) -> int:
        """Requests accepted and not yet fully answered."""
        with self._lock:
            return self._active


def process_state(pid: int) -> str | None:
    """``/proc/PID/stat`` field 3 (R, S, T stopped, Z zombie, ...); None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            line = fh.read()
    except OSError:
        return None
    return line[line.rindex(")") + 2 :].split()[0]


def workers_running(state: State) -> bool:
    return all(process_state(pid) not in ("T", "t", "Z", None) for pid in state.worker_pids)


class Handler(BaseHTTPRequestHandler):
    server_version = "sglang-sim"
    protocol_version = "HTTP/1.1"
    state: State

    def log_message(self, format: str, *args: Any) -> None:
        return None

    # -- helpers --------------------------------------------------------------------------------
    def _send(self, code: int, body: bytes = b"", ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, code: int, data: Any) -> None:
        self._send(code, json.dumps(data).encode())

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        if length > 1 << 20:
            raise ValueError("request body too large")
        raw = self.rfile.read(length) if length else b"{}"
        data = json.loads(raw or b"{}")
        if not isinstance(data, dict):
            raise ValueError("expected a JSON object")
        return data

    def _start_events(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def _event(self, data: Any) -> None:
        self.wfile.write(b"data: " + (data if isinstance(data, bytes) else json.dumps(data).encode()) + b"\n\n")
        self.wfile.flush()

    def _hangs_after(self, max_tokens: int) -> int | None:
        """The tokens this stream sends before it hangs (SGLANG_SIM_HANG), or None."""
        return self.state.hang.at(max_tokens) if self.state.hang is not None else None

    def _hold(self) -> None:
        """A hung stream: what was written goes out, then nothing until the client leaves, a drain or the bound."""
        self.wfile.flush()
        if self.state.hang is not None:
            self.state.hang.hold(self.connection, self.state.draining)
        self.close_connection = True

    def _ready(self) -> bool:
        st = self.state
        return st.ready.is_set() and not st.never_ready and not st.draining.is_set()

    def _generates(self) -> bool:
        """SGLang's /health_generate: one token through the scheduler processes, within the health timeout. A
        stopped (SIGSTOP) or dead scheduler never answers: 503 once the timeout has passed."""
        st = self.state
        deadline = time.monotonic() + st.health_timeout_s
        while not workers_running(st):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        req = st.engine.submit("health", 1, True)
        try:
            for _token in st.engine.stream(req, timeout_s=max(0.1, deadline - time.monotonic())):
                pass
        except TimeoutError:
            return False
        return True

    def server_info(self) -> dict[str, Any]:
        st = self.state
        internal: dict[str, Any] = {"last_gen_throughput": round(st.engine.last_gen_throughput, 3)}
        if st.expose_env:
            internal["env_vars"] = dict(st.env_vars)
        info = {**st.server_args, "version": st.version, "internal_states": [internal]}
        if st.ranks is not None:
            info["ranks"] = st.ranks()
        return info

    # -- routes ---------------------------------------------------------------------------------
    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._send(200 if self._ready() else 503, b"", "text/plain")
        elif path == "/health_generate":
            self._send(200 if self._ready() and self._generates() else 503, b"", "text/plain")
        elif path in ("/get_server_info", "/server_info"):
            self._json(200, self.server_info())
        elif path == "/get_model_info":
            self._json(
                200,
                {
                    "model_path": self.state.server_args["model_path"],
                    "tokenizer_path": self.state.server_args["model_path"],
                    "is_generation": True,
                },
            )
        elif path == "/v1/models":
            self._json(
                200,
                {
                    "object": "list",
                    "data": [
                        {
                            "id": self.state.model_name,
                            "object": "model",
                            "created": 0,
                            "owned_by": "sglang",
                            "root": self.state.model_name,
                        }
                    ],
                },
            )
        elif path == "/metrics":
            eng = self.state.engine
            text = eng.metrics.exposition(
                self.state.model_name, eng.num_running, eng.num_waiting, eng.last_gen_throughput, eng.token_usage
            )
            self._send(200, text.encode(), "text/plain; version=0.0.4")
        else:
            self._json(404, {"error": {"message": f"no route {path}"}})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if not self._ready() or not self.state.enter():
            # The body is not read: close the connection, or a keep-alive client's next request would start
            # inside it ("Bad request syntax").
            self.close_connection = True
            why = "server is shutting down" if self.state.draining.is_set() else "server is not ready"
            payload = json.dumps({"error": {"message": why}}).encode()
            self.send_response(503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(payload)
            return
        try:
            body = self._body()
            if path == "/v1/completions":
                self._completions(body)
            elif path == "/v1/chat/completions":
                self._chat(body)
            elif path == "/generate":
                self._generate(body)
            else:
                self._json(404, {"error": {"message": f"no route {path}"}})
        except (ValueError, TypeError, json.JSONDecodeError) as exc:
            self._json(400, {"error": {"message": str(exc)}})
        except (BrokenPipeError, ConnectionResetError):
            return
        finally:
            self.state.leave()

    def _generate(self, body: dict[str, Any]) -> None:
        params = body.get("sampling_params") or {}
        prompt = str(body.get("text", ""))
        req = self.state.engine.submit(
            prompt, int(params.get("max_new_tokens", 128)), bool(params.get("ignore_eos", False))
        )
        started = time.monotonic()
        tokens = list(self.state.engine.stream(req))
        self._json(
            200,
            {
                "text": "".join(" " + t for t in tokens),
                "meta_info": {
                    "prompt_tokens": len(prompt.split()),
                    "completion_tokens": len(tokens),
                    "finish_reason": {"type": req.finish_reason},
                    "e2e_latency": time.monotonic() - started,
                },
            },
        )

    def _completions(self, body: dict[str, Any]) -> None:
        prompt = body.get("prompt", "")
        if isinstance(prompt, list):
            prompt = prompt[0] if prompt else ""
        prompt = str(prompt)
        max_tokens = int(body.get("max_tokens", 16))
        req = self.state.engine.submit(prompt, max_tokens, bool(body.get("ignore_eos", False)))
        rid = "cmpl-" + uuid.uuid4().hex[:16]
        model_name = body.get("model") or self.state.model_name
        if not body.get("stream"):
            tokens = list(self.state.engine.stream(req))
            self._json(
                200,
                {
                    "id": rid,
                    "object": "text_completion",
                    "created": int(time.time()),
                    "model": model_name,
                    "choices": [
                        {
                            "index": 0,
                            "text": "".join(" " + t for t in tokens),
                            "finish_reason": req.finish_reason,
                            "logprobs": None,
                        }
                    ],
                    "usage": {
                        "prompt_tokens": len(prompt.split()),
                        "completion_tokens": len(tokens),
                        "total_tokens": len(prompt.split()) + len(tokens),
                    },
                },
            )
            return
        self._start_events()
        # One chunk per token, built from a fixed prefix and suffix: the per-token CPU is what limits how
        # fast the lab's time scale can run before the stand-in measures its own CPU instead of the model.
        created = int(time.time())
        head = {"id": rid, "object": "text_completion", "created": created, "model": model_name}
        prefix = b"data: " + json.dumps(head).encode()[:-1] + b', "choices": [{"index": 0, "text": '
        suffix = b', "finish_reason": null, "logprobs": null}]}\n\n'
        hang = self._hangs_after(req.max_tokens)
        for i, tok in enumerate(self.state.engine.stream(req)):
            if i == hang:
                return self._hold()
            self.wfile.write(prefix + json.dumps(" " + tok).encode() + suffix)
        if hang is not None:  # fewer tokens than the hang's point (an early EOS): it hangs before its end
            return self._hold()
        final = {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": model_name,
            "choices": [{"index": 0, "text": "", "finish_reason": req.finish_reason, "logprobs": None}],
            "usage": {
                "prompt_tokens": len(prompt.split()),
                "completion_tokens": len(req.tokens),
                "total_tokens": len(prompt.split()) + len(req.tokens),
            },
        }
        self.wfile.write(b"data: " + json.dumps(final).encode() + b"\n\ndata: [DONE]\n\n")
        self.wfile.flush()

    def _chat(self, body: dict[str, Any]) -> None:
        """``POST /v1/chat/completions``: OpenAI-shaped, streaming (SSE chunks, ``[DONE]``) or not."""
        prompt = chat_prompt(body.get("messages"))
        if int(body.get("n") or 1) != 1:
            raise ValueError("only n=1 is supported")
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        max_tokens = CHAT_DEFAULT_MAX_TOKENS if limit is None else int(limit)
        if max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        req = self.state.engine.submit(prompt, max_tokens, bool(body.get("ignore_eos", False)))
        rid = "chatcmpl-" + uuid.uuid4().hex[:16]
        model_name = body.get("model") or self.state.model_name
        created = int(time.time())
        if not body.get("stream"):
            tokens = list(self.state.engine.stream(req))
            message = {"role": "assistant", "content": " ".join(tokens), "tool_calls": None}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": req.finish_reason}
            self._json(
                200,
                {
                    "id": rid,
                    "object": "chat.completion",
                    "created": created,
                    "model": model_name,
                    "choices": [choice],
                    "usage": _usage(prompt, len(tokens)),
                },
            )
            return
        options = body.get("stream_options") or {}
        head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model_name}

        def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
            return {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

        self._start_events()
        self._event(chunk({"role": "assistant", "content": ""}, None))
        hang = self._hangs_after(req.max_tokens)
        for i, tok in enumerate(self.state.engine.stream(req)):
            if i == hang:
                return self._hold()
            self._event(chunk({"content": tok if i == 0 else " " + tok}, None))
        if hang is not None:
            return self._hold()
        self._event(chunk({}, req.finish_reason))
        if options.get("include_usage"):
            self._event({**head, "choices": [], "usage": _usage(prompt, len(req.tokens))})
        self._event(b"[DONE]")


def make_server(host: str, port: int, state: State) -> ThreadingHTTPServer:
    handler = type("BoundHandler", (Handler,), {"state": state})
    server_cls = type("SimServer", (ThreadingHTTPServer,), {"request_queue_size": 1024, "allow_reuse_address": True})
    server = server_cls((host, port), handler)
    server.daemon_threads = True
    return server  # type: ignore[no-any-return]


class DummyHealthHandler(BaseHTTPRequestHandler):
    """A non-zero rank's only endpoint, like SGLang's ``launch_dummy_health_check_server``: ``/health`` and
    ``/health_generate`` answer 200 whatever the engine does (rank 0's report of who joined is what counts);
    every other route is 404."""

    server_version = "sglang-sim"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def _answer(self) -> None:
        path = self.path.split("?", 1)[0]
        if self.command == "POST":  # the body is not read: close the connection after answering
            self.close_connection = True
        if self.command != "POST" and path in ("/health", "/health_generate"):
            code, body, ctype = 200, b"", "text/plain"
        else:
            code, body, ctype = 404, json.dumps({"detail": "Not Found"}).encode(), "application/json"
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_POST = _answer


def make_dummy_health_server(host: str, port: int) -> ThreadingHTTPServer:
    server_cls = type("DummyHealthServer", (ThreadingHTTPServer,), {"allow_reuse_address": True})
    server = server_cls((host, port), DummyHealthHandler)
    server.daemon_threads = True
    return server  # type: ignore[no-any-return]

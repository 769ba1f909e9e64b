"""HTTP handlers and launcher of the stand-in engine, in process on a loopback port."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from knobfleet.lab.sim import model
from knobfleet.lab.sim.engine import Engine, EngineConfig
from knobfleet.lab.sim.launch_server import step_scale
from knobfleet.lab.sim.server import State, chat_prompt, make_server
from knobfleet.waves import KernelKnobs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server() -> Iterator[tuple[str, State]]:
    cfg = EngineConfig(KernelKnobs(), 188, time_scale=0.001, noise=0.0, overlap=False, max_running=64, seed=1)
    engine = Engine(cfg)
    state = State(
        {"model_path": "/m", "port": 0},
        {"SGLANG_SM120_MMA_TARGET_CTAS": "256"},
        engine,
        expose_env=True,
        model_name="/m",
    )
    httpd = make_server("127.0.0.1", free_port(), state)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    engine.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", state
    engine.stop()
    httpd.shutdown()
    httpd.server_close()


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def post(url: str, body: dict[str, Any]) -> bytes:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        data: bytes = r.read()
        return data


def test_health_is_503_until_ready_then_200(server: tuple[str, State]) -> None:
    url, state = server
    assert get(url + "/health_generate")[0] == 503
    state.ready.set()
    assert get(url + "/health_generate") == (200, b"")
    assert get(url + "/health")[0] == 200


def test_server_info_and_models(server: tuple[str, State]) -> None:
    url, state = server
    state.ready.set()
    info = json.loads(get(url + "/get_server_info")[1])
    assert info["model_path"] == "/m"
    assert info["internal_states"][0]["env_vars"] == {"SGLANG_SM120_MMA_TARGET_CTAS": "256"}
    assert json.loads(get(url + "/server_info")[1]) == info
    models = json.loads(get(url + "/v1/models")[1])
    assert models["data"][0]["owned_by"] == "sglang"
    assert b"sglang:num_running_reqs" in get(url + "/metrics")[1]


def test_completions_plain_and_streaming_agree(server: tuple[str, State]) -> None:
    url, state = server
    state.ready.set()
    plain = json.loads(post(url + "/v1/completions", {"prompt": "x", "max_tokens": 12, "ignore_eos": True}))
    assert plain["usage"]["completion_tokens"] == 12 and plain["choices"][0]["finish_reason"] == "length"
    raw = post(url + "/v1/completions", {"prompt": "x", "max_tokens": 12, "ignore_eos": True, "stream": True})
    events = [e for e in raw.decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    text = "".join(json.loads(e[6:])["choices"][0]["text"] for e in events[:-1])
    assert text == plain["choices"][0]["text"]
    gen = json.loads(
        post(url + "/generate", {"text": "x", "sampling_params": {"max_new_tokens": 12, "ignore_eos": True}})
    )
    assert gen["text"] == plain["choices"][0]["text"]


def test_without_ignore_eos_requests_stop_early(server: tuple[str, State]) -> None:
    url, state = server
    state.ready.set()
    out = json.loads(post(url + "/v1/completions", {"prompt": "y", "max_tokens": 2000}))
    assert out["choices"][0]["finish_reason"] == "stop"
    assert out["usage"]["completion_tokens"] < 2000


def run_launcher(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "knobfleet.lab.sim.launch_server", *args],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_unknown_flag_exits_2_with_usage() -> None:
    proc = run_launcher({}, "--model-path=/m", "--no-such-flag")
    assert proc.returncode == 2 and "unrecognized arguments: --no-such-flag" in proc.stderr


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("SGLANG_SM120_MMA_BLOCK_H", "7", "SGLANG_SM120_MMA_BLOCK_H=7 is not supported"),
        ("SGLANG_SM120_MMA_TARGET_CTAS", "abc", "expected an integer"),
    ],
)
def test_bad_knob_value_fails_at_start(name: str, value: str, message: str) -> None:
    proc = run_launcher({name: value, "PYTHONPATH": sys.path[0]}, "--model-path=/m", "--port", str(free_port()))
    assert proc.returncode == 1
    assert proc.stderr.startswith("Traceback (most recent call last):") and message in proc.stderr


def test_fail_start_exits_1_during_startup() -> None:
    proc = run_launcher(
        {"SGLANG_SIM_FAIL": "start", "SGLANG_SIM_STARTUP_S": "0.2"},
        "--model-path=/m",
        "--host=127.0.0.1",
        f"--port={free_port()}",
    )
    assert proc.returncode == 1 and "illegal memory access" in proc.stderr
    assert "fired up" not in proc.stdout


def post_status(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "explain split-K"}]


def test_chat_completions_plain_is_openai_shaped_and_deterministic(server: tuple[str, State]) -> None:
    url, state = server
    state.ready.set()
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 10, "ignore_eos": True}
    out = json.loads(post(url + "/v1/chat/completions", body))
    assert out["object"] == "chat.completion" and out["id"].startswith("chatcmpl-") and out["model"] == "m"
    choice = out["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "length"
    words = choice["message"]["content"].split(" ")
    assert len(words) == 10 and out["usage"]["completion_tokens"] == 10
    assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + 10
    assert json.loads(post(url + "/v1/chat/completions", body))["choices"][0]["message"] == choice["message"]
    # greedy: the tokens are the model's for the rendered prompt, whatever the batch
    prompt = chat_prompt(MESSAGES)
    assert words == [model.greedy_token(prompt, i) for i in range(10)]
    # content parts read as their text; max_completion_tokens wins over max_tokens
    parts = [
        MESSAGES[0],
        {"role": "user", "content": [{"type": "text", "text": "explain "}, {"type": "text", "text": "split-K"}]},
    ]
    again = json.loads(post(url + "/v1/chat/completions", {**body, "messages": parts}))
    assert again["choices"][0]["message"] == choice["message"]
    short = json.loads(post(url + "/v1/chat/completions", {**body, "max_completion_tokens": 3}))
    assert short["usage"]["completion_tokens"] == 3


def test_chat_completions_streaming_agrees_with_plain(server: tuple[str, State]) -> None:
    url, state = server
    state.ready.set()
    body = {"messages": MESSAGES, "max_tokens": 12, "ignore_eos": True}
    plain = json.loads(post(url + "/v1/chat/completions", body))
    raw = post(url + "/v1/chat/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    events = [e for e in raw.decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == plain["choices"][0]["message"]["content"]
    finals = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finals == ["length"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == plain["usage"]
    no_usage = post(url + "/v1/chat/completions", {**body, "stream": True}).decode()
    assert '"usage"' not in no_usage


def test_chat_without_ignore_eos_stops_at_eos(server: tuple[str, State]) -> None:
    url, state = server
    state.ready.set()
    out = json.loads(post(url + "/v1/chat/completions", {"messages": MESSAGES}))
    assert out["choices"][0]["finish_reason"] == "stop"
    assert out["usage"]["completion_tokens"] == model.eos_position(chat_prompt(MESSAGES))


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"messages": []},
        {"messages": [{"role": "wizard", "content": "x"}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        {"messages": MESSAGES, "n": 2},
        {"messages": MESSAGES, "max_tokens": 0},
    ],
)
def test_chat_rejects_bad_requests_with_400(server: tuple[str, State], body: dict[str, Any]) -> None:
    url, state = server
    state.ready.set()
    code, raw = post_status(url + "/v1/chat/completions", body)
    assert code == 400 and json.loads(raw)["error"]["message"]


def test_chat_is_503_until_ready(server: tuple[str, State]) -> None:
    url, _ = server
    assert post_status(url + "/v1/chat/completions", {"messages": MESSAGES})[0] == 503


def test_metrics_record_what_the_engine_served(server: tuple[str, State]) -> None:
    """After two requests (12 and 5 tokens), /metrics holds exactly what happened: 2 first tokens, 15 later
    tokens, 2 finished requests, their prompt words, and latencies summed from the engine's own clock."""
    url, state = server
    state.ready.set()
    post(url + "/v1/completions", {"prompt": "a b c", "max_tokens": 12, "ignore_eos": True, "stream": True})
    post(url + "/v1/completions", {"prompt": "d e", "max_tokens": 5, "ignore_eos": True})
    text = get(url + "/metrics")[1].decode()
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line[:1] != "#"}
    m = 'model_name="' + state.model_name + '"'
    assert values[f"sglang:generation_tokens_total{{{m}}}"] == 17
    assert values[f"sglang:prompt_tokens_total{{{m}}}"] == 5
    assert values[f"sglang:num_requests_total{{{m}}}"] == 2
    assert values[f"sglang:time_to_first_token_seconds_count{{{m}}}"] == 2
    assert values[f"sglang:inter_token_latency_seconds_count{{{m}}}"] == 15
    assert values[f"sglang:e2e_request_latency_seconds_count{{{m}}}"] == 2
    e2e = values[f"sglang:e2e_request_latency_seconds_sum{{{m}}}"]
    ttft = values[f"sglang:time_to_first_token_seconds_sum{{{m}}}"]
    itl = values[f"sglang:inter_token_latency_seconds_sum{{{m}}}"]
    assert e2e == pytest.approx(ttft + itl, rel=1e-6)  # each request's end-to-end = first token + the gaps after
    assert values[f"sglang:num_running_reqs{{{m}}}"] == 0 and values[f"sglang:token_usage{{{m}}}"] == 0


def test_health_generate_fails_while_a_scheduler_process_is_stopped(server: tuple[str, State]) -> None:
    """/health_generate runs one token through the scheduler processes (SGLang's generation check): a stopped
    one (SIGSTOP: state T) never answers, so it is 503 after the health timeout while /health stays 200."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from knobfleet.lab.sim.server import process_state

    url, state = server
    state.ready.set()
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # a stand-in scheduler
    try:
        state.worker_pids, state.health_timeout_s = [worker.pid], 0.5
        assert get(url + "/health_generate") == (200, b"")
        os.kill(worker.pid, signal.SIGSTOP)  # delivered asynchronously: wait for state T (bounded)
        for _ in range(1000):
            if process_state(worker.pid) == "T":
                break
            time.sleep(0.01)
        try:
            assert get(url + "/health_generate")[0] == 503
            assert get(url + "/health")[0] == 200
        finally:
            os.kill(worker.pid, signal.SIGCONT)
        assert get(url + "/health_generate") == (200, b"")
    finally:
        worker.kill()
        worker.wait(timeout=10)


@pytest.mark.parametrize(
    ("env", "scale"),
    [
        ({}, 1.0),
        ({"SGLANG_SIM_TIME_SCALE": "0.25"}, 0.25),
        ({"SGLANG_SIM_TIME_SCALE": "0.25", "SGLANG_SIM_SLOWDOWN": "1.05"}, 0.2625),
        ({"SGLANG_SIM_SLOWDOWN": "2"}, 2.0),
        ({"SGLANG_SIM_SLOWDOWN": "1"}, 1.0),
        ({"SGLANG_SIM_SLOWDOWN": "10"}, 10.0),
    ],
)
def test_a_slowdown_multiplies_the_hosts_time_scale(env: dict[str, str], scale: float) -> None:
    assert step_scale(env) == pytest.approx(scale)


@pytest.mark.parametrize("value", ["0.95", "10.5", "nan", "fast", ""])
def test_a_slowdown_outside_1_to_10_ends_the_start(value: str) -> None:
    proc = run_launcher(
        {"SGLANG_SIM_SLOWDOWN": value, "PYTHONPATH": sys.path[0]}, "--model-path=/m", "--port", str(free_port())
    )
    assert proc.returncode == 1, proc.stderr
    assert f"ValueError: SGLANG_SIM_SLOWDOWN={value!r}: expected a factor in 1..10" in proc.stderr

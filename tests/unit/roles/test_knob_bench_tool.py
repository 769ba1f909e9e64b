"""The on-host module roles/knob_bench/library/knob_bench_tool.py, run in-process: it runs a real program per
bucket (a small script standing in for the engine's tool), reads what it wrote, and the engine's version and
settings from a real HTTP server on loopback."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.unit.roles.test_knob_generation import load_role_module

REPO = Path(__file__).resolve().parents[3]

TOOL = """#!/usr/bin/env python3
import json, sys
args = dict(zip(sys.argv[1:], sys.argv[2:]))
if args.get("--fail"):
    print("Traceback ...\\nModuleNotFoundError: No module named 'sglang'")
    sys.exit(3)
conc = int(args["--max-concurrency"])
line = json.dumps({"completed": 4, "output_throughput": 10.0 * conc, "ttfts": [0.1] * 4, "nested": {"a": 1}})
mode = "a" if args.get("--jsonl") else "w"
with open(args["--out"], mode) as f:
    if mode == "a":
        f.write(json.dumps({"completed": 0, "output_throughput": -1}) + "\\n")
    f.write(line + "\\n")
"""


def load() -> ModuleType:
    return load_role_module("knob_bench", "knob_bench_tool")


@pytest.fixture(scope="module")
def engine_http() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = {
                "/version": {"version": "0.32.0"},
                "/server_info": {"max_num_seqs": 8, "api_key": "s3cret", "env": {"HF_TOKEN": "hf_x"}},
            }.get(self.path)
            self.send_response(200 if body else 404)
            self.end_headers()
            if body:
                self.wfile.write(json.dumps(body).encode())

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def params(tmp_path: Path, conc: tuple[int, ...], *extra: str, fmt: str = "json") -> dict[str, Any]:
    tool = tmp_path / "tool.py"
    tool.write_text(TOOL)
    tool.chmod(0o755)
    return {
        "runs": [
            {
                "concurrency": c,
                "num_prompts": 4,
                "argv": [str(tool), "--max-concurrency", str(c), "--out", f"{{result_dir}}/r-c{c}.json", *extra],
                "result_path": f"{{result_dir}}/r-c{c}.json",
            }
            for c in conc
        ],
        "result_dir": str(tmp_path),
        "result_format": fmt,
        "env": {},
        "timeout_s": 60,
        "version_url": "",
        "version_key": "version",
        "info_url": "",
        "secret": [],
    }


def test_every_bucket_runs_and_its_summary_comes_back_without_per_request_lists(tmp_path: Path) -> None:
    failure, out = load().run_tool(params(tmp_path, (2, 4)))
    assert failure is None
    assert out["step"] == "bench_tool"
    assert [(r["concurrency"], r["result"]) for r in out["runs"]] == [
        (2, {"completed": 4, "output_throughput": 20.0}),
        (4, {"completed": 4, "output_throughput": 40.0}),
    ]
    assert not list(tmp_path.glob("r-c*.json"))  # the results it read are removed from the host


def test_jsonl_takes_the_last_line(tmp_path: Path) -> None:
    failure, out = load().run_tool(params(tmp_path, (3,), "--jsonl", "1", fmt="jsonl"))
    assert failure is None and out["runs"][0]["result"]["output_throughput"] == 30.0


def test_version_and_settings_are_read_and_secrets_hashed(tmp_path: Path, engine_http: str) -> None:
    p = {**params(tmp_path, (1,)), "version_url": engine_http + "/version", "info_url": engine_http + "/server_info"}
    failure, out = load().run_tool(p)
    assert failure is None and out["version"] == "0.32.0"
    assert out["settings"]["max_num_seqs"] == 8
    assert out["settings"]["api_key"].startswith("<secret")
    assert out["settings"]["env"]["HF_TOKEN"].startswith("<secret")
    assert "s3cret" not in json.dumps(out) and "hf_x" not in json.dumps(out)


def test_an_unreachable_engine_leaves_version_and_settings_empty(tmp_path: Path, engine_http: str) -> None:
    p = {**params(tmp_path, (1,)), "version_url": engine_http + "/nope", "info_url": engine_http + "/nope"}
    failure, out = load().run_tool(p)
    assert failure is None and out["version"] is None and out["settings"] is None


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda p: p["runs"][0]["argv"].append("--fail") or p["runs"][0]["argv"].append("1"),
            r"exited 3 at concurrency 2 \(the engine's bench tool is not installed next to the engine; use bench "
            r"--tool builtin\): .*No module named 'sglang'",
        ),
        (
            lambda p: p["runs"][0]["argv"].__setitem__(0, "/nonexistent/vllm"),
            r"not installed on this host: /nonexistent/vllm not found",
        ),
        (
            lambda p: p["runs"][0].__setitem__("result_path", "{result_dir}/elsewhere.json"),
            r"wrote no readable result at .*/elsewhere.json",
        ),
        (lambda p: p.__setitem__("timeout_s", 0), r"ran past timeout_s before concurrency 2"),
    ],
)
def test_a_failing_tool_is_named_with_its_output(tmp_path: Path, mutate: Any, message: str) -> None:
    p = params(tmp_path, (2, 4))
    mutate(p)
    failure, out = load().run_tool(p)
    assert failure is not None and re.search(message, failure), failure
    assert out["runs"] == []  # nothing half-measured is reported as a result


def run_main(capsys: pytest.CaptureFixture[str], module_args: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """main() with Ansible's real AnsibleModule, its arguments handed over as Ansible does."""
    from ansible.module_utils import basic

    basic._ANSIBLE_ARGS = json.dumps({"ANSIBLE_MODULE_ARGS": module_args}).encode()
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        load().main()
    out = capsys.readouterr().out
    result: dict[str, Any] = json.loads(out[out.index("{") :])
    return int(info.value.code or 0), result


def test_main_returns_the_step_and_fails_with_the_runs_so_far(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = params(tmp_path, (2,))
    args = {k: p[k] for k in ("runs", "result_dir", "timeout_s")}
    rc, res = run_main(capsys, args)
    assert rc == 0 and res["step"] == "bench_tool" and res["changed"] is False
    assert res["runs"][0]["result"] == {"completed": 4, "output_throughput": 20.0}
    args["runs"][0]["argv"] += ["--fail", "1"]
    rc, res = run_main(capsys, args)
    assert rc == 1 and res["failed"] and "exited 3 at concurrency 2" in res["msg"] and res["runs"] == []
    rc, res = run_main(capsys, {**args, "result_format": "xml"})
    assert rc == 1 and "result_format" in res["msg"]  # the argument spec names the bad value

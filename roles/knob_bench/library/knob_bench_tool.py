#!/usr/bin/python3
"""Ansible module: run an engine's own serving benchmark (vllm bench serve, sglang.bench_serving) on the host,
once per concurrency bucket, and return the JSON each run wrote, the engine's version and its settings."""

from __future__ import annotations

DOCUMENTATION = r"""
module: knob_bench_tool
short_description: Run the engine's own serving benchmark against the local engine
description:
  - Runs each argv of O(runs) in turn (knobfleet renders them from the engine catalog's C(serve.bench)), bounded
    by O(timeout_s) in all, and reads the JSON result each run wrote (for C(jsonl), its last line).
  - Reads the engine's version (O(version_url)) and its resolved settings (O(info_url)) before the runs, so the
    results say what they measured; secret-looking values in the settings leave the host only as hashes.
  - Removes the result files it read. Changes nothing else.
version_added: "0.2.0"
author: knobfleet
options:
  runs:
    description: One entry per bucket, with C(concurrency), C(argv) (list) and C(result_path).
    type: list
    elements: dict
    required: true
  result_dir:
    description: Folder for the result files; replaces C({result_dir}) in each argv and C(result_path).
    type: path
    required: true
  result_format:
    description: C(json) (one document per file) or C(jsonl) (the tool appends a line per run).
    type: str
    choices: [json, jsonl]
    default: json
  env:
    description: Extra environment of the tool's processes.
    type: dict
    default: {}
  timeout_s:
    description: Bound of all runs together, in seconds.
    type: int
    default: 1800
  version_url:
    description: URL whose JSON reports the engine version (empty skips it).
    type: str
    default: ""
  version_key:
    description: The version's key in that JSON.
    type: str
    default: version
  info_url:
    description: The engine's settings URL (empty skips it).
    type: str
    default: ""
  secret:
    description: Secret env names or patterns, hashed in the settings.
    type: list
    elements: str
    default: []
notes:
  - Not supported in check mode (it sends load to the engine).
"""

EXAMPLES = r"""
- name: Run vLLM's own benchmark at concurrency 8
  knobfleet.serving.knob_bench_tool:
    runs:
      - concurrency: 8
        argv: [/opt/vllm/bin/vllm, bench, serve, --base-url, "http://127.0.0.1:8000", --model, /models/x,
               --dataset-name, random, --num-prompts, "32", --max-concurrency, "8", --save-result,
               --result-dir, "{result_dir}", --result-filename, run-c8.json]
        result_path: "{result_dir}/run-c8.json"
    result_dir: /var/lib/knobfleet/bench
    version_url: http://127.0.0.1:8000/version
  register: knob_bench_tool_result
"""

RETURN = r"""
step:
  description: Always C(bench_tool); knobfleet keys results by it.
  returned: always
  type: str
  sample: bench_tool
runs:
  description: Per bucket, C(concurrency), C(wall_s) and C(result) (the tool's JSON, without per-request lists).
  returned: success
  type: list
version:
  description: The engine version the engine reported, or null.
  returned: always
  type: str
settings:
  description: The engine's info document (resolved settings), secrets hashed; null when not reported.
  returned: always
  type: dict
"""

import json
import os
import subprocess
import time

from ansible.module_utils.knob_http import http_get
from ansible.module_utils.knob_redact import redact_tree

TAIL = 1500  # characters of a failed run's output shown to the operator


def _tail(text, lines=3):
    """The last lines of a run's output on one line: where a traceback says what went wrong."""
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept)[-TAIL:]


def _get_json(url):
    status, body = http_get(url, 10.0)
    if status != 200 or body is None:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


def _scalars(doc):
    """The tool's summary: per-request lists (ttfts, itls, generated texts, ...) stay on the host."""
    return {k: v for k, v in doc.items() if not isinstance(v, (list, dict))}


def _read_result(path, fmt):
    with open(path, "rb") as f:
        data = f.read(64 << 20).decode("utf-8", "replace")
    if fmt == "jsonl":
        lines = [line for line in data.splitlines() if line.strip()]
        if not lines:
            raise ValueError("empty")
        data = lines[-1]
    doc = json.loads(data)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    return doc


def run_tool(p):
    """(failure message or None, result). Standard library only."""
    out = {"step": "bench_tool", "runs": [], "version": None, "settings": None}
    if p.get("version_url"):
        doc = _get_json(p["version_url"])
        if isinstance(doc, dict) and doc.get(p.get("version_key") or "version") is not None:
            out["version"] = str(doc[p.get("version_key") or "version"])
    if p.get("info_url"):
        info = _get_json(p["info_url"])
        out["settings"] = redact_tree(info, p.get("secret") or []) if isinstance(info, dict) else None
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in (p.get("env") or {}).items()})
    deadline = time.monotonic() + int(p.get("timeout_s", 1800))
    for run in p["runs"]:
        rdir = p["result_dir"]
        argv = [str(a).replace("{result_dir}", rdir) for a in run["argv"]]
        path = str(run["result_path"]).replace("{result_dir}", rdir)
        left = deadline - time.monotonic()
        if left <= 0:
            return "the engine's bench tool ran past timeout_s before concurrency %s" % run["concurrency"], out
        if os.path.lexists(path):
            os.unlink(path)
        started = time.monotonic()
        try:
            proc = subprocess.run(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=left,
                check=False,
            )
        except FileNotFoundError:
            return (
                "the engine's bench tool is not installed on this host: %s not found; install it next to the "
                "engine or use the built-in client (bench --tool builtin)" % argv[0]
            ), out
        except subprocess.TimeoutExpired:
            return "the engine's bench tool ran past timeout_s at concurrency %s" % run["concurrency"], out
        wall = time.monotonic() - started
        text = proc.stdout.decode("utf-8", "replace")
        if proc.returncode != 0:
            hint = ""
            if "No module named" in text:
                hint = " (the engine's bench tool is not installed next to the engine; use bench --tool builtin)"
            return (
                "%s exited %d at concurrency %s%s: %s"
                % (" ".join(argv[:3]), proc.returncode, run["concurrency"], hint, _tail(text))
            ), out
        try:
            doc = _read_result(path, p.get("result_format") or "json")
        except (OSError, ValueError) as exc:
            return ("%s wrote no readable result at %s (%s): %s" % (" ".join(argv[:3]), path, exc, _tail(text))), out
        finally:
            if os.path.lexists(path):
                os.unlink(path)
        out["runs"].append(
            {
                "concurrency": run["concurrency"],
                "num_prompts": run.get("num_prompts"),
                "wall_s": round(wall, 3),
                "result": _scalars(doc),
            }
        )
    return None, out


def main():
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec=dict(
            runs=dict(type="list", elements="dict", required=True),
            result_dir=dict(type="path", required=True),
            result_format=dict(type="str", choices=["json", "jsonl"], default="json"),
            env=dict(type="dict", default={}),
            timeout_s=dict(type="int", default=1800),
            version_url=dict(type="str", default=""),
            version_key=dict(type="str", default="version"),
            info_url=dict(type="str", default=""),
            secret=dict(type="list", elements="str", default=[], no_log=False),
        ),
        supports_check_mode=False,
    )
    failure, out = run_tool(module.params)
    if failure:
        module.fail_json(msg=failure, **out)
    module.exit_json(changed=False, **out)


if __name__ == "__main__":
    main()

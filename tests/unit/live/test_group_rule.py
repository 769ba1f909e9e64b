"""The cross-rank rule: every single-rank mismatch is found, allow-listed differences are not, and a follower
whose process is down is reported though its health endpoint answers 200."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from knobfleet.engines.adapter import engine as adapter
from knobfleet.groups import parse
from knobfleet.live.groups import (
    GROUP_MISMATCH,
    GROUP_RANK_DOWN,
    RankState,
    check,
    from_probe,
    from_rendered,
    with_reports,
)

ADDR = {f"lab{i}": f"127.0.1.{i}" for i in range(1, 5)}
TP = parse({"a": {"members": {"lab1": 0, "lab2": 1}}}, ADDR)[0]
PD = parse({"p": {"kind": "pd", "members": {"lab3": "prefill", "lab4": "decode"}}}, ADDR)[0]

BASE = RankState(
    env={
        "SGLANG_SM120_MMA_TARGET_CTAS": "512",
        "SGLANG_SM120_MMA_BLOCK_H": "32",
        "NCCL_SOCKET_IFNAME": "eth0",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
        "QUANT_CONFIG": "fp8",
    },
    flags={"tp-size": "8", "nnodes": "2", "node-rank": "0", "dist-init-addr": "127.0.1.1:5000", "host": "127.0.1.1"},
    model_path="/models/dsv4",
    engine_version="0.5.23",
)


def _env(**kv: str | None) -> RankState:
    env = dict(BASE.env)
    for k, v in kv.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return replace(BASE, env=env)


def _flags(**kv: Any) -> RankState:
    flags = dict(BASE.flags)
    for k, v in kv.items():
        k = k.replace("_", "-")
        if v is None:
            flags.pop(k, None)
        else:
            flags[k] = v
    return replace(BASE, flags=flags)


FOLLOWER_OK = _flags(node_rank="1", host="127.0.1.2")
MISMATCHES = [
    ("env knob value", _env(SGLANG_SM120_MMA_TARGET_CTAS="768"), "SGLANG_SM120_MMA_TARGET_CTAS"),
    ("env knob unset on the follower", _env(SGLANG_SM120_MMA_BLOCK_H=None), "SGLANG_SM120_MMA_BLOCK_H"),
    ("quant config on the head only", _env(QUANT_CONFIG=None), "QUANT_CONFIG"),
    ("an extra env var on the follower", _env(SGLANG_ENABLE_TORCH_COMPILE="1"), "SGLANG_ENABLE_TORCH_COMPILE"),
    ("env value case", _env(QUANT_CONFIG="FP8"), "QUANT_CONFIG"),
    ("env value trailing space", _env(QUANT_CONFIG="fp8 "), "QUANT_CONFIG"),
    ("tp size", _flags(node_rank="1", tp_size="4"), "--tp-size"),
    ("nnodes", _flags(node_rank="1", nnodes="3"), "--nnodes"),
    ("dist-init-addr", _flags(node_rank="1", dist_init_addr="127.0.1.2:5000"), "--dist-init-addr"),
    ("a boolean flag on one rank", _flags(node_rank="1", disable_overlap_schedule=True), "--disable-overlap-schedule"),
    ("a flag missing on one rank", _flags(node_rank="1", tp_size=None), "--tp-size"),
    ("attention backend", _flags(node_rank="1", attention_backend="triton"), "--attention-backend"),
    ("kv cache dtype", _flags(node_rank="1", kv_cache_dtype="fp8_e5m2"), "--kv-cache-dtype"),
    ("quantization flag", _flags(node_rank="1", quantization="fp8"), "--quantization"),
    ("model path", replace(FOLLOWER_OK, model_path="/models/dsv4-old"), "model path"),
    ("model path unset", replace(FOLLOWER_OK, model_path=None), "model path"),
    ("engine version (package file)", replace(FOLLOWER_OK, engine_version="0.5.22"), "engine version"),
    ("engine version unreadable", replace(FOLLOWER_OK, engine_version=None), "engine version"),
    ("mem fraction", _flags(node_rank="1", mem_fraction_static="0.8"), "--mem-fraction-static"),
    ("chunked prefill", _flags(node_rank="1", chunked_prefill_size="4096"), "--chunked-prefill-size"),
    ("max running requests", _flags(node_rank="1", max_running_requests="64"), "--max-running-requests"),
    ("ep size", _flags(node_rank="1", ep_size="8"), "--ep-size"),
]
ALLOWED = [
    ("NIC name", _env(NCCL_SOCKET_IFNAME="eth1")),
    ("visible devices", _env(CUDA_VISIBLE_DEVICES="4,5,6,7")),
    ("gloo NIC set on one rank only", _env(GLOO_SOCKET_IFNAME="eth1")),
    ("its own listen address and rank", FOLLOWER_OK),
    ("headless follower", _flags(node_rank="1", headless=True)),
]


@pytest.mark.parametrize(("what", "follower", "name"), MISMATCHES, ids=[m[0] for m in MISMATCHES])
def test_every_single_rank_mismatch_is_found(what: str, follower: RankState, name: str) -> None:
    findings = check(TP, {"lab1": BASE, "lab2": follower})
    assert [(f["kind"], f["host"], f["name"]) for f in findings] == [(GROUP_MISMATCH, "lab2", name)], what
    assert findings[0]["message"].startswith("group a: rank 1 (lab2) ")
    assert "rank 0 (lab1) has" in findings[0]["message"]


@pytest.mark.parametrize(("what", "follower"), ALLOWED, ids=[a[0] for a in ALLOWED])
def test_allow_listed_differences_are_not_findings(what: str, follower: RankState) -> None:
    assert check(TP, {"lab1": BASE, "lab2": follower}) == [], what


def test_the_detection_rate_over_the_injected_mismatches() -> None:
    found = sum(bool(check(TP, {"lab1": BASE, "lab2": f})) for _, f, _ in MISMATCHES)
    false = sum(bool(check(TP, {"lab1": BASE, "lab2": f})) for _, f in ALLOWED)
    assert (found, len(MISMATCHES), false) == (len(MISMATCHES), 22, 0)


def test_a_down_follower_is_reported_whatever_its_health_says() -> None:
    stopped = replace(FOLLOWER_OK, alive=False)
    (f,) = check(TP, {"lab1": BASE, "lab2": stopped})
    assert f["kind"] == GROUP_RANK_DOWN
    assert f["message"] == (
        "group a: rank 1 (lab2) is down: its engine process is not running (its health endpoint proves nothing)"
    )
    absent = replace(FOLLOWER_OK, joined=False)
    assert "rank 0 (lab1) reports it absent" in check(TP, {"lab1": BASE, "lab2": absent})[0]["message"]


def test_prefill_and_decode_share_only_what_the_pair_needs() -> None:
    prefill = _flags(chunked_prefill_size="8192", disaggregation_mode="prefill")
    decode = _flags(disaggregation_mode="decode")
    assert check(PD, {"lab3": prefill, "lab4": decode}) == []
    (f,) = check(PD, {"lab3": prefill, "lab4": replace(decode, flags={**decode.flags, "tp-size": "4"})})
    assert f["message"] == "group p: decode 0 (lab4) flag --tp-size: prefill 0 (lab3) has '8', decode 0 (lab4) has '4'"


# --- what a rank runs, from its probe document, its render, and rank 0's report ------------------------------


CLEAN = json.loads((Path(__file__).parent / "verify_cases" / "clean" / "probe.json").read_text())
SGLANG = adapter("sglang").rules()


def rank_doc(rank: int, host: str, **env: str) -> dict[str, Any]:
    doc = copy.deepcopy(CLEAN)
    main = doc["processes"][0]
    main["cmdline"] = [
        *[a for a in main["cmdline"] if not a.startswith("--host=")],
        f"--host={host}",
        "--nnodes=2",
        f"--node-rank={rank}",
        "--dist-init-addr=127.0.1.1:5000",
    ]
    main["env"] = {**main["env"], "INVOCATION_ID": f"inv{rank}", "SYSTEMD_EXEC_PID": str(100 + rank), **env}
    doc["engine_version"] = "0.5.0-sim"
    return doc


def test_a_probe_reads_as_the_ranks_env_flags_model_and_version() -> None:
    s = from_probe(rank_doc(1, "127.0.1.2"), SGLANG)
    assert s.alive and s.model_path == "/models/DeepSeek-V4-sim" and s.engine_version == "0.5.0-sim"
    assert s.flags["node-rank"] == "1" and "model-path" not in s.flags
    assert "INVOCATION_ID" not in s.env and s.env["SGLANG_SM120_MMA_TARGET_CTAS"]


def test_two_clean_ranks_agree_despite_systemd_and_per_rank_differences() -> None:
    states = {
        "lab1": from_probe(rank_doc(0, "127.0.1.1"), SGLANG),
        "lab2": from_probe(rank_doc(1, "127.0.1.2"), SGLANG),
    }
    assert check(TP, states) == []


def test_a_hand_edit_on_one_rank_is_a_group_mismatch() -> None:
    states = {
        "lab1": from_probe(rank_doc(0, "127.0.1.1"), SGLANG),
        "lab2": from_probe(rank_doc(1, "127.0.1.2", SGLANG_SM120_MMA_TARGET_CTAS="768"), SGLANG),
    }
    (f,) = check(TP, states)
    assert f["kind"] == GROUP_MISMATCH and f["host"] == "lab2" and f["name"] == "SGLANG_SM120_MMA_TARGET_CTAS"
    assert f["severity"] == "error" and "rank 1 (lab2)" in f["message"]


@pytest.mark.parametrize(("state", "alive"), [("S", True), ("T", False), ("Z", False)])
def test_a_stopped_or_zombie_rank_is_down(state: str, alive: bool) -> None:
    doc = rank_doc(1, "127.0.1.2")
    doc["processes"][0]["state"] = state
    assert from_probe(doc, SGLANG).alive is alive


def test_rank_0s_report_decides_whether_a_follower_joined() -> None:
    head = rank_doc(0, "127.0.1.1")
    head["server_info"] = {"ranks": [{"rank": 1, "joined": False, "address": None, "fingerprint": None}]}
    states = {"lab1": from_probe(head, SGLANG), "lab2": from_probe(rank_doc(1, "127.0.1.2"), SGLANG)}
    got = check(TP, with_reports(TP, states))
    assert [f["kind"] for f in got] == [GROUP_RANK_DOWN]
    assert "reports it absent" in got[0]["message"]
    head["server_info"]["ranks"][0]["joined"] = True
    states["lab1"] = from_probe(head, SGLANG)
    assert check(TP, with_reports(TP, states)) == []


def test_a_render_reads_like_a_probe() -> None:
    argv = ["python3", "-m", "sglang_sim.launch_server", "--model-path=/m", "--host=127.0.1.2", "--node-rank=1"]
    s = from_rendered({"A": "1"}, argv, SGLANG, "1.0")
    assert s.model_path == "/m" and s.flags["node-rank"] == "1" and s.engine_version == "1.0"


@pytest.mark.parametrize(
    "name",
    # names that share a prefix (or a suffix) with an allow-listed one: each must still be compared exactly
    ["NCCL_ALGO", "NCCL_SOCKET_NTHREADS", "NCCL_IB_TIMEOUT", "CUDA_VISIBLE_DEVICES_ORDER", "GLOO_SOCKET_IFNAMES",
     "HOSTNAME_SUFFIX", "XCUDA_VISIBLE_DEVICES"],
)  # fmt: skip
def test_the_allow_list_matches_whole_names_only(name: str) -> None:
    """A mutation-audit survivor: an allow-list matched by prefix let ranks that differ in NCCL_ALGO pass."""
    a, b = _env(**{name: "Ring"}), _env(**{name: "Tree"})
    found = check(TP, {"lab1": a, "lab2": b})
    assert [(f["kind"], f["name"], f["expected"], f["actual"]) for f in found] == [
        (GROUP_MISMATCH, name, "Ring", "Tree")
    ]
    allowed = check(TP, {"lab1": _env(NCCL_SOCKET_IFNAME="eth0"), "lab2": _env(NCCL_SOCKET_IFNAME="ib0")})
    assert allowed == []

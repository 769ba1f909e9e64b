"""The campaign's own engine end to end: real SGLang 0.5.23 (CPU path, knobfleet's placeholder sgl_kernel, the
tiny local model) on two lab hosts behind SGLang's router, managed by knobfleet.

What real SGLang does that the stand-in did not, each of which this module meets (docs/SGLANG.md): its scheduler
and detokenizer rename themselves and blank their environ, and they and its resource tracker carry five variables
SGLang sets itself; it reports 556 server settings on /get_server_info but not its environment; its ITL histogram
fills only from streamed requests; it exports no process_start_time_seconds; its bench_serving's "random"
dataset would download ShareGPT. Every check of /proc here is the test's own, over SSH, not knobfleet's. Each
engine start is a real SGLang start (~25-60 s here), so the module keeps to few restarts; one lab serves it all."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from knobfleet.fleet.router_kinds import SGLangRouter
from knobfleet.lab import loadgen
from knobfleet.lab.hostfiles import SGLANG_PORT, SGLANG_SCRIPT_PATH, SGLANG_SERVICE
from knobfleet.lab.nspawn import Lab
from knobfleet.lab.router_lab import LabRouter, download_attempts
from knobfleet.lab.sgl_kernel_placeholder import MARK
from knobfleet.profiles.store import ProfileStore
from tests.integration.conftest import Fleet, addr, empty_panels, lab_path, start_load, touch_later_sh

HOSTS = ["lab1", "lab2"]
PROFILES = Path(__file__).resolve().parents[2] / "profiles"


def healthy(hosts: list[str], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    pending = list(hosts)
    while pending and time.monotonic() < deadline:
        for host in list(pending):
            try:
                with urllib.request.urlopen(f"http://{addr(host)}:{SGLANG_PORT}/health", timeout=2) as r:
                    if r.status == 200:
                        pending.remove(host)
            except OSError:
                pass
        time.sleep(1)
    return not pending


@pytest.fixture(scope="module")
def sfleet(lab_state: Path) -> Iterator[Fleet]:
    lab = Lab(lab_path(lab_state))
    lab.down()
    lab.up(len(HOSTS), router=True, sglang=tuple(HOSTS))  # the router waits until both are ready (up to 300 s)
    assert healthy(HOSTS, 300), "the hand-written SGLang services never became healthy"
    yield Fleet(lab, None, HOSTS)
    lab.down()


def kf(fleet: Fleet, *args: str, check: bool = False, timeout: int = 900) -> Any:
    return fleet.knobfleet(*args, check=check, timeout=timeout)


def main_pid(fleet: Fleet, host: str) -> int:
    return int(fleet.ssh(host, f"systemctl show -p MainPID --value {SGLANG_SERVICE}").stdout)


def proc_lines(fleet: Fleet, host: str, pid: int, what: str) -> list[str]:
    """/proc/PID/{environ,cmdline} as the test reads it itself, one entry a line."""
    return fleet.ssh(host, f"tr '\\0' '\\n' < /proc/{pid}/{what}").stdout.splitlines()


def processes(fleet: Fleet, host: str) -> dict[int, str]:
    """pid -> comm of the engine's main process and every descendant (from ps, as the test sees them)."""
    main = main_pid(fleet, host)
    rows = [ln.split(None, 2) for ln in fleet.ssh(host, "ps -e -o pid=,ppid=,comm=").stdout.splitlines()]
    parent = {int(pid): int(ppid) for pid, ppid, _ in rows}
    comm = {int(pid): c.strip() for pid, _, c in rows}

    def under(pid: int) -> bool:
        while pid > 1:
            if pid == main:
                return True
            pid = parent.get(pid, 0)
        return False

    return {pid: comm[pid] for pid in comm if under(pid)}


def server_info(host: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{addr(host)}:{SGLANG_PORT}/get_server_info", timeout=10) as r:
        data: dict[str, Any] = json.loads(r.read())
    return data


def in_sync(fleet: Fleet, *hosts: str) -> dict[str, Any]:
    """verify exits 0 with no finding on every host; the report, for more checks."""
    args = ["verify", "--json"] + (["--limit", ",".join(hosts)] if hosts else [])
    proc = kf(fleet, *args)
    kinds = {f["kind"] for h in json.loads(proc.stdout or '{"hosts": []}')["hosts"] for f in h["findings"]}
    if proc.returncode != 0 and kinds == {"not_ready"}:
        # /health_generate generates a token on every probe, and real SGLang on 2 shared cores can take longer than
        # the probe's 2 s bound to answer it (docs/TESTING.md saw it once under load): a second look, once, later
        print(f"verify: not_ready only ({proc.stdout[-600:]}); verifying again in 5 s")
        time.sleep(5)
        proc = kf(fleet, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    assert all(h["findings"] == [] and h["status"] == "in_sync" for h in doc["hosts"]), doc
    return doc


def check_proc_against_profile(fleet: Fleet, host: str, profile: str) -> None:
    """The test's own reading of /proc: every env var and flag of the resolved profile on the main process;
    the renamed children's environ blanked (so the main PID is the one a verifier must read)."""
    resolved = ProfileStore(PROFILES).resolve(profile)
    pid = main_pid(fleet, host)
    env = dict(line.partition("=")[::2] for line in proc_lines(fleet, host, pid, "environ"))
    for name, value in resolved.env.items():
        assert env.get(name) == str(value), (host, name, env.get(name))
    assert env.get("SGLANG_USE_CPU_ENGINE") == "1" and env.get("HF_HUB_OFFLINE") == "1"
    argv = proc_lines(fleet, host, pid, "cmdline")
    assert argv[1:3] == ["-m", "sglang.launch_server"], argv
    for flag, value in resolved.args.items():
        want = f"--{flag}" if value is True else f"--{flag}={value}"
        assert want in argv, (host, want, argv)
    procs = processes(fleet, host)
    renamed = [p for p, c in procs.items() if c.startswith("sglang::")]
    assert {procs[p][:15] for p in renamed} >= {"sglang::schedul", "sglang::detoken"}, procs
    for child in renamed:
        child_env = proc_lines(fleet, host, child, "environ")
        assert not any(line.startswith("SGLANG_USE_CPU_ENGINE=") for line in child_env), (child, child_env)


def matches_server_info(host: str, profile: str) -> list[str]:
    """Every flag of the resolved profile that /get_server_info reports: its value there (the engine's own word).
    Returns the flags checked."""
    resolved = ProfileStore(PROFILES).resolve(profile)
    info = server_info(host)
    checked = []
    for flag, value in resolved.args.items():
        key = flag.replace("-", "_")
        if key in info:
            assert str(info[key]).lower() == str(value).lower(), (host, flag, value, info[key])
            checked.append(flag)
    return checked


def placeholder_calls(fleet: Fleet, host: str, since: str) -> list[str]:
    out = fleet.ssh(
        host, f"journalctl -u {SGLANG_SERVICE} --since '{since}' --no-pager -o cat | grep -F '{MARK}' || true"
    )
    return out.stdout.splitlines()


def stop_seconds(fleet: Fleet, host: str, since: str) -> list[float]:
    """How long each stop of the engine took, from systemd's own journal lines (Stopping ... -> Stopped/Deactivated);
    fails if systemd had to SIGKILL anything (TimeoutStopSec reached)."""
    log = fleet.ssh(host, f"journalctl -u {SGLANG_SERVICE} --since '{since}' --no-pager -o short-unix").stdout
    assert "timed out. Killing" not in log, log[-2000:]
    out, began = [], None
    for line in log.splitlines():
        stamp, _, text = line.partition(" ")
        if "Stopping " in text:
            began = float(stamp)
        elif began is not None and ("Deactivated successfully" in text or re.search(r"Stopped .*\.service", text)):
            out.append(round(float(stamp) - began, 1))
            began = None
    return out


def load_through_router(
    fleet: Fleet, seconds: float, rate: float = 2.0
) -> tuple[threading.Thread, list[loadgen.Record], threading.Event]:
    lr = LabRouter(fleet.lab.dir)
    model = fleet.lab.router_model_dir()
    assert model
    # every third request non-streaming: with stream_every=2 the round-robin router sent every stream to one
    # host and none to the other, whose ITL histogram (filled from streams only) stayed empty
    spec = loadgen.LoadSpec(lr.url, model, rate=rate, max_requests=int(rate * seconds) + 10, max_seconds=seconds,
                            max_tokens=32, stream_every=3, timeout_s=120.0)  # fmt: skip
    return start_load(spec)


def none_failed(records: list[loadgen.Record]) -> dict[str, object]:
    bad = [(r.index, r.outcome, r.status, r.detail) for r in records if r.outcome != "ok"]
    assert bad == [], bad
    return loadgen.summarize(records)


def test_the_lab_runs_real_sglang_from_local_files_only(sfleet: Fleet) -> None:
    """The hand-written unit runs real SGLang (not the stand-in) with its renamed children; knobfleet sees it as
    unmanaged; the router loaded its tokenizer from the local model and nothing tried a hub; the placeholder
    kernel package is the one SGLang imported."""
    report = json.loads(kf(sfleet, "drift", "--json").stdout)
    assert [[f["kind"] for f in h["findings"]] for h in report["hosts"]] == [["unmanaged"], ["unmanaged"]], report
    for host in HOSTS:
        info = server_info(host)
        assert (info["version"], info["device"], info["tp_size"]) == ("0.5.23", "cpu", 1), info["version"]
        assert info["attention_backend"] == "torch_native" and info["max_total_num_tokens"] == 65536
        comms = set(processes(sfleet, host).values())
        assert {"sglang::schedul", "sglang::detoken"} <= comms, comms
    python = proc_lines(sfleet, "lab1", main_pid(sfleet, "lab1"), "cmdline")[0]  # the venv's (exe is its base)
    version = sfleet.ssh("lab1", f"{python} -c 'import sgl_kernel; print(sgl_kernel.__version__)'").stdout.strip()
    assert version.endswith("+knobfleet.placeholder"), version
    router = SGLangRouter(LabRouter(sfleet.lab.dir).url)
    assert sorted(w.url for w in router.list_workers() if w.healthy) == sorted(
        f"http://{addr(h)}:{SGLANG_PORT}" for h in HOSTS
    )
    assert download_attempts(LabRouter(sfleet.lab.dir).log.read_text(errors="replace")) == []


def test_apply_adopts_the_hand_written_units_under_load_through_the_router(sfleet: Fleet) -> None:
    """`plan`, then a plain `apply sglang-sched` (real knobs: --max-running-requests 8, --chunked-prefill-size 512,
    --schedule-policy lpm, SGLANG_TIMEOUT_KEEP_ALIVE, SGLANG_WARMUP_TIMEOUT) behind the router under constant load:
    each host's hand-written files adopted as generation 0, the host drained (SGLang's own running+queued gauges
    read 0), stopped, restarted, verified and put back; no request fails. The test's own /proc reading and
    /get_server_info agree with the profile; verify and drift find nothing (SGLang's five own variables in its
    children are no finding); systemd never had to SIGKILL SGLang (its SIGTERM path: a watchdog that polls every
    5 s, then stops the children)."""
    plan = kf(sfleet, "plan", "sglang-sched")
    assert plan.returncode == 2 and "would install" in plan.stdout, plan.stdout
    since = sfleet.ssh("lab1", "date '+%Y-%m-%d %H:%M:%S'").stdout.strip()
    load, records, stop = load_through_router(sfleet, seconds=400.0)
    try:
        time.sleep(3)
        proc = kf(sfleet, "apply", "sglang-sched", "--yes", "--json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        time.sleep(3)
    finally:
        stop.set()
        load.join(timeout=200)
    doc = json.loads(proc.stdout)
    assert [(h["status"], h["batch"], h["live"]["ok"]) for h in doc["hosts"]] == [
        ("applied", 1, True),
        ("applied", 2, True),
    ]
    print("apply sglang-sched: start-to-ready " + ", ".join(f"{h['host']} {h['ready_s']:.1f}s" for h in doc["hosts"]))
    summary = none_failed(records)
    print(f"rolling apply under load through the router: {summary}")
    assert summary["sent"] >= 40
    for host in HOSTS:
        check_proc_against_profile(sfleet, host, "sglang-sched")
        checked = matches_server_info(host, "sglang-sched")
        assert set(checked) == {"max-running-requests", "chunked-prefill-size", "schedule-policy"}, checked
        stops = stop_seconds(sfleet, host, since)
        print(f"{host}: SGLang stopped on SIGTERM in {stops} s")
        assert len(stops) == 1
    hist = json.loads(kf(sfleet, "history", "--json").stdout)["hosts"]
    assert all([g["status"] for g in h["generations"] if g["number"] == 0] == ["adopted"] for h in hist), hist
    in_sync(sfleet)
    assert kf(sfleet, "drift").returncode == 0
    assert all(w.healthy for w in SGLangRouter(LabRouter(sfleet.lab.dir).url).list_workers())


def test_bench_with_both_tools_and_the_consistency_check(sfleet: Fleet) -> None:
    """knobfleet's client and SGLang's own bench_serving (random-ids: nothing downloaded) both measure; the
    consistency check compares every output. Real SGLang on this CPU is not batch-invariant (its deterministic
    mode refuses the CPU attention backend): batched greedy outputs of the tiny near-tie model diverge from serial
    ones (8-25 of 32 at 64 tokens here, docs/SGLANG.md), so the check runs and reports, error-free. No placeholder
    kernel op was called while serving any of it."""
    since = sfleet.ssh("lab1", "date -d '-30 min' '+%Y-%m-%d %H:%M:%S'").stdout.strip()
    own = kf(sfleet, "bench", "--limit", "lab1", "--conc", "2,4", "--n-mult", "2", "--max-tokens", "16", "--json")
    assert own.returncode == 0, own.stdout + own.stderr
    doc = json.loads(own.stdout)
    assert doc["errors"] == 0 and [b["concurrency"] for b in doc["buckets"]] == [2, 4], doc
    assert all(b["mean"] > 0 for b in doc["buckets"]), doc
    engine = kf(sfleet, "bench", "--limit", "lab1", "--tool", "engine", "--conc", "2", "--n-mult", "2",
                "--max-tokens", "16", "--input-len", "32", "--json")  # fmt: skip
    assert engine.returncode == 0, engine.stdout + engine.stderr
    edoc = json.loads(engine.stdout)
    assert edoc["tool"] == "sglang.bench_serving" and edoc["engine_version"] == "0.5.23", edoc
    assert edoc["errors"] == 0 and edoc["buckets"][0]["mean"] > 0, edoc
    assert '"schedule_policy": "lpm"' in json.dumps(edoc["settings"]), str(edoc["settings"])[:400]
    cons = kf(sfleet, "bench", "--limit", "lab1", "--consistency", "--conc", "4", "--max-tokens", "16", "--json")
    result = json.loads(cons.stdout)
    print(f"consistency on real SGLang: {result['diverged']} of {result['compared']} diverged")
    assert result["compared"] == 32 and result["errors"] == 0, result
    assert cons.returncode == (0 if result["passed"] else 1), cons.stdout + cons.stderr
    for host in HOSTS:
        assert placeholder_calls(sfleet, host, since) == []


def test_a_canary_judged_from_real_sglang_metrics(sfleet: Fleet) -> None:
    """canary sglang-tiny --advisory on lab1 (both on sglang-sched), lab2 the baseline, Prometheus scraping SGLang's
    own /metrics and the router's: every window measured from real series (streamed requests fill the ITL
    histogram), the pre-period counted, a verdict given with the command for it and nothing done after the canary
    apply (advisory: the canaries stay on the profile), its record kept, no request failed. (A verdict acted on is
    the stand-in's test, tests/integration/test_router.py: on 2 shared cores real SGLang's windows are too noisy
    for a verdict other than inconclusive in a lab-sized run, docs/SGLANG.md.)"""
    from knobfleet.lab import monitoring
    from knobfleet.telemetry.promconfig import Target

    monitoring.start_for_lab(sfleet.lab, [Target("router", LabRouter(sfleet.lab.dir).metrics_address, "router")])
    # 2 requests/s: at 3 the two CPU engines queued faster than they served while the other shard ran (p99 TTFT
    # 95 s), and the canary apply's drain of lab1 timed out with 22 requests still queued (30 s, the lab's
    # knob_drain_timeout; the fresh-clone run of 0.2.6 and its repeat). 45 s windows still give each side ~45.
    load, records, stop = load_through_router(sfleet, seconds=720.0, rate=2.0)
    try:
        # a few scrapes of both engines first; 45 s windows: at 20 s one baseline window finished 18 of the 20
        # requests a side needs (3 requests/s through the router, SGLang on 2 shared cores), and at 30 s, with the
        # other shard's lab busy beside it, one canary window finished 18 (the fresh-clone sharded run of 0.2.4).
        # The canary's own rule (20 a side in each window) is unchanged: the window is long enough for it.
        time.sleep(8)
        # the difference-in-differences design: what this test holds is real SGLang's series behind every window;
        # the crossover's swap would add two real SGLang restarts on 2 shared cores (the stand-in's test holds it)
        # --warmup-windows 0: two windows leave the warm-up rule no room (a held window needs a next one), and real
        # SGLang's windows on 2 shared cores differ by more than its 5% from one to the next (docs/SGLANG.md)
        args = ["--hosts", "1", "--window", "45s", "--pre-windows", "2", "--min-windows", "2", "--max-windows", "2",
                "--design", "did", "--warmup-windows", "0"]  # fmt: skip
        proc = kf(sfleet, "canary", "sglang-tiny", "--advisory", *args, "--yes", "--json", timeout=900)
        assert proc.stdout.strip(), proc.stderr
        doc = json.loads(proc.stdout)
        # real SGLang's own series behind every panel of its version's dashboard, after the canary's traffic
        from knobfleet.telemetry.prom import Prometheus

        empty = empty_panels(Prometheus(monitoring.prometheus_url(sfleet.lab.dir)), "sglang-0.5.23.json")
        assert empty == [], "\n".join(empty)
    finally:
        stop.set()
        load.join(timeout=200)
        monitoring.stop(sfleet.lab.dir)
    print({k: doc.get(k) for k in ("verdict", "intervals", "windows_pre", "followup")})
    assert doc["canaries"] == ["lab1"] and doc["baseline"] == ["lab2"], doc
    assert doc["windows_pre"] >= 2, (doc.get("reason"), doc.get("notes"), proc.stderr[-1500:])
    assert proc.returncode == {"promote": 0, "rollback": 1}.get(doc["verdict"], 2), proc.stdout + proc.stderr
    rows = [w for w in doc["windows"] if "skipped" not in w]
    assert len(rows) >= 2, doc["windows"]
    for row in rows:
        for metric in ("tput", "itl"):
            assert set(row["values"][metric]) == set(HOSTS) and all(v > 0 for v in row["values"][metric].values())
    hist = json.loads(kf(sfleet, "history", "--json").stdout)["hosts"]
    on = {h["host"]: next(g["profile"] for g in h["generations"] if g["number"] == h["current"]) for h in hist}
    assert on == {"lab1": "sglang-tiny", "lab2": "sglang-sched"}, (doc["verdict"], on)
    assert doc["advisory"] and doc["followup"].startswith("advisory: the canaries (lab1) left on sglang-tiny"), doc
    assert "`knobfleet rollback --limit lab1 --yes`" in doc["followup"], doc["followup"]
    listed = kf(sfleet, "history", "--canaries")
    assert listed.returncode == 0 and "sglang-tiny" in listed.stdout and "(advisory)" in listed.stdout, listed.stdout
    in_sync(sfleet)
    none_failed(records)


def test_a_hand_edit_is_named_by_drift_and_rollback_restores(sfleet: Fleet) -> None:
    edit = f"sed -i 's/--chunked-prefill-size=[0-9]*/--chunked-prefill-size=1024/' {SGLANG_SCRIPT_PATH}"
    sfleet.ssh("lab2", f"{edit} && {touch_later_sh(SGLANG_SCRIPT_PATH)}")
    report = json.loads(kf(sfleet, "drift", "--json", "--limit", "lab2").stdout)
    kinds = {f["kind"] for f in report["hosts"][0]["findings"]}
    assert kinds == {"file_changed", "stale_process"}, report
    hist = json.loads(kf(sfleet, "history", "--json", "--limit", "lab2").stdout)["hosts"][0]
    current = hist["current"]
    back = kf(sfleet, "rollback", "--limit", "lab2", "--yes")
    assert back.returncode == 0, back.stdout + back.stderr
    now = json.loads(kf(sfleet, "history", "--json", "--limit", "lab2").stdout)["hosts"][0]["current"]
    assert now != current
    in_sync(sfleet, "lab2")


def test_a_profile_sglang_rejects_at_start_is_restored_and_verified(sfleet: Fleet, tmp_path: Path) -> None:
    """A start real SGLang refuses: a placeholder kernel op called while it builds its KV pool (n-gram speculative
    decoding copies KV with sgl_kernel on the CPU). It ends restored to the previous generation and verified, the
    engine's own last error (the op's name) in the one-line failure. (SGLang's own argument check refusing a start,
    --enable-deterministic-inference on the CPU backend, reads the same way: docs/SGLANG.md.)"""
    (tmp_path / "sglang-tiny.yaml").write_text((PROFILES / "sglang-tiny.yaml").read_text())
    bad = {
        "sglang-ngram": ("speculative-algorithm: NGRAM", "NotImplementedError: sgl_kernel.copy_all_layer_kv_cache_cpu")
    }
    for name, (arg, said) in bad.items():
        (tmp_path / f"{name}.yaml").write_text(f"name: {name}\nversion: 1\nextends: sglang-tiny\nargs:\n  {arg}\n")
        before = json.loads(kf(sfleet, "history", "--json", "--limit", "lab1").stdout)["hosts"][0]["current"]
        proc = kf(sfleet, "apply", str(tmp_path / f"{name}.yaml"), "--limit", "lab1", "--yes")
        assert proc.returncode == 1, proc.stdout + proc.stderr
        text = proc.stdout + proc.stderr
        assert said in text and "the engine's last error" in text, text
        assert f"restored: lab1 is back on generation {before:04d}" in text and "verified" in text, text
        in_sync(sfleet, "lab1")


def test_two_tensor_parallel_ranks_on_one_host_then_rollback_to_the_hand_written_unit(sfleet: Fleet) -> None:
    """--tp-size 2 on one CPU host (two OpenMP core lists, PyNccl off): two renamed scheduler ranks, each with a
    blanked environ; verify in sync; SGLang reports tp_size 2. Then `rollback --to 0`: the adopted hand-written
    script (space-separated flags) runs again and verifies."""
    proc = kf(sfleet, "apply", "sglang-tp2", "--limit", "lab1", "--yes", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    comms = sorted(processes(sfleet, "lab1").values())
    assert comms.count("sglang::schedul") == 2, comms
    titles = sfleet.ssh("lab1", "ps -e -o args= | grep -o 'sglang::scheduler_TP[01]' | sort -u").stdout.split()
    assert titles == ["sglang::scheduler_TP0", "sglang::scheduler_TP1"], titles
    check_proc_against_profile(sfleet, "lab1", "sglang-tp2")
    assert set(matches_server_info("lab1", "sglang-tp2")) == {"schedule-policy", "chunked-prefill-size", "tp-size"}
    in_sync(sfleet, "lab1")
    zero = kf(sfleet, "rollback", "--limit", "lab1", "--to", "0", "--yes")
    assert zero.returncode == 0, zero.stdout + zero.stderr
    in_sync(sfleet, "lab1")
    argv = proc_lines(sfleet, "lab1", main_pid(sfleet, "lab1"), "cmdline")  # the hand-written line, space-separated
    assert "--max-total-tokens" in argv and "65536" in argv and not any(a.startswith("--schedule-policy") for a in argv)
    assert server_info("lab1")["tp_size"] == 1 and server_info("lab1")["schedule_policy"] == "fcfs"  # SGLang's default

"""The seed replay of `knobfleet ab A B` with the real stand-in engine and the real bench client, no lab.

What `knobfleet ab` does on a lab host, minus systemd and Ansible: each profile switch stops the engine and
starts a new `sglang_sim.launch_server` process with the profile's kernel knobs and the lab's stand-in
settings (SGLANG_SIM_TIME_SCALE 0.25, SGLANG_SIM_STARTUP_S 1.5, default noise); each run is the built-in
bench client (experiment/bench/client.py) at the given buckets over HTTP on loopback; rounds alternate AB, BA
and go through `design.decide` after each round, with the live progress line of `progress.Rounds` (one line
per round on stderr when not a terminal). For a machine without the lab's systemd-nspawn hosts, or one
quieter than a shared lab (the stand-in's throughput needs its own CPU: docs/PERFORMANCE.md).

Usage: python perf/ab_engine_replay.py [--a 512 --b 768] [--conc 48,64,80,96] [--n-mult 4] [--max-tokens 256]
       [--max-rounds 15] [--port 30100] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))

from knobfleet.experiment import stats  # noqa: E402
from knobfleet.experiment.ab import round_found  # noqa: E402
from knobfleet.experiment.design import Decision, Settings, decide, order  # noqa: E402
from knobfleet.progress import Rounds  # noqa: E402

CLIENT = ROOT / "python" / "knobfleet" / "experiment" / "bench" / "client.py"
WEIGHTS = {48: 0.3, 64: 0.3, 80: 0.3, 96: 0.1}


class Engine:
    """One stand-in engine process with a profile's TARGET_CTAS (the lab's serve settings)."""

    def __init__(self, ctas: int, port: int, log: Path) -> None:
        env = dict(os.environ)
        env.update(
            PYTHONPATH=str(ROOT / "python"),
            SGLANG_SIM_GPU="rtx-pro-6000",
            SGLANG_SIM_STARTUP_S="1.5",
            SGLANG_SIM_TIME_SCALE="0.25",
            SGLANG_SM120_MMA_TARGET_CTAS=str(ctas),
            SGLANG_SM120_MMA_BLOCK_H="32",
            SGLANG_OPT_USE_MULTI_STREAM_OVERLAP="0",
        )
        argv = [sys.executable, "-m", "knobfleet.lab.sim.launch_server", "--model-path", "/models/DeepSeek-V4-sim"]
        argv += ["--host", "127.0.0.1", "--port", str(port), "--max-running-requests", "128"]
        self.port = port
        self.log = log.open("ab")
        self.proc = subprocess.Popen(argv, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise SystemExit(f"engine on port {port} not ready after 60 s (log: {log})")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=15)
        self.log.close()


def bench(port: int, conc: str, n_mult: int, max_tokens: int, out: Path) -> dict[int, float]:
    argv = [sys.executable, str(CLIENT), "--url", f"http://127.0.0.1:{port}", "--conc", conc]
    argv += ["--n-mult", str(n_mult), "--max-tokens", str(max_tokens), "--out", str(out)]
    subprocess.run(argv, check=True, capture_output=True, timeout=1800)
    doc = json.loads(out.read_text())
    return {int(b["concurrency"]): float(b["agg_tok_s"]) for b in doc["buckets"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", type=int, default=512, help="profile A's TARGET_CTAS (ctas512)")
    ap.add_argument("--b", type=int, default=768, help="profile B's TARGET_CTAS (ctas768)")
    ap.add_argument("--conc", default="48,64,80,96")
    ap.add_argument("--n-mult", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--max-rounds", type=int, default=15)
    ap.add_argument("--port", type=int, default=30100)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    conc = [int(c) for c in args.conc.split(",")]
    s = Settings(weights={c: WEIGHTS.get(c, 0.25) for c in conc}, max_rounds=args.max_rounds)
    ctas = {"A": args.a, "B": args.b}
    tmp = Path(tempfile.mkdtemp(prefix="ab-replay-"))
    status = Rounds(f"ab ctas{args.a} vs ctas{args.b} (stand-in, no lab)", s.max_rounds)
    per_bucket: dict[int, list[float]] = {c: [] for c in conc}
    runs: list[dict[str, object]] = []
    live: str | None = None
    engine: Engine | None = None
    decision = Decision("continue", "", 0)
    started = time.monotonic()
    try:
        for r in range(s.max_rounds):
            status.start(r + 1, "".join(order(r)))
            got: dict[str, dict[int, float]] = {}
            for arm in order(r):
                if live != arm:
                    if engine is not None:
                        engine.stop()
                    engine, live = Engine(ctas[arm], args.port, tmp / "engine.log"), arm
                got[arm] = bench(args.port, args.conc, args.n_mult, args.max_tokens, tmp / f"r{r}{arm}.json")
                runs.append({"round": r + 1, "arm": arm, "ctas": ctas[arm], "tok_s": got[arm]})
            for c in conc:
                per_bucket[c].append(stats.log_ratio(got["A"][c], got["B"][c]))
            decision = decide(per_bucket, s)
            nxt = "stop" if decision.final else f"round {r + 2}"
            status.done(r + 1, round_found(decision), nxt)
            if decision.final:
                break
    finally:
        if engine is not None:
            engine.stop()
    status.close()
    verdict = {"promote": f"promote ctas{args.b}", "keep": f"keep ctas{args.a}"}.get(decision.verdict, "inconclusive")
    wall = time.monotonic() - started
    print(f"verdict: {verdict} — {decision.reason}")
    print(f"rounds: {decision.rounds}; wall {wall / 60:.1f} min; engine log {tmp / 'engine.log'}")
    for c, (iv, cls) in sorted(decision.buckets.items()):
        print(
            f"  C{c}: B/A {math.expm1(iv.estimate):+.2%} ({math.expm1(iv.low):+.2%} … {math.expm1(iv.high):+.2%}) {cls}"
        )
    for run in runs:
        print(f"  round {run['round']} {run['arm']} ctas{run['ctas']}: {run['tok_s']}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"verdict": decision.verdict, "reason": decision.reason, "rounds": decision.rounds, "runs": runs}
            )
        )


if __name__ == "__main__":
    main()

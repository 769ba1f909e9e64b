"""Live canaries on an uneven lab fleet: how often each verdict comes out, on real hosts and the real router.

Boots 3 lab hosts (stand-in engines) behind SGLang's router with the lab's Prometheus, sends constant load through
the router (`knobfleet.lab.loadgen`, 8 requests/s, bounded in count and time), makes lab1 8% slower from outside
(`lab speed`: a host-level file the stand-in reads, as a slower GPU) and runs, ``--repeats`` times each:

- ``aa-slow-canary``:   `canary default` with lab1 (slow) as the canary and lab2 as the baseline;
- ``aa-slow-baseline``: the same with lab2 made slow instead;
- ``worse5``:           `canary slower5` (every decode step 5% slower: profiles/slower5.yaml), lab1 slow.

Each canary judges lab1 against lab2 (`--hosts 1`); between canaries lab1 is put back on default when the canary
left it elsewhere. It prints one row per canary (verdict, windows, the throughput estimate and interval, where lab1
ended) and a summary per case: how often an A/A was rolled back (the bar: never) and how often the 5%-worse
profile came back off the canary (rollback or inconclusive, both restore the canary; promote is the failure).
Failed requests through all of it are counted (the bar: 0). Raw results: perf/results/lab_canary_uneven.json.

Each canary is the crossover at lab size: the pre-period, ``--swap-after`` windows with lab1 on the profile, then
lab2 on it and lab1 back, up to ``--max-windows`` in all.

With ``--warmup`` every stand-in warms up after each start (``SGLANG_SIM_WARMUP=1``: the published shape, decode
steps 6.6% slower and first tokens later, decaying over 50-100 requests), so each canary period's first windows are
set aside until the next agrees (the canary's warm-up rule), and ``--ab`` first runs `ab default slower5` on lab3
before the load starts, its bench warming up each bucket until converged. Each row then shows what was set aside;
raw results go to perf/results/lab_canary_warm.json instead.

Usage: python perf/lab_canary_uneven.py [--repeats 2] [--window 30s] [--pre-windows 2] [--swap-after 3]
[--max-windows 6] [--design crossover|did] [--warmup] [--ab]
(about (pre + max windows) x window per canary plus the restarts: 5 min each at the defaults here; `canary`'s own
defaults are 60 s windows, 3 + 6 + at most 10).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from typing import Any

from _lab import KNOBFLEET, REPO, table

sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO))
from knobfleet.lab import loadgen, monitoring
from knobfleet.lab.nspawn import Lab
from knobfleet.lab.router_lab import LabRouter
from knobfleet.telemetry.promconfig import Target

RESULTS = REPO / "perf" / "results" / "lab_canary_uneven.json"
WARM_RESULTS = REPO / "perf" / "results" / "lab_canary_warm.json"
CASES = {  # case -> (profile, slow host)
    "aa-slow-canary": ("default", "lab1"),
    "aa-slow-baseline": ("default", "lab2"),
    "worse5": ("slower5", "lab1"),
}
SLOW = 0.92


def knobfleet(*args: str, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KNOBFLEET, *args], capture_output=True, text=True, timeout=timeout)


def current_profile(host: str) -> str:
    hist = json.loads(knobfleet("history", "--json").stdout)["hosts"]
    h = next(h for h in hist if h["host"] == host)
    return str(next(g["profile"] for g in h["generations"] if g["number"] == h["current"]))


def one_canary(
    lab: Lab, case: str, window: str, pre: int, most: int, swap: int, design: str, extra: tuple[str, ...] = ()
) -> dict[str, Any]:
    profile, slow_host = CASES[case]
    for name in ("lab1", "lab2"):
        lab.set_host_speed(name, SLOW if name == slow_host else 1.0)
    started = time.monotonic()
    proc = knobfleet(
        "canary", profile, "--hosts", "1", "--window", window, "--pre-windows", str(pre),
        "--swap-after", str(swap), "--max-windows", str(most), "--design", design, "--yes", "--json", *extra,
    )  # fmt: skip
    took = time.monotonic() - started
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        said = f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        raise SystemExit(f"canary {profile} exited {proc.returncode}:\n{said}") from None
    ended = current_profile("lab1")
    ended2 = current_profile("lab2")
    if "default" not in (ended, ended2) or ended != ended2:  # a promoted slower5 (the failure this measures)
        knobfleet("apply", "default", "--yes")
    tput = doc.get("intervals", {}).get("tput", {})
    return {
        "case": case,
        "profile": profile,
        "slow_host": slow_host,
        "rc": proc.returncode,
        "verdict": doc.get("verdict"),
        "reason": doc.get("reason"),
        "windows_pre": doc.get("windows_pre"),
        "windows": doc.get("windows_counted"),
        "crossed": sum(1 for w in doc.get("windows", []) if w.get("crossed") and "skipped" not in w),
        "tput": tput,
        "warmup": doc.get("warmup"),
        "lab1_ended_on": ended,
        "lab2_ended_on": ended2,
        "seconds": round(took, 1),
    }


def warm_up_engines(lab: Lab) -> None:
    """Every stand-in of the lab warms up after each start: SGLANG_SIM_WARMUP=1 joins the host env of the lab's
    `decode` group (its own group_vars file, the lab's main.yml copy left as it is); the next apply restarts them."""
    import yaml

    main_yml = lab.dir / "inventory" / "group_vars" / "all" / "main.yml"
    env = dict(yaml.safe_load(main_yml.read_text())["knob_serve_host_env"])
    env["SGLANG_SIM_WARMUP"] = "1"
    (lab.dir / "inventory" / "group_vars" / "decode.yml").write_text(yaml.safe_dump({"knob_serve_host_env": env}))


def one_ab() -> dict[str, Any]:
    """`ab default slower5` on lab3: the incumbent is to be kept, each bucket warmed up until converged."""
    started = time.monotonic()
    proc = knobfleet("ab", "default", "slower5", "--limit", "lab3", "--conc", "48,64", "--max-rounds", "4", "--yes",
                     "--json", timeout=1800)  # fmt: skip
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"ab exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}") from None
    spent = doc.get("spent") or {}
    return {"rc": proc.returncode, "verdict": doc.get("verdict"), "winner": doc.get("winner"),
            "rounds": doc.get("rounds"),
            "warmup_requests": spent.get("warmup_requests"), "warmup_unconverged": spent.get("warmup_unconverged"),
            "seconds": round(time.monotonic() - started, 1)}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--window", default="30s")
    ap.add_argument("--pre-windows", type=int, default=2)
    ap.add_argument("--swap-after", type=int, default=3)
    ap.add_argument("--max-windows", type=int, default=6)
    ap.add_argument("--design", default="crossover", choices=("crossover", "did"))
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--rate", type=float, default=8.0)
    ap.add_argument("--warmup", action="store_true", help="the stand-ins warm up after each start")
    ap.add_argument("--ab", action="store_true", help="first `ab default slower5` on lab3, before the load")
    ap.add_argument("--max-regression", default=None, help="the canary's --max-regression (its default: 0.05)")
    ap.add_argument("--out", default=None, help="raw results here (default: perf/results/lab_canary_*.json)")
    a = ap.parse_args()
    cases = [c for c in a.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        raise SystemExit(f"--cases: unknown {', '.join(unknown)}; choose from {', '.join(CASES)}")
    secs = float(a.window.rstrip("s"))
    budget = len(cases) * a.repeats * (a.pre_windows + a.max_windows + 4) * secs + 600

    lab = Lab()
    lab.down()
    lab.up(3, router=True)
    from tests.integration.conftest import wait_engines

    wait_engines([lab.host(i).address for i in range(1, 4)], timeout=120)
    if a.warmup:
        warm_up_engines(lab)
    ab_row = one_ab() if a.ab else None
    monitoring.start_for_lab(lab, [Target("router", LabRouter(lab.dir).metrics_address, "router")])
    model = lab.router_model_dir()
    assert model
    spec = loadgen.LoadSpec(
        LabRouter(lab.dir).url, model, rate=a.rate, max_requests=min(100_000, int(budget * a.rate)),
        max_seconds=min(3600.0, budget), max_tokens=256,
    )  # fmt: skip
    records: list[loadgen.Record] = []
    started, stop = threading.Event(), threading.Event()
    load = threading.Thread(
        target=lambda: records.extend(loadgen.run(spec, on_start=lambda _t: started.set(), stop=stop))
    )
    load.start()
    rows: list[dict[str, Any]] = []
    try:
        if not started.wait(10):
            raise SystemExit("loadgen did not start within 10 s")
        applied = knobfleet("apply", "default", "--yes")
        if applied.returncode != 0:
            raise SystemExit(f"apply default exited {applied.returncode}: {applied.stderr[-1000:]}")
        time.sleep(8)  # a few scrapes of every engine before the first canary
        for r in range(a.repeats):
            for case in cases[r % len(cases) :] + cases[: r % len(cases)]:
                extra = ("--max-regression", a.max_regression) if a.max_regression else ()
                row = one_canary(lab, case, a.window, a.pre_windows, a.max_windows, a.swap_after, a.design, extra)
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        for name in ("lab1", "lab2"):
            lab.set_host_speed(name, 1.0)
        stop.set()
        load.join(timeout=300)
        monitoring.stop(lab.dir)
        lab.down()
    summary = loadgen.summarize(records)
    failed = sum(1 for r in records if r.outcome != "ok")
    print()
    print(
        table(
            ["case", "verdict", "pre", "windows", "after swap", "tput est", "interval", "lab1 on", "lab2 on", "s"],
            [
                [
                    r["case"], r["verdict"], r["windows_pre"], r["windows"], r["crossed"],
                    f"{r['tput'].get('estimate', float('nan')):+.1%}",
                    f"{r['tput'].get('low', float('nan')):+.1%} .. {r['tput'].get('high', float('nan')):+.1%}",
                    r["lab1_ended_on"], r["lab2_ended_on"], r["seconds"],
                ]
                for r in rows
            ],
        )
    )  # fmt: skip
    print()
    for case in cases:
        mine = [r for r in rows if r["case"] == case]
        verdicts = {v: sum(1 for r in mine if r["verdict"] == v) for v in ("promote", "inconclusive", "rollback")}
        bar = (
            f"rolled back {verdicts['rollback']} of {len(mine)} (bar: 0), taken back as inconclusive "
            f"{verdicts['inconclusive']}"
            if CASES[case][0] == "default"
            else f"taken back {verdicts['rollback'] + verdicts['inconclusive']} of {len(mine)} (bar: all)"
        )
        print(f"{case}: {verdicts}; {bar}")
    print(f"requests: {summary['sent']} sent, {failed} not ok (bar: 0)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    settings = {"window": a.window, "pre_windows": a.pre_windows, "swap_after": a.swap_after,
                "max_windows": a.max_windows, "design": a.design, "slow": SLOW,
                "max_regression": a.max_regression}  # fmt: skip
    doc = {"settings": {**settings, "warmup": a.warmup}, "rows": rows, "ab": ab_row, "requests": summary,
           "failed": failed}  # fmt: skip
    out = REPO / a.out if a.out else WARM_RESULTS if a.warmup else RESULTS
    out.write_text(json.dumps(doc, indent=1) + "\n")
    if ab_row:
        print(f"ab default slower5 on lab3: {json.dumps(ab_row)}")
    print(f"raw: {out.relative_to(REPO)}")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())

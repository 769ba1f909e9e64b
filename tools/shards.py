"""Run the integration suite in parallel shards, each its own pytest process with its own lab.

    python tools/shards.py [-n N] [--dry-run] [pytest args…]

Each shard gets a lab id of its own (``KNOBFLEET_TEST_LAB=shardK``), so its own slot: addresses, machine names,
cgroups and ports (knobfleet.lab.slots). Modules go to shards whole (a module boots its lab once), longest first
onto the shard with the least work (LPT), after the modules that run real engines (real SGLang and vLLM start-ups
are CPU-bound) have been spread one per shard: first on odd shards, last on even ones, so they rarely overlap. The
weights are each module's wall time from the last passing run (tests/integration/durations.json, written by this
runner; a module it does not list weighs the median).

N: ``-n``, else ``KNOBFLEET_SHARDS``, else one shard per core, at most one per 6 GiB of memory (a shard with real
SGLang peaks near 5 GiB), at least 1: 2 on a 2-core, 24 GiB machine. Each shard logs to build/shards/shardK.log;
at the end the runner prints each module's wall time, each shard's, and the tail of every failing shard's log,
and exits non-zero when any shard failed. Ctrl-C reaches every shard (pytest then tears its lab down).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "tests" / "integration"
DURATIONS = SUITE / "durations.json"
OUT = REPO / "build" / "shards"
# Modules that start real engines (SGLang, vLLM): CPU-bound start-ups, never two on one shard while others exist.
REAL_ENGINES = ("test_sglang.py", "test_vllm.py")
GIB = 1 << 30
PER_SHARD_MEMORY = 6 * GIB


@dataclass
class Shard:
    index: int
    modules: list[str] = field(default_factory=list)
    weight: float = 0.0

    @property
    def lab(self) -> str:
        return f"shard{self.index}"


def default_count() -> int:
    env = os.environ.get("KNOBFLEET_SHARDS", "").strip()
    if env:
        return max(1, int(env))
    cores = os.cpu_count() or 1
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return max(1, min(cores, memory // PER_SHARD_MEMORY))


def plan(weights: dict[str, float], count: int, heavy: tuple[str, ...] = REAL_ENGINES) -> list[Shard]:
    """Modules onto ``count`` shards (pure): the real-engine modules one per shard first (round robin, heaviest
    first), then the rest longest first onto the lightest shard."""
    shards = [Shard(i + 1) for i in range(count)]
    first = sorted((m for m in weights if m in heavy), key=lambda m: -weights[m])
    rest = sorted((m for m in weights if m not in heavy), key=lambda m: (-weights[m], m))
    for i, module in enumerate(first):
        shard = shards[i % count]
        shard.modules.append(module)
        shard.weight += weights[module]
    for module in rest:
        shard = min(shards, key=lambda s: (s.weight, s.index))
        shard.modules.append(module)
        shard.weight += weights[module]
    for shard in shards[1::2]:  # staggered: odd shards start with their real engine, even ones end with it, so two
        mine = [m for m in shard.modules if m in heavy]  # CPU-bound start-ups rarely meet
        shard.modules = [m for m in shard.modules if m not in heavy] + mine
    return [s for s in shards if s.modules]


def module_weights(modules: list[str], known: dict[str, float]) -> dict[str, float]:
    values = sorted(known.values()) or [60.0]
    median = values[len(values) // 2]
    return {m: float(known.get(m, median)) for m in modules}


def read_durations() -> dict[str, float]:
    try:
        doc = json.loads(DURATIONS.read_text(encoding="utf-8"))
        return {str(k): float(v) for k, v in doc["modules"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def junit_times(xml: Path) -> dict[str, float]:
    """Wall time per module from a junit XML (setup, call and teardown of every test, module fixtures included)."""
    out: dict[str, float] = {}
    try:
        root = ET.parse(xml).getroot()
    except (OSError, ET.ParseError):
        return out
    for case in root.iter("testcase"):
        module = (case.get("classname") or "").split(".")
        name = next((f"{p}.py" for p in module if p.startswith("test_")), None)
        if name:
            out[name] = out.get(name, 0.0) + float(case.get("time") or 0)
    return out


def run(shards: list[Shard], extra: list[str]) -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="knobfleet-shards-"))
    procs: dict[int, subprocess.Popen[bytes]] = {}
    started = time.monotonic()
    for shard in shards:
        log = (OUT / f"{shard.lab}.log").open("wb")
        env = dict(os.environ, KNOBFLEET_TEST_LAB=shard.lab)
        junit = OUT / f"{shard.lab}.xml"
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={base / shard.lab}",
                f"--junitxml={junit}", *[str(SUITE / m) for m in shard.modules], *extra]  # fmt: skip
        print(f"shards: {shard.lab} ({shard.weight / 60:.1f} min expected): {' '.join(shard.modules)}", flush=True)
        procs[shard.index] = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
    ended: dict[int, tuple[int, float]] = {}

    asked: list[float] = []

    def interrupt(signum: int, _frame: object) -> None:
        """First Ctrl-C (or SIGTERM): SIGINT to every shard (pytest tears its lab down); a shard still running 60 s
        later, or at a second Ctrl-C, is terminated, and its lab is stopped below."""
        asked.append(time.monotonic())
        sig = signal.SIGINT if len(asked) == 1 else signal.SIGTERM
        for i, proc in procs.items():
            if i not in ended and proc.poll() is None:
                proc.send_signal(sig)

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    while len(ended) < len(procs):
        if asked and time.monotonic() - asked[0] > 60 and len(asked) == 1:
            interrupt(signal.SIGTERM, None)
        for shard in shards:
            proc = procs[shard.index]
            if shard.index not in ended and proc.poll() is not None:
                took = time.monotonic() - started
                ended[shard.index] = (proc.returncode, took)
                print(f"shards: {shard.lab} ended after {took / 60:.1f} min, exit {proc.returncode}: "
                      f"{last_line(OUT / (shard.lab + '.log'))}", flush=True)  # fmt: skip
        time.sleep(1)
    stop_labs(base)
    return report(shards, ended, time.monotonic() - started, base)


def stop_labs(base: Path) -> None:
    """Every lab a shard left running (a shard that was terminated, or crashed): `knobfleet lab down --all` in each
    state folder the shards made. A shard that ended well has stopped its own: then this changes nothing."""
    for state in sorted(base.glob("shard*/knobfleet-state*")):
        if any(state.glob("lab*/**/run/*.pid")) or any(state.glob("labs/*/run/*.pid")):
            env = dict(os.environ, KNOBFLEET_STATE_DIR=str(state))
            env.pop("KNOBFLEET_LAB", None)
            subprocess.run([sys.executable, "-m", "knobfleet", "lab", "down", "--all"], env=env, check=False,
                           stdout=subprocess.DEVNULL, timeout=300)  # fmt: skip


def last_line(log: Path) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


def report(shards: list[Shard], ended: dict[int, tuple[int, float]], wall: float, base: Path) -> int:
    times: dict[str, float] = {}
    for shard in shards:
        times.update(junit_times(OUT / f"{shard.lab}.xml"))
    print("\nshards: module wall times (s), by shard")
    for shard in shards:
        rc, took = ended[shard.index]
        busy = sum(times.get(m, 0.0) for m in shard.modules)
        print(f"  {shard.lab}: {took:.0f} s wall, {busy:.0f} s in its modules, exit {rc}")
        for m in shard.modules:
            print(f"    {m:<28} {times.get(m, float('nan')):7.0f}")
    slowest = max(took for _, took in ended.values())
    fastest = min(took for _, took in ended.values())
    print(f"shards: {len(shards)} shard(s), {wall / 60:.1f} min wall; balance {fastest / slowest:.2f} "
          f"(fastest / slowest shard); sum of module times {sum(times.values()) / 60:.1f} min")  # fmt: skip
    failed = [s for s in shards if ended[s.index][0] != 0]
    for shard in failed:
        tail = (OUT / f"{shard.lab}.log").read_text(errors="replace").splitlines()[-150:]
        print(f"\n===== {shard.lab} failed (exit {ended[shard.index][0]}); last lines of "
              f"{(OUT / (shard.lab + '.log')).relative_to(REPO)} =====")  # fmt: skip
        print("\n".join(tail))
    if failed:
        print(f"shards: kept the shards' temp folders in {base}")
        return 1
    doc = {"note": "each integration module's wall time in its shard's last passing run (tools/shards.py)",
           "modules": dict(sorted((m, round(t, 1)) for m, t in times.items()))}  # fmt: skip
    DURATIONS.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=False)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=None, help="shards (default: KNOBFLEET_SHARDS, else from cores and memory)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and stop")
    ns, extra = ap.parse_known_args(argv)
    count = ns.n if ns.n is not None else default_count()
    if count < 1:
        ap.error(f"-n {count}: at least 1 shard")
    modules = sorted(p.name for p in SUITE.glob("test_*.py"))
    shards = plan(module_weights(modules, read_durations()), count)
    if ns.dry_run:
        for s in shards:
            print(f"{s.lab}: {s.weight / 60:.1f} min: {' '.join(s.modules)}")
        return 0
    return run(shards, extra)


if __name__ == "__main__":
    sys.exit(main())

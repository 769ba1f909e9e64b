"""Mutation testing of knobfleet's pure core with mutmut (``make mutation``, ``make mutation-quick``).

mutmut derives a mutant's module from its path and only understands a ``src/`` layout, so the package is
staged in ``build/mutation/src/knobfleet`` (a copy of ``python/knobfleet``) next to links to the tests and the
project's data; mutmut runs there with ``[tool.mutmut]`` from pyproject.toml (which files are the pure core,
per-mutant test selection from ``tests/unit``). Every run starts from a clean ``mutants/`` so the score never
comes from a stale cache. Mutants listed in docs/TESTING.md as equivalent are left out of the score.

    python tools/mutation.py                 # the whole pure core
    python tools/mutation.py --quick         # the pure-core modules changed since the last release tag
                                             # (no tag, or none changed: a fixed sample, QUICK_SAMPLE)
    python tools/mutation.py --only ops/plan.py render.py

The last line is ``mutation score: N%`` (killed / (mutants − equivalent), timeouts count as killed).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STAGE = REPO / "build" / "mutation"  # --quick and --only: build/mutation-quick, so a full run is kept
LINKED = ("tests", "profiles", "roles", "playbooks", "inventories", "perf")
# The fixed sample for --quick when no release tag says what changed: the rules a user notices first.
QUICK_SAMPLE = ("ops/plan.py", "experiment/design.py")
# Equivalent mutants: "| `mutant name` | reason |" rows in docs/TESTING.md.
EQUIVALENT_ROW = re.compile(r"^\|\s*`(knobfleet\.[^`]+__mutmut_\d+)`\s*\|")
# mutmut's statuses that count as detected; anything else (survived, no tests, suspicious, …) is alive
DETECTED = {"killed", "timeout", "caught by type check", "segfault"}


ORDER_PLUGIN = "knobfleet_fastest_first"
ORDER_PLUGIN_SOURCE = '''"""A mutant's tests, fastest first (mutmut's recorded durations): a kill comes early."""
import json
from pathlib import Path

_durations = {}


def pytest_collection_modifyitems(session, config, items):
    if not _durations and Path("mutmut-stats.json").is_file():
        _durations.update(json.loads(Path("mutmut-stats.json").read_text())["duration_by_test"])
    items.sort(key=lambda item: _durations.get(item.nodeid, 0.0))
'''


def core_patterns() -> list[str]:
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mutmut"]
    return list(cfg["only_mutate"])


def rel(pattern: str) -> str:
    return pattern.removeprefix("src/knobfleet/")


def last_release_tag() -> str | None:
    out = subprocess.run(
        ["git", "describe", "--tags", "--abbrev=0", "--match", "v*"], cwd=REPO, capture_output=True, text=True
    )
    return out.stdout.strip() or None


def changed_since(tag: str, patterns: list[str]) -> list[str]:
    out = subprocess.run(
        ["git", "diff", "--name-only", f"{tag}..HEAD", "--", "python/knobfleet"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    names = [p.removeprefix("python/knobfleet/") for p in out]
    return sorted({n for n in names for p in patterns if fnmatch.fnmatch(n, rel(p))})


def stage(selected: list[str]) -> None:
    if STAGE.exists():
        shutil.rmtree(STAGE)
    (STAGE / "src").mkdir(parents=True)
    shutil.copytree(
        REPO / "python" / "knobfleet", STAGE / "src" / "knobfleet", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in LINKED:
        (STAGE / name).symlink_to(REPO / name)
    text = (REPO / "pyproject.toml").read_text()
    patterns = "[" + ", ".join(json.dumps(f"src/knobfleet/{s}") for s in selected) + "]"
    text = re.sub(r"(?m)^only_mutate = \[[^\]]*\]", f"only_mutate = {patterns}", text)
    text = re.sub(r"(?m)^pytest_add_cli_args = \[", f'pytest_add_cli_args = ["-p", "{ORDER_PLUGIN}", ', text)
    (STAGE / "pyproject.toml").write_text(text)
    # mutmut runs pytest in mutants/, which is on sys.path: the plugin that runs the fastest tests first
    (STAGE / "mutants").mkdir()
    (STAGE / "mutants" / f"{ORDER_PLUGIN}.py").write_text(ORDER_PLUGIN_SOURCE)


def equivalent() -> dict[str, str]:
    doc = REPO / "docs" / "TESTING.md"
    out = {}
    if doc.is_file():
        for line in doc.read_text().splitlines():
            m = EQUIVALENT_ROW.match(line)
            if m:
                out[m.group(1)] = line.split("|")[2].strip()
    return out


def results() -> dict[str, int]:
    """mutant name → exit code, from mutmut's per-file result files."""
    out: dict[str, int] = {}
    for meta in (STAGE / "mutants").rglob("*.py.meta"):
        data = json.loads(meta.read_text())
        for name, code in data.get("exit_code_by_key", {}).items():
            out[name] = code
    return out


def module_of(name: str) -> str:
    return re.sub(r"\.x[_ǁ].*$", "", name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="only the pure-core modules changed since the last tag")
    ap.add_argument("--only", nargs="*", help="modules relative to python/knobfleet (default: the whole core)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--survivors", action="store_true", help="print the diff of every surviving mutant")
    ap.add_argument(
        "--resume",
        action="store_true",
        help="go on with the mutants an interrupted run left unchecked (code and tests unchanged since)",
    )
    ap.add_argument("--report", action="store_true", help="only print the scores of the last run (so far)")
    args = ap.parse_args()
    core = core_patterns()
    if args.only:
        selected = args.only
    elif args.quick:
        tag = last_release_tag()
        selected = (changed_since(tag, core) if tag else []) or list(QUICK_SAMPLE)
        print(f"mutation-quick: {'changed since ' + tag if tag else 'no release tag, fixed sample'}: {selected}")
    else:
        selected = [rel(p) for p in core]
    global STAGE
    if args.quick or args.only:
        STAGE = STAGE.with_name("mutation-quick")
    t0 = time.monotonic()
    mutmut = Path(sys.executable).parent / "mutmut"
    if not args.report:
        if not (args.resume and (STAGE / "mutants").is_dir()):
            stage(selected)
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        proc = subprocess.run(
            [str(mutmut), "run", "--max-children", str(args.jobs)], cwd=STAGE, env=env, capture_output=True, text=True
        )
        log = STAGE / "mutmut.log"
        log.write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            print((proc.stdout + proc.stderr)[-4000:])
            print(f"mutmut failed (exit {proc.returncode}); full log in {log.relative_to(REPO)}")
            return 1
    from mutmut.stats import status_by_exit_code

    codes = results()
    eq = equivalent()
    per: dict[str, Counter[str]] = {}
    survivors = []
    for name, code in sorted(codes.items()):
        status = status_by_exit_code[code]
        if status == "not checked":
            per.setdefault(module_of(name), Counter())["unchecked"] += 1
            continue
        if status == "timeout":
            pass
        elif status in DETECTED:
            status = "killed"
        elif name in eq:
            status = "equivalent"
        else:
            survivors.append((name, status))
            status = "alive"
        per.setdefault(module_of(name), Counter())[status] += 1
    print(f"{'module':<42} {'mutants':>7} {'killed':>6} {'timeout':>7} {'equiv':>5} {'alive':>5} {'score':>6}")
    total = Counter[str]()
    for mod, c in sorted(per.items()):
        total.update(c)
        checked = sum(c.values()) - c["unchecked"]
        dead = c["killed"] + c["timeout"]
        denom = checked - c["equivalent"]
        note = f"  ({c['unchecked']} not checked yet)" if c["unchecked"] else ""
        print(
            f"{mod:<42} {checked:>7} {c['killed']:>6} {c['timeout']:>7} {c['equivalent']:>5} {c['alive']:>5} "
            f"{(100 * dead / denom if denom else 100):>5.1f}%{note}"
        )
    if survivors:
        print(f"\n{len(survivors)} surviving mutants (mutmut show NAME in build/mutation for the diff):")
        for name, status in survivors:
            print(f"  {name}  ({status})")
            if args.survivors:
                show = subprocess.run([str(mutmut), "show", name], cwd=STAGE, capture_output=True, text=True)
                print("    " + show.stdout.strip().replace("\n", "\n    "))
    stale = sorted(set(eq) - set(codes))
    if stale and not args.only and not args.quick:
        print(f"\nnote: {len(stale)} equivalent mutants in docs/TESTING.md no longer exist: {', '.join(stale)}")
    n = sum(total.values()) - total["unchecked"]
    denom = n - total["equivalent"]
    score = 100 * (total["killed"] + total["timeout"]) / denom if denom else 100.0
    if total["unchecked"]:
        print(
            f"\n{total['unchecked']} mutants not checked yet: `python tools/mutation.py --resume` goes on "
            "(code and tests unchanged)"
        )
    print(f"\n{n} mutants checked in {len(per)} modules, {time.monotonic() - t0:.0f}s")
    print(f"mutation score: {score:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())

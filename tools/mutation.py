"""Mutation testing of knobfleet with mutmut (``make mutation``, ``make mutation-quick``).

mutmut derives a mutant's module from its path and only understands a ``src/`` layout, so the package is
staged in ``build/mutation/src/knobfleet`` (a copy of ``python/knobfleet``) next to links to the tests and the
project's data; mutmut runs there with ``[tool.mutmut]`` from pyproject.toml (which files are mutated,
per-mutant test selection from ``tests/unit``). Every run starts from a clean ``mutants/`` so the score never
comes from a stale cache. Mutants listed in docs/TESTING.md as equivalent are left out of the score.

The roles' on-host modules (``roles/*/library/*.py``, listed as such in ``only_mutate``) are not in the package:
the unit tests load each from its file under the module name ``knob_role_<name>``, and mutmut's trampolines
activate a mutant only in a module of the mutant's own name. So each is staged as ``src/knob_role_<name>.py``
(mutmut names its mutants ``knob_role_<name>.x_…``) and its file in the copied roles (``mutants/roles/<role>/
library/<name>.py``) becomes a link to the mutated copy: the tests load the mutants under the right name.

    python tools/mutation.py                 # everything in only_mutate
    python tools/mutation.py --quick         # the modules changed since the last release tag, at most
                                             # QUICK_SAMPLE_PER_MODULE mutants each (no tag, or none changed:
                                             # a fixed sample, QUICK_SAMPLE)
    python tools/mutation.py --only ops/plan.py render.py roles/knob_serve/library/knob_generation.py
    python tools/mutation.py --only cli/drift.py --sample 150   # at most 150 mutants of each module, drawn
                                             # with a fixed seed (the others are reported as not checked)

The last line is ``mutation score: N%`` (killed / (mutants − equivalent), timeouts count as killed).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import random
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
LINKED = ("tests", "profiles", "roles", "playbooks", "inventories", "perf", "CHANGELOG.md")  # what the tests read
# The fixed sample for --quick when no release tag says what changed: the rules a user notices first.
QUICK_SAMPLE = ("ops/plan.py", "experiment/design.py")
# --quick over changed modules: at most this many mutants of each (CI keeps ~4 min on 2 cores)
QUICK_SAMPLE_PER_MODULE = 40  # 60 took 793 s of CI on 0.2.5 (slow tests); this round adds integration minutes
# The last release as a tracked file (version and commit), read when the clone has no tags.
RELEASE_FILE = REPO / "tools" / "last-release"
# --quick samples at most this many of the changed modules (the most changed lines first), so CI's cost stays bounded.
QUICK_MAX_MODULES = 4
SAMPLE_SEED = 25
# An on-host module of a role: staged as src/knob_role_<name>.py, its mutants named knob_role_<name>.x_…
ROLE_MODULE = re.compile(r"^roles/([^/]+)/library/([^/]+)\.py$")
ROLE_PREFIX = "knob_role_"
# The shell's modules (issue 25's widening) and the tests only they need: a run that mutates none of them (the
# pure core alone, e.g. --quick's fixed sample) leaves these tests out of the selection and keeps its old cost.
SHELL = ("cli/", "engines/", "fleet/transports/", "experiment/ab.py", "roles/")
SHELL_TESTS = ("tests/unit/cli", "tests/unit/fleet/transports")
# Equivalent mutants: "| `mutant name` | reason |" rows in docs/TESTING.md.
EQUIVALENT_ROW = re.compile(r"^\|\s*`((?:knobfleet|knob_role_\w+)\.[^`]+__mutmut_\d+)`\s*\|")
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
    """A pattern of only_mutate as the command line takes it: relative to python/knobfleet, or roles/…"""
    return pattern.removeprefix("src/knobfleet/")


def is_role(pattern: str) -> bool:
    return pattern.startswith("roles/")


def role_modules(patterns: list[str]) -> dict[str, Path]:
    """``knob_role_<name>`` → the module's file, for every roles/… pattern (globs expanded)."""
    out: dict[str, Path] = {}
    for pattern in patterns:
        if not is_role(pattern):
            continue
        for path in sorted(REPO.glob(pattern)):
            m = ROLE_MODULE.match(path.relative_to(REPO).as_posix())
            if m:
                out[ROLE_PREFIX + m.group(2)] = path
    return out


def display(module: str) -> str:
    """A module as the score table shows it: knobfleet.cli.drift, or roles/knob_serve/library/x.py."""
    if module.startswith(ROLE_PREFIX):
        name = module.removeprefix(ROLE_PREFIX)
        hits = sorted(REPO.glob(f"roles/*/library/{name}.py"))
        return hits[0].relative_to(REPO).as_posix() if hits else module
    return module


def last_release_tag() -> str | None:
    """The last release: the newest ``v*`` tag when the clone has tags, else the commit in the tracked file
    ``RELEASE_FILE`` (CI's clones carry no tags: only main's commits land). None when neither names a commit here."""
    out = subprocess.run(
        ["git", "describe", "--tags", "--abbrev=0", "--match", "v*"], cwd=REPO, capture_output=True, text=True
    )
    if out.stdout.strip():
        return out.stdout.strip()
    try:
        fields = dict(ln.split(None, 1) for ln in RELEASE_FILE.read_text(encoding="utf-8").splitlines() if " " in ln)
    except OSError:
        return None
    commit = fields.get("commit", "").strip()
    known = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=REPO, capture_output=True)
    return commit if commit and known.returncode == 0 else None


def changed_since(tag: str, patterns: list[str]) -> list[str]:
    out = subprocess.run(
        ["git", "diff", "--name-only", f"{tag}..HEAD", "--", "python/knobfleet", "roles"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    names = [p.removeprefix("python/knobfleet/") for p in out]
    picked = {n for n in names for p in patterns if fnmatch.fnmatch(n, rel(p))}
    stat = subprocess.run(
        ["git", "diff", "--numstat", f"{tag}..HEAD", "--", "python/knobfleet", "roles"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    lines = {}
    for row in stat:
        added, removed, path = [*row.split("\t"), "", "", ""][:3]
        lines[path.removeprefix("python/knobfleet/")] = int(added) + int(removed) if added.isdigit() else 0
    return sorted(picked, key=lambda n: (-lines.get(n, 0), n))


def stage(selected: list[str]) -> None:
    if STAGE.exists():
        shutil.rmtree(STAGE)
    (STAGE / "src").mkdir(parents=True)
    shutil.copytree(
        REPO / "python" / "knobfleet", STAGE / "src" / "knobfleet", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in LINKED:
        (STAGE / name).symlink_to(REPO / name)
    roles = role_modules(selected)
    for module, path in roles.items():
        shutil.copy2(path, STAGE / "src" / f"{module}.py")
    text = (REPO / "pyproject.toml").read_text()
    mutate = [f"src/knobfleet/{s}" for s in selected if not is_role(s)] + [f"src/{m}.py" for m in roles]
    patterns = "[" + ", ".join(json.dumps(p) for p in mutate) + "]"
    text = re.sub(r"(?m)^only_mutate = \[[^\]]*\]", f"only_mutate = {patterns}", text)
    text = re.sub(r"(?m)^source_paths = \[[^\]]*\]", 'source_paths = ["src"]', text)
    # roles/ is copied into mutants/ below, with links to the mutated role modules: not by mutmut
    text = re.sub(r'(?m)^(also_copy = \[.*)"roles", ', r"\1", text)
    text = re.sub(r"(?m)^pytest_add_cli_args = \[", f'pytest_add_cli_args = ["-p", "{ORDER_PLUGIN}", ', text)
    if not any(p.startswith(SHELL) for p in selected):
        for test in SHELL_TESTS:
            text = text.replace(f'  "{test}",\n', "")
    (STAGE / "pyproject.toml").write_text(text)
    # mutmut runs pytest in mutants/, which is on sys.path: the plugin that runs the fastest tests first
    (STAGE / "mutants").mkdir()
    (STAGE / "mutants" / f"{ORDER_PLUGIN}.py").write_text(ORDER_PLUGIN_SOURCE)
    # The tests load the role modules from <root>/roles/<role>/library (root: mutants/, where their copy is):
    # those being mutated are links to mutmut's mutated copy in mutants/src.
    shutil.copytree(REPO / "roles", STAGE / "mutants" / "roles", ignore=shutil.ignore_patterns("__pycache__"))
    for module, path in roles.items():
        link = STAGE / "mutants" / path.relative_to(REPO)
        link.unlink()
        link.symlink_to(Path("../../..") / "src" / f"{module}.py")


def equivalent() -> dict[str, str]:
    doc = REPO / "docs" / "TESTING.md"
    out = {}
    if doc.is_file():
        for line in doc.read_text().splitlines():
            m = EQUIVALENT_ROW.match(line)
            if m:
                out[m.group(1)] = line.split("|")[2].strip()
    return out


def results() -> dict[str, int | None]:
    """mutant name → exit code (None: not checked), from mutmut's per-file result files."""
    out: dict[str, int | None] = {}
    for meta in (STAGE / "mutants").rglob("*.py.meta"):
        data = json.loads(meta.read_text())
        for name, code in data.get("exit_code_by_key", {}).items():
            out[name] = code
    return out


def module_of(name: str) -> str:
    return re.sub(r"\.x[_ǁ].*$", "", name)


def sample(codes: dict[str, int | None], per_module: int) -> list[str]:
    """At most ``per_module`` mutant names of each module: the first of the module's mutants shuffled with a
    fixed seed, so a larger sample of the same code holds the smaller one (``--resume --sample`` with a larger N
    checks only the mutants added)."""
    by_module: dict[str, list[str]] = {}
    for name in sorted(codes):
        by_module.setdefault(module_of(name), []).append(name)
    chosen: list[str] = []
    for module, names in sorted(by_module.items()):
        random.Random(f"{SAMPLE_SEED}:{module}").shuffle(names)
        chosen += sorted(names[:per_module])
    return chosen


def run_mutmut(mutmut: Path, jobs: int, names: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [str(mutmut), "run", "--max-children", str(jobs), *names], cwd=STAGE, env=env, capture_output=True, text=True
    )


# A name no mutant has: `mutmut run` with it generates the mutants and the test statistics, then stops.
GENERATE_ONLY = "knobfleet-generate-only-no-such-mutant"


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
    ap.add_argument(
        "--sample",
        type=int,
        default=None,
        metavar="N",
        help="check at most N mutants of each module, drawn with a fixed seed (the rest: not checked)",
    )
    args = ap.parse_args()
    core = core_patterns()
    if args.only:
        selected = args.only
    elif args.quick:
        tag = last_release_tag()
        changed = changed_since(tag, core) if tag else []
        selected = changed[:QUICK_MAX_MODULES] or list(QUICK_SAMPLE)
        if args.sample is None:  # the fixed sample too: all 615 of its mutants took 871 s of CI's 90 minutes
            args.sample = QUICK_SAMPLE_PER_MODULE
        print(f"mutation-quick: {'changed since ' + tag if tag else 'no release, fixed sample'}: {selected}")
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
        names: list[str] = []
        log = STAGE / "mutmut.log"
        if args.sample is not None:
            first = run_mutmut(mutmut, args.jobs, [GENERATE_ONLY])
            log.write_text(first.stdout + first.stderr)
            every = results()
            if not every or not (STAGE / "mutants" / "mutmut-stats.json").is_file():
                print((first.stdout + first.stderr)[-4000:])
                print(f"mutmut generated no mutants or no test statistics; full log in {log.relative_to(REPO)}")
                return 1
            names = sample(every, args.sample)
            if args.resume:
                names = [n for n in names if every[n] is None]
            print(
                f"sample: {len(names)} of {len(every)} mutants (at most {args.sample} per module, seed {SAMPLE_SEED})"
            )
        proc = run_mutmut(mutmut, args.jobs, names) if names or args.sample is None else None
        if proc is not None:
            log.write_text(proc.stdout + proc.stderr)
        if proc is not None and proc.returncode != 0:
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
            f"{display(mod):<42} {checked:>7} {c['killed']:>6} {c['timeout']:>7} {c['equivalent']:>5} {c['alive']:>5} "
            f"{f'{100 * dead / denom:5.1f}%' if denom else '   n/a':>6}{note}"
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
    score = 100 * (total["killed"] + total["timeout"]) / denom if denom else None
    if total["unchecked"]:
        print(
            f"\n{total['unchecked']} mutants not checked yet: `python tools/mutation.py --resume` goes on "
            "(code and tests unchanged)"
        )
    print(f"\n{n} mutants checked in {len(per)} modules, {time.monotonic() - t0:.0f}s")
    print(f"mutation score: {'n/a (no mutant checked)' if score is None else f'{score:.1f}%'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

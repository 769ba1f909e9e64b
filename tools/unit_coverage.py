"""Line coverage of the unit suite for the modules issue 19 names (``make coverage``).

Runs tests/unit under coverage.py, measuring python/knobfleet and the roles' on-host modules (the role modules
are loaded from their files by the tests, so their lines count), then reports the watched files:
experiment/ab.py, experiment/gate.py, ops/transaction.py, ops/history.py, every ``roles/*/library/*.py`` and
``python/knobfleet/module_utils/*.py``. A watched file no test imports shows as 0%.

    python tools/unit_coverage.py                      # run the unit suite, then report
    python tools/unit_coverage.py --report             # report the last run's data again
    python tools/unit_coverage.py -- -k generation     # extra arguments after -- go to pytest
    python tools/unit_coverage.py --with-integration tests/integration/test_ab.py tests/integration/test_transactions.py
                                    # also run these integration tests (root, a lab) with every knobfleet process
                                    # they start measured, and report unit + integration together

The data file is build/coverage/unit.coverage (``coverage combine`` takes it with other runs' data, e.g. the
integration suite's); the last line is ``watched coverage: N%`` (lines run / statements, over the watched
files together).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "build" / "coverage" / "unit.coverage"
INT_DATA = REPO / "build" / "coverage" / "integration.coverage"
COMBINED = REPO / "build" / "coverage" / "combined.coverage"
SOURCES = ("python/knobfleet", "roles")
WATCHED = (
    "python/knobfleet/experiment/ab.py",
    "python/knobfleet/experiment/gate.py",
    "python/knobfleet/ops/transaction.py",
    "python/knobfleet/ops/history.py",
    "roles/*/library/*.py",
    "python/knobfleet/module_utils/*.py",
)


def watched_files() -> list[Path]:
    files: set[Path] = set()
    for pattern in WATCHED:
        files.update(p for p in REPO.glob(pattern) if p.name != "__init__.py")
    return sorted(files)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--report", action="store_true", help="only report the data of the last run")
    ap.add_argument(
        "--with-integration",
        nargs="+",
        metavar="TEST",
        default=None,
        help="also run these integration tests, measuring the knobfleet processes they start, and report both",
    )
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = ap.parse_args()
    py = sys.executable
    failed = 0
    if not args.report:
        DATA.parent.mkdir(parents=True, exist_ok=True)
        DATA.unlink(missing_ok=True)
        run = [py, "-m", "coverage", "run", f"--data-file={DATA}", f"--source={','.join(SOURCES)}"]
        run += ["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit", *args.pytest_args]
        tests = subprocess.run(run, cwd=REPO)
        failed = tests.returncode
        if failed:
            print(f"coverage: the unit suite failed (exit {tests.returncode}); the report below is partial")
    elif not DATA.is_file():
        print(f"coverage: no data yet ({DATA.relative_to(REPO)}); run without --report first")
        return 1
    data = DATA
    if args.with_integration:
        failed |= integration(py, args.with_integration)
        data = combine()
    # a watched file no test imported is not in the data: coverage's --include would leave it out, so the
    # report is computed here from coverage's API, with unimported files at 0%
    from coverage import Coverage
    from coverage.exceptions import NoSource, NotPython

    cov = Coverage(data_file=str(data))
    cov.load()
    measured = set(cov.get_data().measured_files())
    rows = []
    total_stmts = total_run = 0
    for path in watched_files():
        try:
            _, statements, _, missing, _ = cov.analysis2(str(path))
        except (NoSource, NotPython):
            continue
        n = len(statements)
        ran = n - len(missing) if str(path) in measured else 0
        rows.append((str(path.relative_to(REPO)), n, ran))
        total_stmts += n
        total_run += ran
    width = max(len(r[0]) for r in rows)
    print(f"\n{'file':<{width}} {'stmts':>6} {'miss':>6} {'cover':>6}")
    for name, n, ran in rows:
        print(f"{name:<{width}} {n:>6} {n - ran:>6} {(100 * ran / n if n else 100):>5.1f}%")
    pct = 100 * total_run / total_stmts if total_stmts else 100.0
    print(f"{'TOTAL':<{width}} {total_stmts:>6} {total_stmts - total_run:>6} {pct:>5.1f}%")
    print(f"watched coverage: {pct:.1f}%")
    return 1 if failed else 0


def integration(py: str, tests: list[str]) -> int:
    """Run ``tests`` under coverage with every Python process they start measured too (the CLI runs as
    ``python -m knobfleet`` subprocesses): a .pth file in the venv starts coverage in each process that has
    COVERAGE_PROCESS_START set, for this run only. The roles' modules run on the lab hosts' own Python and
    are not measured here (their unit tests run them in-process)."""
    import os
    import sysconfig

    for old in DATA.parent.glob(INT_DATA.name + ".*"):
        old.unlink()
    rc = DATA.parent / "int.coveragerc"
    rc.write_text(f"[run]\ndata_file = {INT_DATA}\nparallel = true\nsource = {REPO / 'python' / 'knobfleet'}\n")
    purelib = Path(sysconfig.get_paths()["purelib"])
    # coverage installs a .pth of its own that does this (a1_coverage.pth); older releases do not
    pth = purelib / "zz_knobfleet_coverage.pth"
    if not list(purelib.glob("*coverage*.pth")):
        pth.write_text("import coverage; coverage.process_startup()\n")
    try:
        env = {**os.environ, "COVERAGE_PROCESS_START": str(rc)}
        # pytest itself is measured by the same .pth hook as every process it starts
        run = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests]
        return subprocess.run(run, cwd=REPO, env=env).returncode
    finally:
        pth.unlink(missing_ok=True)


def combine() -> Path:
    """The unit data and every integration process's data in one file."""
    from coverage import Coverage

    COMBINED.unlink(missing_ok=True)
    cov = Coverage(data_file=str(COMBINED))
    parts = [str(DATA)] if DATA.is_file() else []
    parts += [str(p) for p in DATA.parent.glob(INT_DATA.name + ".*")]
    cov.combine(parts, keep=True)
    cov.save()
    return COMBINED


if __name__ == "__main__":
    sys.exit(main())

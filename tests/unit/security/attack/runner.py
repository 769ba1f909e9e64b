"""Runs the cases: each in a folder of its own under pytest's temp dir (a copy of a project made by ``knobfleet init``,
its HOME, a folder out of the project, its TMPDIR), as the real command line in a subprocess under
``test_hostile_bounds``' wrapper (``os.wait4``: the command's own peak memory), through ``driver.py`` (no
connection leaves 127.0.0.0/8, nothing is written out of the temp dir), killed at 10 s. ``WORKERS`` cases at a time,
one folder ("slot") each, reset from the template before every case; the state folder is one for all (the caches
stay warm), and is searched for every case's secrets at the end.

What a case must hold to (``judge``): it ended within 10 s, under 200 MB, with an exit code of its command's
contract; no traceback and no internal error; a refusal is one line on stderr (argparse's usage text before it
aside); no raw terminal control, bidi control or blank letter in what it printed; no connection out of 127.0.0.0/8
and no write out of the temp dir (the driver's log); nothing changed in the temp dir but its declared outputs (a
snapshot before and after; the state folder aside); no secret of the case in any file it wrote, nor, for a URL's
password and a file's secrets, in what it printed."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.unit.security.attack import values as V
from tests.unit.security.attack.plan import (
    BASE,
    BENIGN_CLASS,
    BENIGN_KIND,
    BENIGN_OPTION,
    GIVEN_ALWAYS,
    OUTPUTS,
    PARSE_ONLY,
    SEED,
    TOP_COMMAND,
    Case,
    Place,
    contract,
)
from tests.unit.security.attack.tree import Option
from tests.unit.security.test_hostile_bounds import EXIT_CODES, LIMIT_KIB, LIMIT_S, WRAPPER

DRIVER = Path(__file__).with_name("driver.py")
WORKERS = int(os.environ.get("KNOBFLEET_ATTACK_WORKERS", "2"))
HOST = "127.0.77.1"  # the inventory's one host: loopback, a port nothing listens on
SCAN_MAX = 64 * 1024 * 1024
# Written by the command besides the temp dir: an editable install stages its playbooks and collection in the
# checkout (knobfleet.paths.ansible_dir), restaged when the roles change.
STAGED = (Path(__file__).resolve().parents[4] / "build" / "ansible-dev",)
# Output kinds written where the path named leads: ``init DIR`` makes the project in DIR's real path (a symlink
# named as DIR is followed, as ``mkdir -p`` would); the other output folders refuse a symlink while parsing.
RESOLVED = {"folder"}
# Paths (relative to the slot) a case may change besides its outputs, and why.
TOLERATED: dict[str, str] = {
    "home/.ansible": "Ansible's own local temp folder (ANSIBLE_LOCAL_TEMP's default)",
    "home/.cache/matplotlib": "matplotlib's font cache, made by the first plot of a page",
    "home/.config/matplotlib": "matplotlib's config folder, made with it",
    "home/.cache": "the folder above it",
    "home/.config": "the folder above it",
}


@dataclass
class Result:
    case: Case
    argv: list[str]
    rc: int | None = None
    out: str = ""
    err: str = ""
    seconds: float = 0.0
    maxrss_kib: int = 0
    log: list[list[str]] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    leaked: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def shown(self) -> str:
        argv = [a[:200] for a in self.argv[:12]] + ([f"… {len(self.argv) - 12} more"] if len(self.argv) > 12 else [])
        return (
            f"{self.case.id}\n  argv: {argv}\n  rc {self.rc} in {self.seconds:.1f}s, "
            f"{self.maxrss_kib // 1024} MiB\n  stdout: {self.out[:600]!r}\n  stderr: {self.err[:1200]!r}\n"
            f"  problems: {self.problems}"
        )


@dataclass
class Prepared:
    argv: list[str]
    env: dict[str, str]
    outputs: list[Path]  # absolute, as given (not resolved)
    secrets: V.Secrets
    never_shown: bool


def refusal_lines(err: str) -> list[str]:
    """stderr's lines, argparse's usage text (before its ``error:`` line) left out; one line per problem of one
    file (``PATH: where: why``, each naming the same path) counts as one."""
    lines = [line for line in err.splitlines() if line.strip()]
    if lines and lines[0].startswith("usage:"):
        at = next((i for i, line in enumerate(lines) if ": error: " in line), 0)
        lines = lines[at:]
    heads = {line.split(": ", 1)[0] for line in lines}
    if len(lines) > 1 and len(heads) == 1 and all(": " in line for line in lines):
        return lines[:1]
    return lines


def snapshot(root: Path, skip: set[Path]) -> dict[str, tuple[object, ...]]:
    """Every node under ``root`` but ``skip``: what it is and, for a file, its size, mtime and inode (a folder's own
    mtime is left out: a temp file made and removed inside it is no change)."""
    out: dict[str, tuple[object, ...]] = {}
    todo = [root]
    while todo:
        d = todo.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            p = Path(e.path)
            if p in skip:
                continue
            st = e.stat(follow_symlinks=False)
            rel = os.path.relpath(p, root)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir",)
                todo.append(p)
            elif stat.S_ISREG(st.st_mode):
                out[rel] = ("file", st.st_size, st.st_mtime_ns, st.st_ino)
            else:
                out[rel] = ("node", st.st_mode, st.st_rdev)
    return out


def read_head(path: Path) -> str:
    try:
        with path.open("rb") as fh:
            return fh.read(SCAN_MAX).decode("utf-8", "replace")
    except OSError:
        return ""


class Harness:
    def __init__(self, root: Path, workers: int = WORKERS) -> None:
        self.root = root
        self.workers = workers
        self.template = root / "template"
        self.shared = root / "shared"
        self.state = root / "state"
        self.servers = V.Servers()
        self.port = 1

    # --- the project every case starts from --------------------------------------------------------------------

    def prepare(self) -> None:
        import socket

        from knobfleet.paths import ansible_dir
        from knobfleet.project import init

        # An editable install stages its playbooks in the checkout on its first Ansible command; stage them here,
        # before any case, so that no case's first command is the one that makes them (a fresh clone has none).
        ansible_dir()
        s = socket.socket()
        s.bind((HOST, 0))
        self.port = s.getsockname()[1]  # nothing listens there once closed
        s.close()
        proj = self.template / "proj"
        init(proj)
        safe = V.inventory_doc(V.Shape(), HOST, self.port)
        (proj / "inventories" / "hosts.yml").write_text(safe)  # not the example's addresses
        (proj / "space.yaml").write_text(V.space_doc(V.Shape()))
        (proj / "record.json").write_text(V.record_doc(V.Shape()))
        (proj / "sweep.json").write_text(V.sweep_doc(V.Shape()))
        (proj / "benign.json").write_text(V.json_doc(V.Shape()))
        self.shared.mkdir()
        (self.shared / "inv.yml").write_text(safe)
        (self.shared / "vault.pw").write_text(V.VAULT_PASSWORD + "\n")
        os.chmod(self.shared / "vault.pw", 0o600)
        self.state.mkdir()

    def close(self) -> None:
        self.servers.stop()

    # --- one case ------------------------------------------------------------------------------------------------

    def fill(self, text: str) -> str:
        return text.format(inv=self.shared / "inv.yml", vault_pw=self.shared / "vault.pw", url=self.servers.closed)

    def benign(self, o: Option) -> str:
        if (o.command, o.dest) in BENIGN_OPTION:
            return BENIGN_OPTION[(o.command, o.dest)]
        if o.cls == "path":
            return self.fill(BENIGN_KIND.get(o.kind, BENIGN_KIND["json"]))
        if o.cls == "choice" and o.choices:
            return o.choices[0]
        return self.fill(BENIGN_CLASS.get(o.cls, "x"))

    def hostile(self, case: Case, slot: Path, secrets: V.Secrets, env: dict[str, str]) -> list[str]:
        """The option's hostile value(s), made for this case: the command-line words for the value."""
        o, v, proj = case.option, case.value, slot / "proj"
        if isinstance(o, Place):
            target = proj / o.path
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists() or target.is_symlink():
                target.unlink()
            made = V.make_path(v, o.kind, target, slot / "outside", secrets, self.shared)
            env.update(made.env)
            return []
        if o.cls == "flag":
            return [o.flag] * V.REPEAT if v == "repeat" else [f"{o.flag}={V.EXPLICIT[v]}"]  # type: ignore[list-item]
        if o.cls == "path":
            made = V.make_path(v, o.kind, proj / f"hostile{V.KIND.get(o.kind, V.KIND['json']).ext}",
                               slot / "outside", secrets, self.shared)  # fmt: skip
            env.update(made.env)
            return ["./" + made.value]
        if o.cls == "url" and v.startswith("url_"):
            return [self.servers.url(v, secrets)]
        return [V.TEXT[v](secrets)]

    def compose(self, case: Case, slot: Path) -> Prepared:
        secrets = V.Secrets.of(SEED, case.no)
        env: dict[str, str] = {}
        words = self.hostile(case, slot, secrets, env)
        proj = slot / "proj"
        outputs: list[Path] = []
        if isinstance(case.option, Place):
            argv = [self.fill(a) for a in case.option.argv]
        else:
            assert case.command is not None
            cmd = case.command
            path = cmd.path
            opts: list[str] = []
            positionals: list[str] = []
            by_dest: dict[str, str] = {}
            for o in cmd.options:
                if o is case.option:
                    given = words
                elif (
                    o.required
                    or (o.flags and o.cls == "path" and o.kind in GIVEN_ALWAYS)
                    or (not o.flags and o.nargs != argparse.REMAINDER)
                ):  # every positional but a command's rest: the optional ones name what the command works on
                    given = [self.benign(o)]
                else:
                    continue
                if o.flags:
                    flag = o.flag or ""
                    if o.cls == "flag":
                        opts += given
                    elif flag.startswith("--"):
                        opts += [f"{flag}={w}" for w in given]
                    else:
                        opts += [flag + w for w in given]
                else:
                    positionals += given
                if given:
                    by_dest[o.dest] = given[0]
                if o.output and given:
                    outputs.append(proj / given[0])
                    if o.kind in RESOLVED:
                        outputs.append(Path(os.path.realpath(proj / given[0])))
            if any(p.startswith("-") for p in positionals):
                positionals = ["--", *positionals]
            base = [self.fill(a) for a in BASE.get(path, [])]
            argv = [*opts, *TOP_COMMAND] if not path else [*path, *base, *opts, *positionals]
            for extra in OUTPUTS.get(path, []):
                outputs.append(proj / (extra(by_dest) if callable(extra) else extra))
        full = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "KNOBFLEET_", "COVERAGE_"))}
        full.update(
            HOME=str(slot / "home"),
            TMPDIR=str(slot / "tmp"),
            KNOBFLEET_STATE_DIR=str(self.state),
            KNOBFLEET_PROMETHEUS=self.servers.closed,
            PYTHONDONTWRITEBYTECODE="1",
            COLUMNS="100",
        )
        full.update(env)
        return Prepared(argv, full, outputs, secrets, (case.option.cls, case.value) in V.NEVER_SHOWN)

    def reset(self, slot: Path) -> None:
        for name in ("proj", "home", "outside", "tmp", "run"):
            d = slot / name
            if d.is_symlink() or d.is_file():
                d.unlink()
            elif d.exists():
                shutil.rmtree(d)
        shutil.copytree(self.template / "proj", slot / "proj", symlinks=True)
        for name in ("home", "outside", "tmp", "run"):
            (slot / name).mkdir()

    def execute(self, case: Case, slot: Path, slots: list[Path]) -> Result:
        self.reset(slot)
        prep = self.compose(case, slot)
        run = slot / "run"
        skip = {self.state, run, *[s for s in slots if s != slot]}
        before = snapshot(self.root, skip)
        had = self.secrets_in(slot, prep.secrets)
        spec = run / "spec.json"
        parse_only = [list(p) for p in PARSE_ONLY]
        roots = [str(self.root), *[str(p) for p in STAGED]]
        spec.write_text(json.dumps({"argv": prep.argv, "log": str(run / "driver.log"), "roots": roots,
                                    "parse_only": parse_only}))  # fmt: skip
        usage = run / "usage.txt"
        result = Result(case, prep.argv)
        with (run / "stdout").open("wb") as out, (run / "stderr").open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-c", WRAPPER, str(usage), sys.executable, str(DRIVER), str(spec)],
                cwd=slot / "proj",
                env=prep.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        started = time.monotonic()
        try:
            proc.wait(timeout=LIMIT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        result.seconds = time.monotonic() - started
        if usage.exists():
            rc, rss = (int(x) for x in usage.read_text().split())
            result.rc, result.maxrss_kib = rc, rss
        with contextlib.suppress(ProcessLookupError):  # whatever the command left running ends with the case
            os.killpg(proc.pid, signal.SIGKILL)
        result.out = (run / "stdout").read_text(errors="replace")
        result.err = (run / "stderr").read_text(errors="replace")
        log = run / "driver.log"
        if log.exists():
            result.log = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        after = snapshot(self.root, skip)
        self.diff(result, prep, slot, before, after, had)
        self.judge(result, prep)
        return result

    def diff(
        self,
        result: Result,
        prep: Prepared,
        slot: Path,
        before: dict[str, tuple[object, ...]],
        after: dict[str, tuple[object, ...]],
        had: dict[str, set[str]],
    ) -> None:
        declared = [os.path.relpath(p, self.root) for p in prep.outputs]
        declared += [os.path.relpath(slot / t, self.root) for t in TOLERATED]

        def under(rel: str) -> bool:
            return any(rel == d or rel.startswith(d + os.sep) for d in declared)

        for rel in sorted(set(before) | set(after)):
            was, now = before.get(rel), after.get(rel)
            if was == now:
                continue
            if now is not None and now[0] == "file":
                text = read_head(self.root / rel)
                found = [m for m in prep.secrets.markers if m in text and m not in had.get(rel, set())]
                if found:
                    result.leaked.append(f"{rel}: {', '.join(found)}")
            if not under(rel):
                what = "made" if was is None else "removed" if now is None else "changed"
                result.changed.append(f"{rel} ({what})")

    def secrets_in(self, slot: Path, secrets: V.Secrets) -> dict[str, set[str]]:
        """The case's secrets in the files the case starts with (its hostile files): a command that replaces such a
        file keeping what it held (a calibrations file it merges into) wrote no new secret."""
        out: dict[str, set[str]] = {}
        for dirpath, _, files in os.walk(slot):
            for name in files:
                p = Path(dirpath) / name
                try:
                    st = p.lstat()
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode) and st.st_size <= 1024 * 1024:
                    text = read_head(p)
                    found = {m for m in secrets.markers if m in text}
                    if found:
                        out[os.path.relpath(p, self.root)] = found
        return out

    def judge(self, r: Result, prep: Prepared) -> None:
        p = r.problems
        path = r.case.command.path if r.case.command is not None else ()
        if isinstance(r.case.option, Place):
            path = tuple(a for a in r.case.option.argv if not a.startswith("-"))[:1]
        if r.rc is None:
            p.append(f"still running after {LIMIT_S:g} s")
            return
        if r.maxrss_kib >= LIMIT_KIB:
            p.append(f"peak memory {r.maxrss_kib // 1024} MiB")
        if r.rc not in EXIT_CODES or r.rc not in contract(path):
            p.append(f"exit {r.rc}: not in the command's contract {sorted(contract(path))}")
        if "Traceback" in r.out + r.err:
            p.append("a traceback")
        if "internal error" in r.err:
            p.append("an internal error")
        lines = refusal_lines(r.err)
        if r.rc != 0 and len(lines) > 1:
            p.append(f"a refusal of {len(lines)} lines on stderr")
        raw = [repr(c) for c in V.INVISIBLE if c in r.err]
        if raw:
            p.append(f"raw {', '.join(raw)} on stderr")
        if "--json" not in " ".join(r.argv):
            raw = [repr(c) for c in V.INVISIBLE if c in r.out]
            if raw:
                p.append(f"raw {', '.join(raw)} on stdout")
        for kind, what in r.log:
            p.append(f"the driver refused a {kind}: {what[:200]}")
        if r.changed:
            p.append(f"changed outside its outputs: {r.changed[:5]}")
        if r.leaked:
            p.append(f"a secret in a file it wrote: {r.leaked[:5]}")
        if prep.never_shown:
            shown = [m for m in prep.secrets.markers if m in r.out + r.err]
            if shown:
                p.append(f"a secret printed: {shown}")

    # --- all of them -----------------------------------------------------------------------------------------------

    def run(self, cases: list[Case], on_result: Callable[[Result], None] | None = None) -> list[Result]:
        todo: queue.Queue[Case] = queue.Queue()
        for c in cases:
            todo.put(c)
        slots = [self.root / f"slot{i}" for i in range(self.workers)]
        for s in slots:
            s.mkdir(exist_ok=True)
        results: list[Result] = []
        lock = threading.Lock()

        def work(slot: Path) -> None:
            while True:
                try:
                    case = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    r = self.execute(case, slot, slots)
                except Exception as exc:  # the harness's own failure for this case, reported as one
                    r = Result(case, [], problems=[f"harness: {type(exc).__name__}: {exc}"])
                with lock:
                    results.append(r)
                    if on_result:
                        on_result(r)

        threads = [threading.Thread(target=work, args=(s,)) for s in slots]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.scan_state(results)
        return sorted(results, key=lambda r: r.case.no)

    def scan_state(self, results: list[Result]) -> None:
        """Every file of the state folder, searched for every case's secrets (the folder is shared by the cases)."""
        owner = {m: r for r in results for m in V.Secrets.of(SEED, r.case.no).markers}
        shapes = re.compile(V.MARKER_SHAPES)
        for dirpath, _, files in os.walk(self.state):
            for name in files:
                p = Path(dirpath) / name
                if p.is_symlink() or not p.is_file():
                    continue
                for marker in set(shapes.findall(read_head(p))):
                    r = owner.get(marker)
                    if r is not None:
                        where = os.path.relpath(p, self.root)
                        r.leaked.append(f"{where}: {marker}")
                        r.problems.append(f"a secret in a file it wrote: {where}")

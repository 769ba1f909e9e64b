"""The same profile change applied three ways, interleaved, on the same lab hosts:

* knobfleet apply (the CLI, end to end: render, ansible-runner, live checks),
* plain ansible-playbook playbooks/apply.yml with the same vars and the same SSH/pipelining settings,
* a minimal hand-written ssh script: copy the rendered script and unit, daemon-reload, restart, wait for health.

Every run flips the hosts between ctas512 and ctas768, so each one really changes files and restarts the
engine. The engine's own restart + readiness time (measured by the ssh script: restart until /health_generate
answers 200) is subtracted from every path; prints medians and ratios.
Usage: python perf/apply_overhead.py [--hosts 3] [--repeats 5]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from _lab import KNOBFLEET, REPO, boot, interleave, med, run, table

sys.path.insert(0, str(REPO / "python"))
from knobfleet.engines.adapter import engine as engine_adapter
from knobfleet.fleet.inventory import load_hosts
from knobfleet.fleet.runner import dump_vars
from knobfleet.profiles.store import ProfileStore
from knobfleet.render import profile_vars, render_host

PROFILES = ("ctas768", "ctas512")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    lab, inv = boot(args.hosts)
    hvs = load_hosts(inv)
    store = ProfileStore()
    rendered = {p: {hv.host: render_host(store.resolve(p), hv) for hv in hvs} for p in PROFILES}
    tmp = Path(tempfile.mkdtemp(prefix="kf-apply-"))
    for p in PROFILES:
        (tmp / f"{p}.yml").write_text(
            dump_vars(
                {"knob_serve_run_id": "perf"},
                {
                    "knob_serve_profile": profile_vars(store.resolve(p)),
                    # what knobfleet passes too: the engine adapter's data (the role cannot read catalogs)
                    "knob_serve_engine": engine_adapter(store.resolve(p).engine).role_vars(),
                },
            )
        )
    state = {"i": 0}
    engine: list[float] = []

    def next_profile() -> str:
        state["i"] += 1
        return PROFILES[state["i"] % 2]

    def knobfleet() -> float:
        return run([*KNOBFLEET, "apply", next_profile(), "-i", str(inv), "--yes"])

    env = os.environ.copy()
    env.update(
        {
            "ANSIBLE_ROLES_PATH": str(REPO / "roles"),
            "ANSIBLE_PIPELINING": "True",
            "ANSIBLE_SSH_ARGS": "-o ControlMaster=auto -o ControlPersist=300s",
            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(tmp / "cp"),
            "ANSIBLE_GATHERING": "explicit",
            "ANSIBLE_FORKS": str(args.hosts),
            "ANSIBLE_HOST_KEY_CHECKING": "True",
        }
    )

    def plain(*extra: str) -> float:
        started = time.perf_counter()
        proc = subprocess.run(
            [
                str(Path(sys.executable).parent / "ansible-playbook"),
                "-i",
                str(inv),
                str(REPO / "playbooks" / "apply.yml"),
                "-e",
                f"@{tmp / (next_profile() + '.yml')}",
                *extra,
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise SystemExit(
                f"plain ansible-playbook failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}"
            )
        return time.perf_counter() - started

    def ssh_script() -> float:
        prof = next_profile()

        def one(hv) -> float:  # type: ignore[no-untyped-def]
            r = rendered[prof][hv.host]
            base = [
                "ssh",
                "-i",
                str(lab.key),
                "-o",
                f"UserKnownHostsFile={lab.known_hosts}",
                "-o",
                "BatchMode=yes",
                "-o",
                "ControlMaster=auto",
                "-o",
                f"ControlPath={tmp}/ssh-%h",
                "-o",
                "ControlPersist=300",
                f"root@{hv.address}",
            ]
            payload = r.script + "\0" + r.unit
            cmd = (
                f'python3 -c "import sys; s, u = sys.stdin.read().split(chr(0)); '
                f"open('{hv.script_path}.new', 'w').write(s); open('{hv.unit_path}.new', 'w').write(u)\" && "
                f"chmod 0755 {hv.script_path}.new && mv {hv.script_path}.new {hv.script_path} && "
                f"mv {hv.unit_path}.new {hv.unit_path} && systemctl daemon-reload"
            )
            subprocess.run([*base, cmd], input=payload, text=True, check=True, capture_output=True)
            t0 = time.perf_counter()
            subprocess.run([*base, f"systemctl restart {hv.unit_name}"], check=True, capture_output=True)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    with urllib.request.urlopen(hv.health_url, timeout=2) as resp:
                        if resp.status == 200:
                            break
                except OSError:
                    time.sleep(0.05)
            return time.perf_counter() - t0

        started = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(hvs)) as pool:
            engine.append(max(pool.map(one, hvs)))
        return time.perf_counter() - started

    knobfleet()  # warm every path's connections once
    plain()
    ssh_script()
    engine.clear()
    # The role's defaults verify on the host after readiness (one more remote call); knobfleet sets
    # knob_serve_verify=false and checks the ready engine's probe itself: timed both ways.
    times = interleave(
        {
            "knobfleet apply": knobfleet,
            "ansible-playbook": plain,
            "ansible-playbook, no on-host verify": lambda: plain("-e", "knob_serve_verify=false"),
            "ssh script": ssh_script,
        },
        args.repeats,
    )
    e = med(engine)
    rows = []
    base = {k: med(v) - e for k, v in times.items()}
    for name, xs in times.items():
        rows.append(
            [
                name,
                len(xs),
                f"{med(xs):.2f}",
                f"{base[name]:.2f}",
                f"{base[name] / base['ansible-playbook']:.2f}x",
                f"{base[name] / base['ssh script']:.2f}x",
            ]
        )
    print(f"{args.hosts} hosts; engine restart + readiness (median of the ssh script's runs): {e:.2f}s")
    print(table(["path", "runs", "wall median s", "minus engine s", "vs ansible-playbook", "vs ssh script"], rows))


if __name__ == "__main__":
    main()

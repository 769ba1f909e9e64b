"""Time `knobfleet lab up -n N` until every host answers SSH (a real `ssh true`), for N = 3 and 16.

Each size is booted REPEATS times from nothing (lab down in between); prints medians and the per-host
cost. Usage: python perf/lab_boot.py [--sizes 3,16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import subprocess
import time

from _lab import Lab, med, table


def boot_once(n: int) -> tuple[float, float]:
    lab = Lab()
    lab.down()
    started = time.perf_counter()
    lab.up(n)
    port_s = time.perf_counter() - started

    def ssh_true(i: int) -> None:
        subprocess.run(lab.ssh_argv(lab.host(i), ["true"]), check=True, capture_output=True, timeout=60)

    with concurrent.futures.ThreadPoolExecutor(max_workers=n) as pool:
        list(pool.map(ssh_true, range(1, n + 1)))
    return port_s, time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="3,16")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for n in [int(x) for x in args.sizes.split(",")]:
        ups, sshs = [], []
        for _ in range(args.repeats):
            up, ssh = boot_once(n)
            ups.append(up)
            sshs.append(ssh)
        rows.append([n, args.repeats, f"{med(ups):.2f}", f"{med(sshs):.2f}", f"{med(sshs) / n:.3f}"])
        print(
            table(["hosts", "runs", "lab up s (sshd listening)", "until ssh true works s", "s per host"], rows[-1:]),
            flush=True,
        )
    Lab().down()
    print("\nlab boot (median)")
    print(table(["hosts", "runs", "lab up s (sshd listening)", "until ssh true works s", "s per host"], rows))


if __name__ == "__main__":
    main()

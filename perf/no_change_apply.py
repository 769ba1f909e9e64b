"""An apply that changes nothing (the idempotent path) on 3 and on 16 hosts, interleaved per size.

Prints medians and the 16-host / 3-host ratio (target <= 1.5x: cost must not grow linearly with hosts),
for `knobfleet apply` as shipped (one fast probe per host finds them in sync; no playbook runs) and with
`--via ansible` (the role's own idempotent run on every host).
Usage: python perf/no_change_apply.py [--sizes 3,16] [--repeats 5]
"""

from __future__ import annotations

import argparse

from _lab import CPU, KNOBFLEET, boot, med, run, table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="3,16")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    _lab, inv = boot(max(sizes))
    cmd = [*KNOBFLEET, "apply", "ctas512", "-i", str(inv), "--yes"]
    run(cmd)  # first apply: adopt and change everything
    ways = {"knobfleet apply": [], "apply --via ansible": ["--via", "ansible"]}
    times: dict[tuple[str, int], list[float]] = {(w, n): [] for w in ways for n in sizes}
    cpu: dict[tuple[str, int], list[float]] = {(w, n): [] for w in ways for n in sizes}
    for r in range(args.repeats):
        for way, extra in ways.items() if r % 2 == 0 else reversed(ways.items()):
            for n in sizes if r % 2 == 0 else reversed(sizes):
                limit = ",".join(f"lab{i}" for i in range(1, n + 1))
                times[way, n].append(run([*cmd, *extra, "--limit", limit]))
                cpu[way, n].append(CPU[-1])
    first = sizes[0]
    rows = [
        [
            way,
            n,
            len(times[way, n]),
            f"{med(times[way, n]):.2f}",
            f"{med(times[way, n]) / med(times[way, first]):.2f}x",
            f"{med(cpu[way, n]):.2f}",
            f"{med(cpu[way, n]) / med(cpu[way, first]):.2f}x",
        ]
        for way in ways
        for n in sizes
    ]
    print("no-change apply (changed=0, no restart); lab hosts run on the controller's own cores")
    heads = ["path", "hosts", "runs", "wall median s", f"wall vs {first}", "controller CPU s", f"CPU vs {first}"]
    print(table(heads, rows))


if __name__ == "__main__":
    main()

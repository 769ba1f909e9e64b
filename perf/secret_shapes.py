"""How long the credential-shape check takes on long values: the URL shape as knob_redact.secret_shape checks it
now (per line from the line's last "@", ``has_url_password``) against the URL shape's own regex run over the same
value, the way secret_shape ran it before, in the same process; and the whole secret_shape (every shape).

The values are what an attacker or a careless generator hands in: a 64 KiB-capped run of "/a://b:" (a scheme at
every seventh character, no "@": the regex tries each scheme and runs to the line's end), the same with one "@" at
the end, and an innocent long path. Each size is timed ``--repeats`` times, interleaved; medians and ratios.

Usage: python perf/secret_shapes.py [--sizes 1000,4000,9000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import re
import statistics
import time

from knobfleet.module_utils.knob_redact import SHAPES, has_url_password, secret_shape

URL = dict(SHAPES)["a URL with a password in it"]


def values(n: int) -> dict[str, str]:
    return {
        "schemes, no @": "x://y:" + "/a://b:" * n,
        "schemes, @ at the end": "x://y:" + "/a://b:" * n + "c@d",
        "a long path": "/srv/" + "models/" * n,
    }


def timed(fn: object, value: str) -> float:
    started = time.perf_counter()
    fn(value)  # type: ignore[operator]
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,4000,9000")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(f"{'value':<24} {'chars':>7} {'linear URL':>11} {'URL regex':>11} {'ratio':>8} {'secret_shape':>13}")
    for n in (int(x) for x in args.sizes.split(",")):
        for what, value in values(n).items():
            text = value[: 64 * 1024]  # what secret_shape looks at
            new, old, whole = [], [], []
            for _ in range(args.repeats):
                new.append(timed(has_url_password, text))
                old.append(timed(lambda v: re.search(URL, v), text))
                whole.append(timed(secret_shape, value))
            a, b, c = (statistics.median(x) for x in (new, old, whole))
            print(f"{what:<24} {len(text):>7} {a * 1000:>9.2f}ms {b * 1000:>9.2f}ms {b / a:>7.1f}x {c * 1000:>11.2f}ms")


if __name__ == "__main__":
    main()

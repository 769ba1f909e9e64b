"""Parsers of command-line values shared by several commands (one clear line per bad value)."""

from __future__ import annotations

import math

from knobfleet.errors import KnobfleetError


def parse_weights(text: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for part in text.split(","):
        conc, sep, weight = part.partition("=")
        try:
            c, w = int(conc), float(weight)
        except ValueError:
            raise KnobfleetError(f"--weights {text!r}: expected C=W pairs such as 48=0.3,64=0.3") from None
        if not sep or c < 1 or c > 1_000_000 or not math.isfinite(w) or w < 0:
            raise KnobfleetError(
                f"--weights {text[:80]!r}: expected C=W pairs with 1 <= C <= 1000000 and W a finite number >= 0"
            )
        out[c] = w
    if not math.isfinite(sum(out.values())) or sum(out.values()) <= 0:
        raise KnobfleetError(f"--weights {text!r}: weights must add up to more than 0")
    return out


def weights_option(text: str) -> str:
    """--weights as argparse checks it while the command line is parsed (so a bad value is the usage error, 64,
    whatever other options are given): the text, once ``parse_weights`` accepts it."""
    from knobfleet.argtypes import refuse

    try:
        parse_weights(text)
    except KnobfleetError as exc:
        raise refuse(str(exc)) from None
    return text


def parse_int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise KnobfleetError(f"{flag} {text!r}: expected comma-separated integers such as 48,64,80") from None
    if not values or min(values) < 1:
        raise KnobfleetError(f"{flag} {text!r}: expected integers >= 1")
    return values

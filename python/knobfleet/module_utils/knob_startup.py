"""What one engine start cost, measured on the host (pure but for nothing: the caller hands in what systemd and the
journal said). Used by the knob_ready module after the engine answered its health URL, and by the CLI's ``plan``
to price the restarts it is about to cause (``ops/restart_cost.py``).

A start is read from three sources on the same clock (CLOCK_MONOTONIC, in microseconds, as systemd and journald
stamp it):

- the unit's timestamps (``systemctl show``): ``ActiveExitTimestampMonotonic`` (the old engine was asked to stop),
  ``InactiveEnterTimestampMonotonic`` (it was gone), ``InactiveExitTimestampMonotonic`` (the new start began: its
  ExecStartPre), ``ExecMainStartTimestampMonotonic`` (the engine's own process began);
- the moment the health URL first answered 200 (knob_ready's own clock, ``time.monotonic``);
- the engine's log lines in the unit's journal since the start, matched against the phase patterns of its catalog
  (``serve.startup_phases``: SGLang's "Load weight end", "Memory pool end", "Capture ... CUDA graph end"; vLLM's
  "Model loading took", "torch.compile takes", "Graph capturing finished", "init engine ... took").

A phase ends at the *last* line that matches it before the engine was ready (SGLang captures a prefill and a decode
graph, each logged), and lasts from the end of the phase before it (or the engine process's start) to there;
``serving`` is the rest, from the last phase to the first health 200 (the HTTP server coming up, the first health
generate). A phase the log never shows is not reported: knobfleet never invents a phase."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: knob_ready imports this on the host
    from re import Pattern
    from typing import Any

    Entry = tuple[int, str]

TIMESTAMPS = (
    "ActiveExitTimestampMonotonic",
    "InactiveEnterTimestampMonotonic",
    "InactiveExitTimestampMonotonic",
    "ExecMainStartTimestampMonotonic",
)
MAX_LINE = 4096  # longer journal messages are never matched (an engine's dump of its whole config)


def _us(props: dict[str, str], name: str) -> int:
    try:
        return int(props.get(name) or 0)
    except ValueError:
        return 0


def timing(props: dict[str, str], ready_us: int, restarted: bool) -> dict[str, Any] | None:
    """The start's own figures, in seconds, from the unit's timestamps (``props``: ``systemctl show`` of
    TIMESTAMPS) and the monotonic microsecond at which the health URL first answered 200:

    - ``stop_s``: the old engine's stop (only for a restart whose stop systemd recorded in order, else None);
    - ``pre_s``: from the start to the engine's own process (ExecStartPre: a container's ``rm --force``);
    - ``start_s``: from the start to ready (what a restart takes the host out of service for, after the stop);
    - ``started_us``, ``main_us``: the start's and the engine process's monotonic microseconds (phases count
      from them).

    None where the unit's start timestamp is missing or later than ready (a unit that never started here)."""
    start = _us(props, "InactiveExitTimestampMonotonic")
    if start <= 0 or start > ready_us:
        return None
    main = _us(props, "ExecMainStartTimestampMonotonic")
    if not start <= main <= ready_us:
        main = start
    stop_s = None
    left, gone = _us(props, "ActiveExitTimestampMonotonic"), _us(props, "InactiveEnterTimestampMonotonic")
    if restarted and 0 < left <= gone <= start:
        stop_s = round((gone - left) / 1e6, 3)
    return {
        "stop_s": stop_s,
        "pre_s": round((main - start) / 1e6, 3),
        "start_s": round((ready_us - start) / 1e6, 3),
        "started_us": start,
        "main_us": main,
    }


def journal_entries(text: str) -> list[Entry]:
    """(monotonic microseconds, message) of each line of ``journalctl -o json`` output; lines that are not JSON
    objects, or lack either field, are skipped (journald writes a binary MESSAGE as a list of byte values: it is
    decoded as UTF-8, replacing what is not)."""
    import json

    out: list[Entry] = []
    for line in text.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if not isinstance(doc, dict):
            continue
        message = doc.get("MESSAGE")
        if isinstance(message, list) and all(isinstance(b, int) and 0 <= b < 256 for b in message):
            message = bytes(message).decode("utf-8", "replace")
        try:
            at = int(doc.get("__MONOTONIC_TIMESTAMP") or "")
        except ValueError:
            continue
        if isinstance(message, str):
            out.append((at, message))
    return out


def compile_phases(phases: list[dict[str, Any]] | None) -> list[tuple[str, Pattern[str]]]:
    """[(name, compiled pattern)] of the catalog's phases ([{name, pattern}]); a pattern that does not compile is a
    ValueError naming it (the catalog's own validation refuses it first)."""
    import re

    out: list[tuple[str, Pattern[str]]] = []
    for p in phases or []:
        try:
            out.append((str(p["name"]), re.compile(str(p["pattern"]))))
        except (KeyError, TypeError, re.error) as exc:
            raise ValueError("startup phase %r: %s" % (p, exc)) from None
    return out


def phases(
    entries: list[Entry], patterns: list[tuple[str, Pattern[str]]], main_us: int, ready_us: int
) -> list[dict[str, Any]]:
    """The start's phases: [{"phase", "s", "end_s"}] in the order they ended, ``end_s`` counted from the engine
    process's start (``main_us``), then ``serving`` up to ready. ``entries``: (monotonic us, message), ``patterns``:
    compile_phases' output. Lines before the process started or after ready are not this start's."""
    ends: dict[str, int] = {}
    for at, message in entries:
        if not main_us <= at <= ready_us or len(message) > MAX_LINE:
            continue
        for name, rx in patterns:
            if rx.search(message):
                ends[name] = at  # the last match before ready
    out: list[dict[str, Any]] = []
    prev = main_us
    for name, at in sorted(ends.items(), key=lambda kv: kv[1]):
        out.append({"phase": name, "s": round((at - prev) / 1e6, 3), "end_s": round((at - main_us) / 1e6, 3)})
        prev = at
    if out:
        out.append(
            {"phase": "serving", "s": round((ready_us - prev) / 1e6, 3), "end_s": round((ready_us - main_us) / 1e6, 3)}
        )
    return out

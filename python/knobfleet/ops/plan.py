"""Pure helpers for apply: batches, knob-level changes from script diffs, live-state checks."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from knobfleet.errors import KnobfleetError

ENGINE_PREFIXES = ("SGLANG_", "SGL_", "VLLM_")


def batches(hosts: list[str], serial: str | None, canary: bool) -> list[list[str]]:
    """Split hosts into rollout batches: ``--canary`` = one host first; ``--serial N`` or ``N%``."""
    if not hosts:
        return []
    rest = list(hosts)
    out: list[list[str]] = []
    if canary:
        out.append([rest.pop(0)])
    if not rest:
        return out
    if serial is None:
        return [*out, rest]
    text = serial.strip()
    try:
        if text.endswith("%"):
            pct = float(text[:-1])
            if not 0 < pct <= 100:
                raise ValueError
            size = max(1, math.floor(len(hosts) * pct / 100))
        else:
            size = int(text)
            if size < 1:
                raise ValueError
    except ValueError:
        raise KnobfleetError(f"--serial {serial!r}: expected a count such as 2 or a percentage such as 25%") from None
    return out + [rest[i : i + size] for i in range(0, len(rest), size)]


def shell_statements(text: str) -> list[list[str]]:
    """Split shell text into statements (lists of words) the way bash reads simple scripts: single quotes are
    literal, double quotes honour backslash before $ ` " \\ and newline, an unquoted backslash escapes the
    next character (backslash-newline joins lines), # starts a comment at a word start, and newline or ;
    ends a statement. Expansions ($VAR, $(...)) are kept as text, never run."""
    statements: list[list[str]] = []
    words: list[str] = []
    word: list[str] = []
    in_word, i, n = False, 0, len(text)

    def end_word() -> None:
        nonlocal word, in_word
        if in_word:
            words.append("".join(word))
        word, in_word = [], False

    def end_statement() -> None:
        nonlocal words
        end_word()
        if words:
            statements.append(words)
        words = []

    while i < n:
        c = text[i]
        if c == "'":
            j = text.find("'", i + 1)
            j = n if j < 0 else j
            word.append(text[i + 1 : j])
            in_word, i = True, j + 1
            continue
        if c == '"':
            i += 1
            while i < n and text[i] != '"':
                if text[i] == "\\" and i + 1 < n and text[i + 1] in '$`"\\\n':
                    if text[i + 1] != "\n":
                        word.append(text[i + 1])
                    i += 2
                    continue
                word.append(text[i])
                i += 1
            in_word, i = True, i + 1
            continue
        if c == "\\":
            if i + 1 < n and text[i + 1] != "\n":
                word.append(text[i + 1])
                in_word = True
            i += 2
            continue
        if c == "#" and not in_word:
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if c in "\n;":
            end_statement()
            i += 1
            continue
        if c in " \t":
            end_word()
            i += 1
            continue
        word.append(c)
        in_word = True
        i += 1
    end_statement()
    return statements


def script_env_argv(text: str) -> tuple[dict[str, str], list[str]]:
    """Exported env vars and the exec argv of a serve script."""
    env: dict[str, str] = {}
    argv: list[str] = []
    for words in shell_statements(text):
        if words[0] == "export":
            for w in words[1:]:
                name, sep, value = w.partition("=")
                if sep and name.replace("_", "a").isalnum() and not name[0].isdigit():
                    env[name] = value
        elif words[0] == "exec":
            argv = words[1:]
    return env, argv


def parse_script(text: str) -> tuple[dict[str, str], list[str]]:
    """Env exports and exec argv of a serve script (knobfleet's or a simple hand-written one).

    The same lexer is copied into roles/knob_serve/library/knob_generation.py (modules are standalone);
    tests/unit/test_plan.py checks that the two copies agree."""
    return script_env_argv(text)


def _flags(argv: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok.startswith("--"):
            name, sep, value = tok[2:].partition("=")
            if not sep and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                value, i = argv[i + 1], i + 1
            out[name] = value if (sep or value) else "(set)"
        i += 1
    return out


@dataclass(frozen=True)
class KnobChange:
    kind: str  # env | flag
    name: str
    before: str | None
    after: str | None

    def __str__(self) -> str:
        label = self.name if self.kind == "env" else f"--{self.name}"
        before = "(unset)" if self.before is None else self.before
        after = "(unset)" if self.after is None else self.after
        return f"{label} {before} → {after}"


def knob_changes(before_script: str, after_script: str) -> list[KnobChange]:
    env_a, argv_a = parse_script(before_script)
    env_b, argv_b = parse_script(after_script)
    out = [
        KnobChange("env", k, env_a.get(k), env_b.get(k))
        for k in sorted(env_a.keys() | env_b.keys())
        if env_a.get(k) != env_b.get(k)
    ]
    fa, fb = _flags(argv_a), _flags(argv_b)
    out += [
        KnobChange("flag", k, fa.get(k), fb.get(k)) for k in sorted(fa.keys() | fb.keys()) if fa.get(k) != fb.get(k)
    ]
    return out


@dataclass(frozen=True)
class LiveCheck:
    ok: bool
    main_pid: int | None
    problems: list[str]
    seen: dict[str, str]  # knob → value live in the main process


def check_live(
    expected_env: dict[str, str],
    expected_argv: list[str],
    main_pid: int | None,
    processes: list[dict[str, Any]],
    watch: list[str],
) -> LiveCheck:
    """Compare the engine's live processes with what was rendered: every profile env var in every
    process of the unit, and the main process's cmdline."""
    problems: list[str] = []
    main = next((p for p in processes if p.get("pid") == main_pid), None)
    if main is None:
        return LiveCheck(False, main_pid, [f"main process {main_pid} not found in the unit's cgroup"], {})
    if main.get("cmdline") != expected_argv:
        problems.append(f"pid {main_pid}: cmdline differs from the rendered argv")
    for proc in processes:
        env = proc.get("env") or {}
        for name, value in expected_env.items():
            if env.get(name) != value:
                problems.append(
                    f"pid {proc.get('pid')} ({proc.get('comm')}): {name}={env.get(name)!r}, expected {value!r}"
                )
        for name in sorted(env):
            if name.startswith(ENGINE_PREFIXES) and name not in expected_env:
                problems.append(
                    f"pid {proc.get('pid')} ({proc.get('comm')}): {name}={env[name]!r} is live but not in "
                    "the profile (a drop-in or the unit's environment injects it)"
                )
    seen = {k: (main.get("env") or {}).get(k, "(unset)") for k in watch}
    return LiveCheck(not problems, main_pid, problems, seen)

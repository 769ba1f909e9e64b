"""The knob-level plan diff (``ops/plan.knob_changes``) as properties: between two serve scripts, every env var
and every flag whose value changed, appeared or disappeared is reported once, with its before and after, and
nothing else is — whichever way the scripts spell their flags (``--tp 2``, ``--tp=2``) and quote their values.
Plus what ``plan_host`` reports next to the findings: the file diffs, the knob changes, the pid, the live knobs.
"""

from __future__ import annotations

import copy
import json
import random
import shlex
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knobfleet.engines.adapter import engine
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.inventory import load_hosts
from knobfleet.live.verify import Declared
from knobfleet.ops.plan import KnobChange, file_diff, knob_changes, plan_host, seen_knobs
from knobfleet.profiles.store import ProfileStore
from knobfleet.render import render_host

Flags = dict[str, "str | bool"]

ENV_NAME = st.from_regex(r"[A-Z_][A-Z0-9_]{0,12}", fullmatch=True)
FLAG_NAME = st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True)
# Any printable value but an empty one or one starting with "--" (an argv cannot tell those from a bare flag
# followed by another flag, whatever the parser)
VALUE = st.text(st.characters(min_codepoint=32, max_codepoint=0x24F), min_size=1, max_size=12).filter(
    lambda v: not v.startswith("--")
)
ENVS = st.dictionaries(ENV_NAME, st.text(st.characters(min_codepoint=32, max_codepoint=0x24F), max_size=12), max_size=5)
FLAGS = st.dictionaries(FLAG_NAME, st.one_of(st.just(True), VALUE), max_size=5)
HEAD = ["/usr/bin/python3", "-m", "sglang.launch_server"]


def script(env: dict[str, str], flags: Flags, style: str, rnd: random.Random | None = None) -> str:
    """A serve script: knobfleet's own (``--flag=value``, one export per line) or a hand-written one
    (``--flag value``, several exports on one line, a comment); ``rnd`` shuffles the flags."""
    lines = ["#!/bin/bash", "# hand-written" if style == "hand" else "set -euo pipefail"]
    names = sorted(env)
    if style == "hand" and names:
        lines.append("export " + " ".join(f"{k}={shlex.quote(env[k])}" for k in names))
    else:
        lines += [f"export {k}={shlex.quote(env[k])}" for k in names]
    argv = list(HEAD)
    items = sorted(flags.items())
    if rnd is not None:
        rnd.shuffle(items)
    for name, value in items:
        if value is True:
            argv.append(f"--{name}")
        elif style == "hand":
            argv += [f"--{name}", str(value)]
        else:
            argv.append(f"--{name}={value}")
    lines.append("exec " + " \\\n  ".join(shlex.quote(t) for t in argv))
    return "\n".join(lines) + "\n"


def expected_changes(env_a: dict[str, str], env_b: dict[str, str], fa: Flags, fb: Flags) -> set[KnobChange]:
    def shown(v: str | bool | None) -> str | None:
        # The argv reader (module_utils/knob_argv) reads a switch as the value "true", as the engine's parser
        # reports it, so ``--x`` and ``--x true`` are one value, shown as "(set)".
        return "(set)" if v is True or v == "true" else v if isinstance(v, str) else None

    out = {KnobChange("env", k, env_a.get(k), env_b.get(k)) for k in env_a.keys() | env_b.keys()}
    out |= {KnobChange("flag", k, shown(fa.get(k)), shown(fb.get(k))) for k in fa.keys() | fb.keys()}
    return {c for c in out if c.before != c.after}


@settings(max_examples=200, deadline=None)
@given(
    env_a=ENVS,
    env_b=ENVS,
    flags_a=FLAGS,
    flags_b=FLAGS,
    style_a=st.sampled_from(["hand", "managed"]),
    style_b=st.sampled_from(["hand", "managed"]),
    rnd=st.randoms(use_true_random=False),
)
def test_every_changed_knob_is_reported_and_nothing_else(
    env_a: dict[str, str],
    env_b: dict[str, str],
    flags_a: Flags,
    flags_b: Flags,
    style_a: str,
    style_b: str,
    rnd: random.Random,
) -> None:
    before, after = script(env_a, flags_a, style_a, rnd), script(env_b, flags_b, style_b)
    changes = knob_changes(before, after)
    assert set(changes) == expected_changes(env_a, env_b, flags_a, flags_b), (before, after)
    assert len(changes) == len(set(changes))
    # env first, then flags, each sorted by name: a stable order for the report
    assert changes == sorted(changes, key=lambda c: (c.kind != "env", c.name))


@settings(max_examples=100, deadline=None)
@given(
    env=ENVS, flags=FLAGS, style_a=st.sampled_from(["hand", "managed"]), style_b=st.sampled_from(["hand", "managed"])
)
def test_the_same_knobs_spelled_differently_are_no_change(
    env: dict[str, str], flags: Flags, style_a: str, style_b: str
) -> None:
    assert knob_changes(script(env, flags, style_a), script(env, flags, style_b)) == []


@pytest.mark.parametrize(
    ("before", "after", "shown"),
    [
        ("--tp 2", "--tp 4", "--tp 2 → 4"),
        ("--tp=2", "--tp=4", "--tp 2 → 4"),
        ("--tp 2", "--tp=4", "--tp 2 → 4"),
        ("--tp 2 --enable-x", "--enable-x --tp 4", "--tp 2 → 4"),
        ("", "--enable-x", "--enable-x (unset) → (set)"),
        ("--enable-x", "", "--enable-x (set) → (unset)"),
        ("--mem 0.8", "--mem -1", "--mem 0.8 → -1"),
        ("--x a=b", "--x=a=c", "--x a=b → a=c"),
    ],
)
def test_flag_changes(before: str, after: str, shown: str) -> None:
    changes = knob_changes(f"exec sglang {before}\n", f"exec sglang {after}\n")
    assert [str(c) for c in changes] == [shown]


def test_env_changes_are_shown_by_name_without_dashes() -> None:
    changes = knob_changes("export A=1 B=2\nexec e\n", "export A=3 C=\nexec e\n")
    assert [str(c) for c in changes] == ["A 1 → 3", "B 2 → (unset)", "C (unset) → "]
    assert [c.kind for c in changes] == ["env", "env", "env"]


def test_only_the_exec_line_counts_as_argv() -> None:
    before = "export A=1\necho --tp 2\nexec e --tp 4\n"
    assert knob_changes(before, "export A=1\nexec e --tp 4\n") == []


# --- what plan_host reports beside the actions -------------------------------------------------------------

CASES = Path(__file__).parents[1] / "live" / "verify_cases"
PROFILES_V1 = Path(__file__).parents[1] / "data" / "profiles_v1"
CLEAN = json.loads((CASES / "clean" / "probe.json").read_text())


@pytest.fixture(scope="module")
def lab1() -> HostVars:
    return load_hosts(Path(__file__).parents[1] / "data" / "inventory_v1", "lab1")[0]


def plan(doc: dict[str, Any], hv: HostVars, name: str = "ctas512", break_lock: bool = False) -> Any:
    p = ProfileStore(PROFILES_V1).resolve(name)
    return plan_host(doc, render_host(p, hv), Declared(p.name, p.version, p.content_hash), engine(), "fail", break_lock)


def test_in_sync_host_has_no_diffs_and_shows_its_live_knobs(lab1: HostVars) -> None:
    p = plan(CLEAN, lab1)
    assert (p.in_sync, p.refused, p.refusal, p.diffs, p.knob_changes) == (True, False, None, [], [])
    assert p.host == "lab1"
    assert p.main_pid == int(CLEAN["unit_props"]["MainPID"])
    main = next(x for x in CLEAN["processes"] if x["pid"] == p.main_pid)
    eng = engine()
    assert p.seen == {eng.short(k): main["env"].get(k, "(unset)") for k in eng.show}
    assert any(v == "512" for v in p.seen.values())


def test_another_profile_diffs_the_script_only(lab1: HostVars) -> None:
    p = plan(CLEAN, lab1, "ctas768")
    r = render_host(ProfileStore(PROFILES_V1).resolve("ctas768"), lab1)
    installed = CLEAN["files"]["script"]["content"]
    assert p.diffs == [{"path": r.script_path, "diff": file_diff(installed, r.script, r.script_path)}]
    assert p.diffs[0]["diff"].startswith(f"--- {r.script_path} (installed)\n+++ {r.script_path} (profile)\n")
    assert "-export SGLANG_SM120_MMA_TARGET_CTAS=512\n" in p.diffs[0]["diff"]
    assert "+export SGLANG_SM120_MMA_TARGET_CTAS=768\n" in p.diffs[0]["diff"]
    assert p.knob_changes == [str(c) for c in knob_changes(installed, r.script)]
    assert not p.in_sync and not p.refused


# The installed script's tensor-parallel flag (knobfleet writes `--tp=2`) spelled otherwise by hand: plan_host
# reads both scripts with the engine's flag spec, so an alias or another spelling of the same value is no change,
# and a real change is shown under the flag's canonical name (issue 58: without the spec, `--tp` and
# `--tensor-parallel-size` were two different flags, one removed and one added).
@pytest.mark.parametrize(
    ("installed", "shown"),
    [
        ("--tp=2", []),
        ("--tp 2", []),
        ("--tp-size=2", []),
        ("--tensor-parallel-size 2", []),
        ("--tensor-parallel-size=4", ["--tp-size 4 → 2"]),
        ("--tp 1", ["--tp-size 1 → 2"]),
    ],
)
def test_plan_host_reads_flags_with_the_engine_s_spec(lab1: HostVars, installed: str, shown: list[str]) -> None:
    doc = copy.deepcopy(CLEAN)
    script = doc["files"]["script"]
    assert "  --tp=2 \\\n" in script["content"]
    script["content"] = script["content"].replace("  --tp=2 \\\n", f"  {installed} \\\n")
    p = plan(doc, lab1)
    assert [d["path"] for d in p.diffs] == ([lab1.script_path] if installed != "--tp=2" else [])
    assert p.knob_changes == shown


def test_a_changed_unit_is_diffed_without_knob_changes(lab1: HostVars) -> None:
    doc = copy.deepcopy(CLEAN)
    doc["files"]["unit"]["content"] += "# edited\n"
    p = plan(doc, lab1)
    assert [d["path"] for d in p.diffs] == [lab1.unit_path]
    assert "-# edited\n" in p.diffs[0]["diff"]
    assert p.knob_changes == []


def test_a_missing_script_is_all_additions(lab1: HostVars) -> None:
    doc = copy.deepcopy(CLEAN)
    doc["files"]["script"] = {"path": lab1.script_path, "exists": False}
    p = plan(doc, lab1)
    assert p.diffs[0]["path"] == lab1.script_path and p.diffs[0]["diff"].startswith("--- ")
    assert "SGLANG_SM120_MMA_TARGET_CTAS (unset) → 512" in p.knob_changes


def test_no_main_pid_and_no_processes(lab1: HostVars) -> None:
    doc = copy.deepcopy(CLEAN)
    doc["unit_props"].update(MainPID="0", ActiveState="inactive")
    doc["processes"] = []
    p = plan(doc, lab1)
    assert p.main_pid is None and p.actions == ["start"]
    assert set(p.seen.values()) == {"(unset)"} and len(p.seen) == len(engine().show)
    assert seen_knobs({}, engine()) == p.seen


def test_refusal_and_break_lock(lab1: HostVars) -> None:
    doc = copy.deepcopy(CLEAN)
    doc["generations"]["lock"] = {"run_id": "r9", "operator": "bob", "since": "t", "controller": "c"}
    p = plan(doc, lab1)
    assert p.actions == ["refuse"] and p.refused and p.refusal is not None and "lock held by bob (run r9)" in p.refusal
    broken = plan(doc, lab1, break_lock=True)
    # --break-lock: the lock itself is what apply repairs (through the role, which marks the run interrupted)
    assert broken.actions == ["break-lock"] and broken.refusal is None and not broken.in_sync


def test_apply_words_a_lock_refusal_from_the_locks_fields_not_the_findings_text(lab1: HostVars) -> None:
    from knobfleet.ops.precheck import _refused_for_the_lock, lock_refusal

    doc = copy.deepcopy(CLEAN)
    holder = {"run_id": "r9", "operator": "bob", "since": "t", "controller": "elsewhere:1"}
    doc["generations"]["lock"] = holder
    p = plan(doc, lab1)
    assert _refused_for_the_lock(p)
    assert lock_refusal(holder) == (
        "lock held by bob (run r9) since t from elsewhere:1; wait for it to finish (or, if it was killed, re-run "
        "with --break-lock)"
    )
    # refused for something else (a foreign drop-in comes first), or not refused: not the lock's refusal
    doc["generations"]["lock"] = None
    assert not _refused_for_the_lock(plan(doc, lab1))
    dropin = json.loads((CASES / "dropin_environment" / "probe.json").read_text())
    dropin["generations"]["lock"] = holder
    q = plan(dropin, lab1)
    assert (
        q.refused and q.refusal is not None and q.refusal.startswith("foreign drop-in") and not _refused_for_the_lock(q)
    )


def test_a_missing_script_diff_removes_nothing(lab1: HostVars) -> None:
    doc = copy.deepcopy(CLEAN)
    doc["files"]["script"] = {"path": lab1.script_path, "exists": False}
    diff = plan(doc, lab1).diffs[0]["diff"]
    assert not [line for line in diff.splitlines()[2:] if line.startswith("-")]


def test_no_refusal_for_a_dropin_under_policy_remove(lab1: HostVars) -> None:
    doc = json.loads((CASES / "dropin_environment" / "probe.json").read_text())
    p = ProfileStore(PROFILES_V1).resolve("ctas512")
    declared = Declared(p.name, p.version, p.content_hash)
    removing = plan_host(doc, render_host(p, lab1), declared, engine(), "remove")
    assert removing.refusal is None and not removing.refused
    assert plan_host(doc, render_host(p, lab1), declared, engine()).refused  # policy fail by default


def test_live_knobs_are_the_main_process_s(lab1: HostVars) -> None:
    doc = copy.deepcopy(CLEAN)
    pid = int(doc["unit_props"]["MainPID"])
    for proc in doc["processes"]:
        if proc["pid"] != pid:
            proc["env"] = {k: "worker" for k in proc.get("env") or {}}
    assert len(doc["processes"]) > 1
    main = next(x for x in doc["processes"] if x["pid"] == pid)
    eng = engine()
    seen = plan(doc, lab1).seen
    assert seen == {eng.short(k): main["env"].get(k, "(unset)") for k in eng.show}
    assert "worker" not in seen.values() and set(seen.values()) != {"(unset)"}

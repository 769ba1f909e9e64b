"""Property: a secret placed anywhere a secret can go (host env by pattern or by declaration, a vault-sourced
name, host args `--api-key` / `--admin-api-key`, the engine's report, the live process's env and command line,
the installed and stored serve script, a hand-written unit's Environment= and ExecStart=) never appears in any
controller output — render (script, unit, env, argv, --json), plan (report text and --json: findings, diffs,
knob changes), drift/verify (--json), history (--json), errors — neither whole nor any line of it, whatever
characters and line separators it holds.

Two checks per example: (1) no line of the secret (split at every separator ``str.splitlines`` knows) is in an
output unless the same text is there when the secrets are others (so a one-letter line that every output holds
does not count); (2) non-interference: with every marker and file digest blanked, the outputs for two different
secrets are identical — the secret reaches no output but through its keyed marker."""

from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from knobfleet import report, report_rollout, report_text
from knobfleet.engines.adapter import engine as adapter
from knobfleet.fleet.hostvars import HostVars
from knobfleet.live import verify
from knobfleet.module_utils import knob_observe
from knobfleet.ops import history, plan
from knobfleet.ops.apply_report import ApplyReport
from knobfleet.ops.precheck import from_plan
from knobfleet.ops.profiles import rendered_json
from knobfleet.profiles.model import Profile
from knobfleet.profiles.store import ProfileStore
from knobfleet.render import render_host

KEY = "f" * 64
SEPARATORS = ["\n", "\r", "\r\n", "\f", "\v", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
# Any characters but NUL (no env value or argv word can hold one; HostVars refuses it with one line).
CHARS = st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",))
secrets_ = st.builds(
    lambda parts, seps: "".join(p + s for p, s in zip(parts, seps, strict=False)) + parts[-1],
    st.lists(st.text(CHARS, min_size=0, max_size=12), min_size=1, max_size=4),
    st.lists(st.sampled_from(SEPARATORS), min_size=0, max_size=3),
)


def _profile() -> Profile:
    return ProfileStore(Path(__file__).resolve().parents[3] / "profiles").resolve("ctas512")


PROFILE = _profile()
DIGEST = re.compile(r"((?:hmac|sha256):)[0-9a-f]{8,64}")
ENGINE = adapter(PROFILE.engine)


def host(new: str, vaulted: str) -> HostVars:
    return HostVars(
        host="h",
        host_env={"HF_TOKEN": new, "AWS_SECRET_ACCESS_KEY": new, "FROM_VAULT": vaulted, "CUDA_HOME": "/cuda"},
        secret_env=("FROM_VAULT",),  # how the inventory reader marks a vault-sourced value (fleet/inventory.py)
        host_args={"api-key": new, "admin-api-key": vaulted},
    )


def host_doc(old: str, new: str, vaulted: str) -> dict[str, Any]:
    """What a host holds while it runs the previous secret ``old``: its script, a hand-written unit holding
    secrets, a process with the old values, an engine report of them, a stored generation."""
    before = render_host(PROFILE, host(old, vaulted), secret_key=KEY)
    unit = before.unit + f"Environment=HF_TOKEN={json.dumps(old)}\nExecStartPre=/bin/true --api-key {old!r}\n"
    env = {**before.env, "PATH": "/bin"}
    script_sha, unit_sha = sha(before.script), sha(unit)  # plain digests: each tests a guess of the secret
    files = {
        "script": {"path": before.script_path, "exists": True, "sha256": script_sha, "content": before.script},
        "unit": {"path": before.unit_path, "exists": True, "sha256": unit_sha, "content": unit},
    }
    meta = {"status": "good", "profile": "p", "version": 1, "hash": "h", "reason": "applied"}
    meta["files"] = {
        "script": {"path": before.script_path, "sha256": script_sha, "name": "serve.sh"},
        "unit": {"path": before.unit_path, "sha256": unit_sha, "name": "u.service"},
    }
    doc = {
        "unit_props": {"ActiveState": "active", "SubState": "running", "MainPID": "7"},
        "health": 200,
        "files": files,
        "processes": [{"pid": 7, "comm": "python3", "env": env, "cmdline": list(before.argv), "start_epoch": 1e10}],
        "server_info": {
            "api_key": old,
            "admin_api_key": vaulted,
            "internal_states": [{"env_vars": {"HF_TOKEN": old, "SGLANG_X": "1"}}],
            "argv": ["--api-key", old],
        },
        "generations": {
            "current": 1,
            "list": [{"generation": 1, "files": ["meta.json", "serve.sh", "u.service"], "meta": meta}],
            "current_files": {
                "serve.sh": {"content": before.script, "sha256": script_sha},
                "u.service": {"content": unit, "sha256": unit_sha},
            },
            "ledger": [{"event": "apply", "generation": 1, "reason": "ok"}],
        },
    }
    # What the host sends: knob_probe redacts its document before it leaves (the same module_utils)
    return knob_observe.redact(doc, before.secret, KEY)


def outputs(old: str, new: str, vaulted: str) -> list[str]:
    hv = host(new, vaulted)
    r = render_host(PROFILE, hv, secret_key=KEY)
    doc = host_doc(old, new, vaulted)
    out = [r.script_shown, r.unit_shown, "\n".join(r.argv_shown), json.dumps(r.env_shown)]
    out.append(report_text.to_json(rendered_json(r)))
    declared = verify.Declared(PROFILE.name, PROFILE.version, PROFILE.content_hash)
    p = plan.plan_host(copy.deepcopy(doc), r, declared, ENGINE)
    outcome = from_plan(p, True, 1)
    result = ApplyReport(PROFILE, True, [], [outcome], 0.0, 0.0)
    out += [report_rollout.apply_summary(result), report_text.to_json(result.as_json())]
    verdict = verify.verify_host("h", copy.deepcopy(doc), declared, ENGINE.rules())
    out += [report_text.to_json(verdict.as_json()), report.drift_report([verdict], verify.summary([verdict]), "drift")]
    hist = history.from_probe("h", doc, r.secret, KEY)
    out += [report_text.to_json(hist.as_json()), report_rollout.history_report([hist], 10)]
    for f in p.findings:  # a ledger reason made of a finding, as the rescue path records it
        hist = history.from_probe("h", {"generations": {"ledger": [{"reason": f.message}]}}, r.secret, KEY)
        out.append(report_text.to_json(hist.as_json()))
    return out


def lines_of(secret: str) -> list[str]:
    return [line for line in secret.splitlines() if line.strip()] + ([secret] if secret.strip() else [])


# markers and keyed digests; a plain sha256 of a file holding a secret is not blanked: it must not be there
BLANK = re.compile(r"<secret hmac:[0-9a-f]{16}>|hmac:[0-9a-f]{64}")


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(old=secrets_, new=secrets_, vaulted=secrets_, other=secrets_)
def test_no_output_holds_a_secret_or_a_line_of_it(old: str, new: str, vaulted: str, other: str) -> None:
    raw = "\n".join(outputs(old, new, vaulted))
    # digests differ with the secret, and a short secret ("03") is found in a hex digest by chance: compare with
    # the digests masked (a digest is no leak: it is what a secret is shown as)
    got = DIGEST.sub(r"\1<hex>", raw)
    # the same outputs with secrets that share no text with these: what is there anyway
    baseline = DIGEST.sub(r"\1<hex>", "\n".join(outputs("\x01OLD\x02", "\x01NEW\x02", "\x01VAULT\x02")))
    for secret in (old, new, vaulted):
        for line in lines_of(secret):
            assert line not in got or line in baseline, (secret, line)
    for a, b in ((old, vaulted), (new, vaulted)):  # no plain digest of a script that holds them
        assert sha(render_host(PROFILE, host(a, b), secret_key=KEY).script) not in raw
    # non-interference: other secrets change nothing but the markers (and digests of files that hold them)
    if other not in (old, new, vaulted):
        swapped = "\n".join(outputs(other, other + "\x01", other + "\x02"))
        normal = "\n".join(outputs(old, new, vaulted))
        if len({old, new, vaulted}) == 3:
            assert BLANK.sub("<M>", normal) == BLANK.sub("<M>", swapped)


@pytest.mark.parametrize("sep", SEPARATORS)
def test_every_separator_keeps_the_secret_whole_everywhere(sep: str) -> None:
    old, new, vaulted = f"o1{sep}o2-old", f"n1{sep}n2-new", f"v1{sep}v2-vault"
    got = "\n".join(outputs(old, new, vaulted))
    for piece in ("o1", "o2-old", "n1", "n2-new", "v1", "v2-vault"):
        assert piece not in got, piece

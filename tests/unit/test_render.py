from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from knobfleet.errors import RenderError
from knobfleet.fleet.hostvars import HostVars
from knobfleet.ops.plan import parse_script
from knobfleet.profiles.model import Profile
from knobfleet.profiles.store import ProfileStore
from knobfleet.render import render_host

STUB = "import json, os, sys\njson.dump({'argv': sys.argv[1:], 'env': dict(os.environ)}, sys.stdout)\n"

# Any text a YAML string can hold once loaded: no NUL, no lone surrogates.
values = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=300
) | st.sampled_from(
    [
        "$(touch PWNED)",
        "`touch PWNED`",
        ";touch PWNED",
        "-x",
        "--port=1",
        "'",
        '"',
        "\\",
        "%s%n",
        "a b\tc\nd",
        "${HOME}",
        "$HOME",
        "!",
        "*",
        "~",
        "",
    ]
)
env_names = st.from_regex(r"\AKF_[A-Z0-9_]{1,12}\Z")
flag_names = st.from_regex(r"\Ax[a-z0-9-]{0,12}\Z")


def host(tmp: Path) -> HostVars:
    stub = tmp / "stub.py"
    stub.write_text(STUB)
    return HostVars(host="h1", launcher=(sys.executable, str(stub)), model_path="/m", port=1234)


def run_script(script: str, tmp: Path) -> dict[str, object]:
    path = tmp / "serve.sh"
    path.write_text(script)
    out = subprocess.run(
        ["bash", str(path)], cwd=tmp, capture_output=True, check=True, env={"PATH": os.environ["PATH"]}
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    env=st.dictionaries(env_names, values, max_size=6),
    args=st.dictionaries(flag_names, values | st.just(True), max_size=6),
)
def test_rendered_script_gives_back_profile_byte_for_byte(
    tmp_path: Path, env: dict[str, str], args: dict[str, str | bool]
) -> None:
    profile = Profile(name="p", version=1, engine="sglang", env=env, args=args)
    hv = host(tmp_path)
    r = render_host(profile, hv)
    seen = run_script(r.script, tmp_path)
    assert seen["argv"] == r.argv[2:]
    live_env = seen["env"]
    assert isinstance(live_env, dict)
    assert {k: live_env[k] for k in env} == env
    assert r.env == {k: env[k] for k in sorted(env)}
    assert not (tmp_path / "PWNED").exists()
    assert r.script.count("\nexec ") == 1
    # the parser verify and apply use to read scripts back gives the same env and argv
    env_back, argv_back = parse_script(r.script)
    assert argv_back == r.argv
    assert env_back == r.env


def test_shipped_ctas512_for_lab1(repo: Path) -> None:
    profile = ProfileStore(repo / "profiles").resolve("ctas512")
    hv = HostVars(host="lab1", launcher=("/usr/bin/python3", "-m", "sglang_sim.launch_server"), listen_host="127.0.1.1")
    r = render_host(profile, hv)
    assert "export SGLANG_SM120_MMA_TARGET_CTAS=512\n" in r.script
    assert r.script.startswith("#!/bin/bash\n") and "set -euo pipefail\n" in r.script
    assert "# profile: ctas512@2 sha256:" in r.script
    assert r.env["SGLANG_SM120_MMA_TARGET_CTAS"] == "512"
    assert r.argv[:6] == [
        "/usr/bin/python3",
        "-m",
        "sglang_sim.launch_server",
        "--model-path=/models/DeepSeek-V4",
        "--host=127.0.1.1",
        "--port=30000",
    ]
    assert "--disable-overlap-schedule" in r.argv and "--tp-size=2" in r.argv
    assert "TARGET_CTAS" not in r.unit and "ExecStart=/root/serve_dsv4_decode.sh\n" in r.unit
    assert "Type=exec\n" in r.unit


def test_env_set_by_host_and_profile_is_an_error(repo: Path) -> None:
    profile = ProfileStore(repo / "profiles").resolve("ctas512")
    hv = HostVars(host="lab1", host_env={"SGLANG_SM120_MMA_TARGET_CTAS": "1"}, host_args={"tp-size": "8"})
    with pytest.raises(RenderError) as info:
        render_host(profile, hv)
    assert str(info.value).splitlines() == [
        "env SGLANG_SM120_MMA_TARGET_CTAS is set by the profile ctas512 and by host lab1's knob_serve_host_env; "
        "remove it from one of them",
        "flag --tp-size is set by the profile ctas512 and by host lab1's knob_serve_host_args; "
        "remove it from one of them",
    ]


def test_flag_false_is_omitted_and_bools_in_env_are_1_0() -> None:
    profile = Profile(
        name="p", version=1, engine="sglang", env={"KF_ON": True, "KF_OFF": False}, args={"enable-x": False, "y": True}
    )
    r = render_host(profile, HostVars(host="h"))
    assert r.env == {"KF_OFF": "0", "KF_ON": "1"}
    assert "--enable-x" not in " ".join(r.argv) and r.argv[-1] == "--y"

"""Secrets by the shape of their value, whatever their name (module_utils/knob_redact.secret_shape): a URL with a
password, a JSON Web Token, a provider's token. Generated values of each shape under innocent names are hidden in
the rendered script, env and argv of a host; in a profile they are refused with one line naming file, field and
fix. Generated innocent values (paths, host:port, URLs without a password, model names) are never taken for one."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knobfleet.errors import ProfileError
from knobfleet.fleet.hostvars import HostVars
from knobfleet.module_utils.knob_redact import SHAPES, has_url_password, secret_shape
from knobfleet.profiles.model import Profile
from knobfleet.profiles.store import ProfileStore
from knobfleet.render import render_host

ALNUM = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", min_size=1)


def b64(doc: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode().rstrip("=")


@st.composite
def shaped(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["url", "jwt", "github", "hf", "sk", "aws", "slack"]))
    word = draw(ALNUM.filter(lambda s: len(s) >= 12).map(lambda s: s[:40]))
    if kind == "url":
        scheme = draw(st.sampled_from(["postgres", "redis", "https", "mysql+pymysql"]))
        return f"{scheme}://{draw(ALNUM)}:{word}@db.internal:5432/x"
    if kind == "jwt":
        return f"{b64({'alg': 'HS256', 'typ': 'JWT'})}.{b64({'sub': word})}.{word}sig"
    prefix = {"github": "ghp_", "hf": "hf_", "sk": "sk-", "aws": "AKIA", "slack": "xoxb-"}[kind]
    body = (word * 4)[:16].upper() if kind == "aws" else (word * 4)[:36]
    return prefix + body


INNOCENT = st.one_of(
    st.sampled_from(["/models/llama-3-70b", "127.0.1.1:5000", "http://127.0.0.1:30080/v1", "fcfs", "bfloat16"]),
    st.builds(lambda h, p: f"http://{h}:{p}/path?x=1", ALNUM, st.integers(1, 65535)),
    st.builds(lambda s: f"/var/cache/{s}/model", ALNUM),
    st.integers(0, 10**6).map(str),
)


@pytest.mark.parametrize(
    "value",
    [
        "postgres://app:pa/ss@db:5432/x",  # a / in the password ended the match before issue 56
        "https://user:two words here@router.internal:30080",
        "redis://:p?a#ss@cache:6379",
        "mysql://u:p@ss@db/x",  # an @ in the password: up to the last @
    ],
)
def test_a_url_password_with_a_slash_space_or_at_is_found(value: str) -> None:
    assert secret_shape(value) == "a URL with a password in it", value


@settings(max_examples=400, deadline=None)
@given(text=st.text(alphabet="ab:/@ \n+.9", max_size=40))
def test_the_linear_url_check_agrees_with_the_url_shape(text: str) -> None:
    """``has_url_password`` (each line's last "@" found once) says what the URL shape's regex says, on texts made
    of the characters the shape turns on."""
    url = dict(SHAPES)["a URL with a password in it"]
    assert has_url_password(text) == bool(re.search(url, text)), text


def test_a_long_value_of_schemes_is_read_whole() -> None:
    """Issue 56's left-over: 64 KiB of "/a://b:" took the URL regex over a second, from every scheme to the line's
    end (perf/secret_shapes.py times it); the linear check reads the same value, and finds a password at its end."""
    assert secret_shape("x://y:" + "/a://b:" * 8000) is None
    assert secret_shape("x://y:" + "/a://b:" * 8000 + "c@d") == "a URL with a password in it"


@settings(max_examples=200, deadline=None)
@given(value=shaped())
def test_each_shape_is_found(value: str) -> None:
    assert secret_shape(value) is not None, value


@settings(max_examples=200, deadline=None)
@given(value=INNOCENT)
def test_innocent_values_are_not_secrets(value: str) -> None:
    assert secret_shape(value) is None, value


@settings(max_examples=60, deadline=None)
@given(value=shaped(), name=st.sampled_from(["JWT_CACHE_DIR", "DATABASE", "SGLANG_UPSTREAM", "MY_VAR"]))
def test_a_shaped_value_under_an_innocent_name_is_hidden_on_a_host(value: str, name: str) -> None:
    hv = HostVars(host="h", listen_host="127.0.1.1", host_env={name: value}, host_args={"served-url": value})
    r = render_host(Profile(name="p", version=1, engine="sglang", env={}, args={}), hv, secret_key="k" * 32)
    shown = "\n".join([r.script_shown, r.unit_shown, json.dumps(r.env_shown), json.dumps(r.argv_shown)])
    assert value not in shown
    assert name in hv.secrets() and "served-url" in hv.secrets()


@pytest.mark.parametrize("field", ["env", "args"])
def test_a_shaped_value_in_a_profile_is_refused_with_its_fix(profiles_dir: Path, field: str) -> None:
    key = "SGLANG_UPSTREAM" if field == "env" else "served-url"
    (profiles_dir / "leaky.yaml").write_text(
        f"schema_version: 1\nname: leaky\nversion: 1\nengine: sglang\n{field}:\n  {key}: "
        "'postgres://app:hunter2hunter2@db:5432/x'\n"
    )
    with pytest.raises(ProfileError) as exc:
        ProfileStore(profiles_dir).resolve("leaky")
    text = str(exc.value)
    assert f"leaky.yaml: {field}.{key}: the value looks like a secret (a URL with a password in it)" in text
    assert "hunter2" not in text and f"knob_serve_host_{field}.{key}" in text

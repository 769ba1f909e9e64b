"""Rendering details a host would show: the engine of the profile (not the default one) on a host without
knob_engine, false flags left out of the script, secrets declared on the host or in a project's catalog
overlay, the hashes of the files as written, the templates' quote filter being Ansible's own, and a broken
template named as such."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

import pytest
from ansible.plugins.filter.core import quote as ansible_quote

from knobfleet import paths, render
from knobfleet.errors import RenderError
from knobfleet.fleet.hostvars import HostVars
from knobfleet.module_utils.knob_shell import script_env_argv
from knobfleet.profiles import catalog
from knobfleet.profiles.model import Profile


def vllm_profile(args: dict[str, str | bool | int | float] | None = None) -> Profile:
    return Profile(name="v", version=1, engine="vllm", env={"VLLM_LOGGING_LEVEL": "INFO"}, args=args or {})


def test_a_host_without_knob_engine_runs_the_profiles_engine() -> None:
    hv = HostVars(host="h", model_path="/m", port=8000)
    assert hv.engine is None
    p = vllm_profile({"max-num-seqs": 8, "model-path": "x"})  # model-path is SGLang's reserved flag, not vLLM's
    r = render.render_host(p, hv)
    vllm = hv.adapter("vllm")
    assert r.argv == [
        *vllm.launcher,
        "serve",
        "/m",
        "--host=127.0.0.1",
        "--port=8000",
        "--max-num-seqs=8",
        "--model-path=x",
    ]
    assert script_env_argv(r.script)[1] == r.argv
    assert render.template_vars(p, hv)["knob_serve_engine"] == vllm.role_vars()
    assert render.template_vars(p, hv)["knob_serve_engine"] != hv.adapter().role_vars()


def test_a_false_flag_is_left_out_of_the_script() -> None:
    p = Profile(name="p", version=1, engine="sglang", env={}, args={"enable-metrics": False, "tp-size": 2})
    r = render.render_host(p, HostVars(host="h"))
    assert "enable-metrics" not in r.script
    assert render.profile_vars(p)["args"] == {"tp-size": "2"}
    assert script_env_argv(r.script)[1] == r.argv and "--tp-size=2" in r.argv


def test_secrets_declared_on_the_host_are_shown_as_hashes() -> None:
    hv = HostVars(host="h", host_env={"MY_CRED": "hunter2", "PLAIN": "x"}, secret_env=("MY_CRED",))
    r = render.render_host(Profile(name="p", version=1, engine="sglang", env={}, args={}), hv, secret_key="k" * 64)
    assert "MY_CRED" in r.secret
    assert "hunter2" in r.script and "hunter2" not in r.script_shown and "PLAIN=x" in r.script_shown
    assert r.env_shown["MY_CRED"].startswith("<secret hmac:") and r.env_shown["PLAIN"] == "x"


def test_a_secret_marked_in_a_project_overlay_counts_for_the_profiles_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = tmp_path / "catalogs"
    own.mkdir()
    (own / "vllm.overlay.yaml").write_text(
        "engine: vllm\nknobs:\n  VLLM_MY_CRED: {kind: env, type: str, secret: true, origin: our-patch}\n"
    )
    monkeypatch.setattr(paths, "catalog_overlay_dirs", lambda: [own])
    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))
    catalog.catalog_for.cache_clear()
    try:
        hv = HostVars(host="h", host_env={"VLLM_MY_CRED": "s3cr3t"})  # no knob_engine: the profile's engine counts
        r = render.render_host(vllm_profile(), hv)
        assert "VLLM_MY_CRED" in r.secret
        assert "s3cr3t" not in r.script_shown
    finally:
        catalog.catalog_for.cache_clear()


def test_the_hashes_are_of_the_files_as_written(tmp_path: Path) -> None:
    p = Profile(name="p", version=1, engine="sglang", env={"SGLANG_X": "café"}, args={})
    r = render.render_host(p, HostVars(host="h"), None)
    (tmp_path / "serve.sh").write_text(r.script, encoding="utf-8")
    (tmp_path / "unit").write_text(r.unit, encoding="utf-8")
    assert r.script_sha256 == hashlib.sha256((tmp_path / "serve.sh").read_bytes()).hexdigest()
    assert r.unit_sha256 == hashlib.sha256((tmp_path / "unit").read_bytes()).hexdigest()
    assert render.sha256_text("é") == hashlib.sha256(b"\xc3\xa9").hexdigest()


@pytest.mark.parametrize("value", [None, "", "a b", "it's", "$(x)", 3, True, "plain"])
def test_the_quote_filter_is_ansibles(value: object) -> None:
    ours = render._environment(paths.roles_dir() / "knob_serve" / "templates").filters["quote"]
    assert ours(value) == ansible_quote(value)


def test_a_broken_template_is_named(tmp_path: Path) -> None:
    (tmp_path / render.SCRIPT_TEMPLATE).write_text("{{ knob_serve_no_such_var }}\n")
    (tmp_path / render.UNIT_TEMPLATE).write_text("[Service]\n")
    with pytest.raises(RenderError) as info:
        render.render_host(Profile(name="p", version=1, engine="sglang", env={}, args={}), HostVars(host="h"), tmp_path)
    assert str(info.value) == "roles/knob_serve/templates: 'knob_serve_no_such_var' is undefined"


def test_a_fixed_flag_without_a_host_var_is_the_launch_lines() -> None:
    adapter = SimpleNamespace(fixed_args=("--enable-x", "--port={port}", "--model-path={model}"))
    assert render.host_var_of(adapter, "enable-x") == "knob_serve_launcher"
    assert render.host_var_of(adapter, "port") == "knob_serve_port"
    assert render.host_var_of(adapter, "model-path") == "knob_serve_model_path"

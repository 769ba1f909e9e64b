"""Issue #57 item 4, the compile caches: the catalogs' ``serve.compile_caches``, the folder the role's template decides
(render.compile_cache_of), the serve script's exports (a profile's own value wins), the container's --volume and what
it refuses, the host var's one-line error, and ``compile_cache.invalidations``."""

from __future__ import annotations

import hashlib
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from knobfleet.compile_cache import Side, invalidations
from knobfleet.engines.adapter import engine
from knobfleet.errors import InventoryError
from knobfleet.fleet.hostvars import HostVars, from_inventory_vars
from knobfleet.module_utils.knob_live import expected_from_files
from knobfleet.profiles.catalog import catalog_for
from knobfleet.profiles.model import Profile
from knobfleet.render import compile_cache_of, render_host
from knobfleet.runtimes import RUNTIMES

IMAGE = "sha256:" + "ab" * 32
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def profile(env: dict[str, object] | None = None, pin: str | None = None) -> Profile:
    doc = {"name": "p", "version": 1, "engine": "sglang", "env": env or {}, "args": {"max-running-requests": 8}}
    return Profile.model_validate({**doc, **({"engine_version": pin} if pin else {})})


@pytest.mark.parametrize(
    ("engine_name", "version"), [("sglang", None), ("sglang", "0.5.22"), ("vllm", None), ("vllm", "0.31.0")]
)
def test_every_cache_variable_and_key_knob_is_read_by_the_engine_or_said_not_to_be(
    engine_name: str, version: str | None
) -> None:
    cat = catalog_for(engine_name, version=version)
    caches = cat.serve.compile_caches
    assert caches is not None
    with open(os.path.join(REPO, "profiles", "catalogs", f"{engine_name}.overlay.yaml")) as f:
        overlay = f.read()
    for name in caches.env:  # the engine's own (its registry), or another library's, said so in the overlay
        assert name in cat.knobs or f"{name} is FlashInfer's own" in overlay or f"{name} (Triton" in overlay, name
    for name in caches.key:
        assert name in cat.knobs, name
    assert "TRITON_CACHE_DIR" not in caches.env and "TORCHINDUCTOR_CACHE_DIR" not in caches.env


@pytest.mark.parametrize(
    ("value", "pin", "dir_"),
    [
        (True, None, "/var/lib/knobfleet/.compile-cache/svc/sglang"),
        (True, "0.5.23", "/var/lib/knobfleet/.compile-cache/svc/sglang@0.5.23"),
        ("/data/jit/svc", None, "/data/jit/svc/sglang"),
        (False, None, None),
    ],
)
def test_the_folder_is_outside_the_state_dir_and_keyed_by_a_pinned_version(
    value: bool | str, pin: str | None, dir_: str | None
) -> None:
    hv = HostVars(host="h", service="svc", compile_cache=value)
    got = compile_cache_of(profile(pin=pin), hv)
    assert got.get("dir") == dir_
    assert (got.get("root") or None) == hv.compile_cache_root
    if dir_:
        assert not dir_.startswith(hv.service_state_dir + "/")  # no generation holds it, no prune or rollback
        assert got["env"]["SGLANG_CACHE_DIR"] == f"{dir_}/sglang"
        assert got["env"]["SGLANG_DG_CACHE_DIR"] == f"{dir_}/deep_gemm"


names = st.from_regex(r"\A[a-z][a-z0-9_.-]{0,12}\Z")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    service=names,
    root=st.none() | st.lists(names, min_size=2, max_size=4),
    runtime=st.sampled_from(sorted(RUNTIMES)),
    own=st.booleans(),
)
def test_the_script_exports_each_cache_variable_and_a_profiles_own_value_wins(
    service: str, root: list[str] | None, runtime: str, own: bool
) -> None:
    cache: bool | str = True if root is None else "/" + "/".join(root)
    extra = {"image": IMAGE} if RUNTIMES[runtime].container else {}
    hv = HostVars(host="h", service=service, compile_cache=cache, runtime=runtime, user="eng", **extra)
    prof = profile({"SGLANG_CACHE_DIR": "/mine it's"} if own else None)
    r = render_host(prof, hv)
    seen = expected_from_files(hv.script_path, r.script, hv.unit_path, r.unit, hashlib.sha256)
    want = compile_cache_of(prof, hv)["env"]
    assert seen["env"] == r.env
    for name, path in want.items():
        assert seen["env"][name] == ("/mine it's" if own and name == "SGLANG_CACHE_DIR" else path)
    assert ("SGLANG_CACHE_DIR: the profile sets it" in r.script) is own
    root_dir = hv.compile_cache_root
    assert f"ExecStartPre=+/usr/bin/install -d -o eng -m 0700 {root_dir}\n" in r.unit
    run = seen.get("container")
    if RUNTIMES[runtime].container:
        assert run is not None
        assert f"--volume={root_dir}:{root_dir}" in run["options"]
        assert set(want) <= set(run["env_names"])


def test_no_cache_no_export_no_volume() -> None:
    hv = HostVars(host="h", compile_cache=False, runtime="podman", image=IMAGE)
    r = render_host(profile(), hv)
    assert "compile-cache" not in r.script + r.unit and "SGLANG_CACHE_DIR" not in r.env
    assert "--volume" not in r.script


DOCKER = {"knob_serve_service": "svc", "knob_serve_runtime": "docker", "knob_serve_image": IMAGE,
          "knob_serve_compile_cache": True}  # fmt: skip


@pytest.mark.parametrize(
    "option",
    ["--volume=/srv/c:/var/lib/knobfleet/.compile-cache/svc", "--volume=/x:/var/lib/knobfleet", "--tmpfs=/var/lib",
     "--mount=type=bind,source=/a,target=/var/lib/knobfleet/.compile-cache/svc/sglang"],
)  # fmt: skip
def test_a_container_option_mounting_over_the_cache_is_refused(option: str) -> None:
    with pytest.raises(
        InventoryError, match=r"^inv\.yml: host h: .*mounts over the compile cache .*knob_serve_compile_cache"
    ):
        from_inventory_vars("h", {**DOCKER, "knob_serve_container_options": [option]}, "inv.yml")
    ok = from_inventory_vars("h", {**DOCKER, "knob_serve_container_options": ["--volume=/m:/models:ro"]}, "inv.yml")
    assert ok.compile_cache_root == "/var/lib/knobfleet/.compile-cache/svc"


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("relative/dir", "must be"),
        ("/var", "too near the root"),
        ("/var/lib/knobfleet/svc/cache", "overlaps the service's state folder"),
        ("/var/lib/knobfleet", "overlaps the service's state folder"),
        ("/etc/systemd/system/x", "overlaps knob_serve_unit_dir"),
        ("false", "must be"),
    ],
)
def test_a_bad_knob_serve_compile_cache_is_one_line_naming_file_field_and_fix(value: str, why: str) -> None:
    with pytest.raises(InventoryError) as err:
        from_inventory_vars("h", {"knob_serve_service": "svc", "knob_serve_compile_cache": value}, "hosts.yml")
    text = str(err.value)
    assert "\n" not in text and text.startswith("hosts.yml: host h: knob_serve_compile_cache: ")
    assert why in text and "true (the default folder), false (no cache) or an absolute path" in text


SG = engine("sglang")
D = "/var/lib/knobfleet/.compile-cache/svc/sglang"
ENV = {"SGLANG_CACHE_DIR": f"{D}/sglang", "SGLANG_DG_CACHE_DIR": f"{D}/deep_gemm"}
PINNED = {k: v.replace("/sglang/", "/sglang@0.5.23/", 1) for k, v in ENV.items()}
PINNED22 = {k: v.replace("/sglang/", "/sglang@0.5.22/", 1) for k, v in ENV.items()}


@pytest.mark.parametrize(
    ("before", "after", "want"),
    [
        (Side("0.5.23", ENV, {"tp-size": "2"}), Side("0.5.23", ENV, {"tp-size": "2", "max-running-requests": "9"}), []),
        (Side("0.5.22", PINNED22), Side("0.5.23", PINNED), ["engine version changes from 0.5.22 to 0.5.23"]),
        (Side(None, ENV), Side("0.5.23", ENV), []),  # an unknown version is no change
        (Side("0.5.23", ENV, {"tp-size": "2"}), Side("0.5.23", ENV, {"tp-size": "4"}),
         ["--tp-size changes (2 → 4): it enters the compile key"]),
        (Side("0.5.23", ENV), Side("0.5.23", ENV, {"enable-torch-compile": "(set)"}),
         ["--enable-torch-compile changes ((unset) → (set)): it enters the compile key"]),
        (Side("0.5.23", {}), Side("0.5.23", ENV),
         [f"the compile cache moves: SGLANG_CACHE_DIR (unset) → {D}/sglang"]),
        (Side("0.5.22", ENV, {"dtype": "auto"}), Side("0.5.23", {**ENV, "SGLANG_CACHE_DIR": "/x"}, {"dtype": "half"}),
         ["engine version changes from 0.5.22 to 0.5.23", f"the compile cache moves: SGLANG_CACHE_DIR {D}/sglang → /x",
          "--dtype changes (auto → half): it enters the compile key"]),
        (Side("0.5.22", ENV), Side("0.5.23", {}), []),  # knob_serve_compile_cache: false: nothing kept
    ],
)  # fmt: skip
def test_invalidations_name_why_the_cache_is_cold(before: Side, after: Side, want: list[str]) -> None:
    assert invalidations(SG, before, after) == want


def test_an_engine_without_compile_caches_has_no_invalidations() -> None:
    import dataclasses

    bare = dataclasses.replace(SG, compile_caches={}, compile_key=())
    assert invalidations(bare, Side("1", ENV), Side("2", ENV)) == []

"""Engine versions: the version a host reports, what changed between two synced catalogs (the real vLLM 0.31.0 ->
0.32.0 and SGLang 0.5.22 -> 0.5.23 ones, and the engines' rename tables as cases), a profile checked against
another version, and ``migrate_text`` (line edits that keep the operator's comments; Hypothesis for the rewrite)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knobfleet.errors import ProfileError
from knobfleet.profiles import catalog as catalogs
from knobfleet.profiles import hostversion, safeyaml, versions
from knobfleet.profiles.model import Catalog, Knob, Profile, Serve
from knobfleet.profiles.store import ProfileStore


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("0.32.0\n", "0.32.0"),
        ("vllm 0.32.0", "0.32.0"),
        ("v0.5.23", "0.5.23"),
        ("0.31.0+cpu 2.13.0+cpu 5.17.0", "0.31.0"),  # vLLM's CPU build: the local label is not another catalog
        ("0.5.23+sim", "0.5.23"),  # the lab's stand-in for SGLang 0.5.23
        ("0.10.1rc1", "0.10.1rc1"),
        ("V0.32.0", "0.32.0"),
        ("vllm 0.32.0.", "0.32.0"),
        ("0.32.0RC1", "0.32.0rc1"),
        ("0.4.9-sim", "0.4.9-sim"),
        ("sglang 0.5.23\nbuilt by ci", "0.5.23"),  # the first line only
        ("no version here", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_version(text: str | None, want: str | None) -> None:
    assert hostversion.parse_version(text) == want


VLLM_INFO = ("system_env", "vllm_version")


@pytest.mark.parametrize(
    ("doc", "path", "want"),
    [
        ({"server_info": {"version": "0.5.23"}}, ("version",), ("0.5.23", "the engine's server info")),
        # vLLM's dev-mode /server_info: collect_env's vllm_version, the CPU build's label dropped
        (
            {"server_info": {"system_env": {"vllm_version": "0.31.0+cpu"}}},
            VLLM_INFO,
            ("0.31.0", "the engine's server info"),
        ),
        # the engine's own word wins over the version file (a host with several installs)
        (
            {"server_info": {"system_env": {"vllm_version": "0.32.0"}}, "engine_version": "0.31.0"},
            VLLM_INFO,
            ("0.32.0", "the engine's server info"),
        ),
        # a report elsewhere than the engine's path is not the engine's word: the version file speaks
        (
            {"server_info": {"version": "0.32.0"}, "engine_version": "vllm 0.31.0"},
            VLLM_INFO,
            ("0.31.0", "version file"),
        ),
        ({"server_info": {"system_env": "not a mapping"}}, VLLM_INFO, (None, "")),
        ({"server_info": {"system_env": {"vllm_version": "N/A (dev)"}}}, VLLM_INFO, (None, "")),
        ({"server_info": [{"version": "0.5.23"}]}, (0, "version"), ("0.5.23", "the engine's server info")),
        ({"server_info": [{"version": "0.5.23"}]}, (3, "version"), (None, "")),
        ({"server_info": None}, ("version",), (None, "")),
        ({}, ("version",), (None, "")),
        (None, ("version",), (None, "")),
    ],
)
def test_the_reported_version_is_read_where_the_engine_says_it(
    doc: dict[str, Any] | None, path: tuple[str | int, ...], want: tuple[str | None, str]
) -> None:
    assert hostversion.reported(doc, path) == want


def test_each_engines_catalog_says_where_its_server_info_has_the_version() -> None:
    assert catalogs.catalog_for("vllm").serve.info_version == VLLM_INFO
    assert catalogs.catalog_for("sglang").serve.info_version == ("version",)


def test_versions_sort_as_numbers_with_pre_releases_below_their_release() -> None:
    got = sorted(["0.10.0", "0.9.1", "0.31.0", "0.5.23", "0.5.3", "0.10.0.dev1", "0.10.0rc1", "0.10.0.post1",
                  "0.10.10rc1", "0.10.9rc1", "0.10.1rc1"], key=catalogs.version_key)  # fmt: skip
    assert got == ["0.5.3", "0.5.23", "0.9.1", "0.10.0.dev1", "0.10.0rc1", "0.10.0", "0.10.0.post1", "0.10.1rc1",
                   "0.10.9rc1", "0.10.10rc1", "0.31.0"]  # fmt: skip


def real(engine: str, version: str | None = None) -> Catalog:
    return catalogs.catalog_for(engine, None, version)


def test_the_real_vllm_upgrade_removes_one_env_var_and_narrows_a_choice() -> None:
    d = versions.diff(real("vllm", "0.31.0"), real("vllm"))
    assert (d.old, d.new) == ("0.31.0", "0.32.0")
    assert [c.name for c in d.of("removed")] == ["VLLM_ENGINE_ITERATION_TIMEOUT_S"]
    assert d.of("renamed") == []
    changed = {c.name: c.detail for c in d.of("changed")}
    assert changed["mamba-cache-mode"] == "choices -'all'"
    assert "+'ultraquant_4bit'" in changed["kv-cache-dtype"]
    assert {"grpc-port", "VLLM_P2P_MAX_PEERS"} <= {c.name for c in d.of("added")}
    assert d.of("metric") == []  # the overlay's metric names hold for both


def test_the_real_sglang_upgrade_lists_what_0_5_23_dropped_with_the_engines_deprecation_note() -> None:
    d = versions.diff(real("sglang", "0.5.22"), real("sglang"))
    removed = {c.name: c.detail for c in d.of("removed")}
    assert set(removed) == {
        "SGLANG_DSV41_TORCH_PREFILL_INDEXER", "SGLANG_ENABLE_UNIFIED_RADIX_TREE", "SGLANG_JIT_DEEPGEMM_COMPILE_WORKERS",
        "SGLANG_NPU_DSV4_DEEPEP_LL_DISPATCH_QUANT_MODE", "SGLANG_USE_DYNAMIC_MXFP4_LINEAR",
        "speculative-skip-dp-mlp-sync",
    }  # fmt: skip
    assert removed["SGLANG_ENABLE_UNIFIED_RADIX_TREE"] == "deprecated in 0.5.22"  # in its _DEPRECATED_ENVS there
    assert len(d.of("added")) == 101


def test_an_env_alias_the_new_version_still_reads_is_a_rename_not_a_removal() -> None:
    """SGLang 0.5.23's EnvBoolWithAlias: SGLANG_USE_TRITON_ROUTER_SUM is read as SGLANG_USE_CUSTOM_ROUTER_SUM."""
    new = real("sglang")
    assert "SGLANG_USE_TRITON_ROUTER_SUM" in new.knobs["SGLANG_USE_CUSTOM_ROUTER_SUM"].aliases
    old = cat(SGLANG_USE_TRITON_ROUTER_SUM=env("bool"))
    assert versions.renamed_to(old, new, "SGLANG_USE_TRITON_ROUTER_SUM")[0] == "SGLANG_USE_CUSTOM_ROUTER_SUM"


def env(type_: str = "int", **kw: Any) -> Knob:
    return Knob(kind="env", type=type_, **kw)  # type: ignore[arg-type]


def flag(type_: str = "int", **kw: Any) -> Knob:
    return Knob(kind="flag", type=type_, **kw)  # type: ignore[arg-type]


def cat(version: str = "1.0", renamed: dict[str, str] | None = None, removed: dict[str, str] | None = None,
        **knobs: Knob) -> Catalog:  # fmt: skip
    return Catalog(
        engine="eng", version=version, generated=True, env_prefixes=("ENG_",),
        serve=Serve(launcher=("eng",), fixed_args=(), readiness_path="/health"),
        knobs={k.replace("_dash_", "-"): v for k, v in knobs.items()}, renamed=renamed or {}, removed=removed or {},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("old", "new", "name", "want"),
    [
        # SGLang's retired-argument map (decoder_tp -> decoder_sp), as an overlay rename table of the new version
        (
            cat(decoder_dash_tp=flag()),
            cat("2.0", {"decoder-tp": "decoder-sp"}, decoder_dash_sp=flag()),
            "decoder-tp",
            ("renamed", "decoder-sp"),
        ),
        # a deprecated knob whose replacement the old version names (SGLang's DeprecatedStoreConstAction new_flag)
        (
            cat(monokernel_dash_backend=flag("str", deprecated=True, replacement="enable-amd-monokernel")),
            cat("2.0", enable_dash_amd_dash_monokernel=flag("bool")),
            "monokernel-backend",
            ("renamed", "enable-amd-monokernel"),
        ),
        # an old spelling the new version accepts as an alias (SGLang 0.5.23: --enable-hicache)
        (
            cat(enable_dash_hicache=flag("bool")),
            cat("2.0", enable_dash_hierarchical_dash_cache=flag("bool", aliases=("enable-hicache",))),
            "enable-hicache",
            ("renamed", "enable-hierarchical-cache"),
        ),
        # gone, with the engine's note (vLLM: --enable-reasoning, "unrecognized arguments")
        (
            cat(enable_dash_reasoning=flag("bool")),
            cat("2.0", removed={"enable-reasoning": "use --reasoning-parser"}),
            "enable-reasoning",
            ("removed", "use --reasoning-parser"),
        ),
        # gone without a word
        (cat(ENG_OLD=env()), cat("2.0"), "ENG_OLD", ("removed", "")),
    ],
    ids=["rename-table", "deprecated-replacement", "alias", "removed-with-note", "removed"],
)
def test_a_name_the_new_version_lacks(old: Catalog, new: Catalog, name: str, want: tuple[str, str]) -> None:
    got = {c.name: c for c in versions.diff(old, new).changes}[name]
    assert (got.what, got.new_name if got.what == "renamed" else got.detail) == want
    if got.what == "renamed":  # the new name is not listed as added too
        assert want[1] not in {c.name for c in versions.diff(old, new).of("added")}


def test_a_changed_type_default_and_range_are_each_named() -> None:
    d = versions.diff(cat(x=flag("int", default=1, max=8)), cat("2.0", x=flag("float", default=1.5, max=8)))
    assert [c.detail for c in d.of("changed")] == ["type 'int' -> 'float'; default 1 -> 1.5"]


def profile(env: dict[str, Any] | None = None, args: dict[str, Any] | None = None, **kw: Any) -> Profile:
    return Profile(name="p", version=3, engine="eng", env=env or {}, args=args or {}, **kw)


def test_a_profile_on_another_version_names_the_replacement_and_the_migrate_command() -> None:
    new = cat("2.0", {"decoder-tp": "decoder-sp"}, {"ENG_GONE": "no longer needed"}, decoder_dash_sp=flag())
    got = versions.problems_on(profile({"ENG_GONE": 1, "OTHER": "x"}, {"decoder-tp": 2}), new)
    assert got == [
        "env.ENG_GONE: eng 2.0 has no ENG_GONE: removed (no longer needed); drop it from the profile",
        "args.decoder-tp: eng 2.0 has no --decoder-tp: renamed to --decoder-sp; use --decoder-sp "
        "(`knobfleet profiles migrate PROFILE --to eng@2.0` rewrites it)",
    ]  # OTHER is not the engine's variable: the catalog does not speak for it
    assert versions.problems_on(profile(args={"decoder-tp": 2}, allow_unknown=("decoder-tp",)), new) == []


def test_the_real_removed_vllm_env_var_is_refused_on_0_32_and_valid_on_0_31() -> None:
    p = profile({"VLLM_ENGINE_ITERATION_TIMEOUT_S": 120})
    assert versions.problems_on(p, real("vllm", "0.31.0")) == []
    assert versions.problems_on(p, real("vllm")) == [
        "env.VLLM_ENGINE_ITERATION_TIMEOUT_S: vllm 0.32.0 has no VLLM_ENGINE_ITERATION_TIMEOUT_S: removed (last in "
        "vllm 0.31.0); drop it from the profile"
    ]
    back = versions.problems_on(profile(args={"grpc-port": 9000}), real("vllm", "0.31.0"))  # a rollback's view
    assert back == ["args.grpc-port: vllm 0.31.0 has no --grpc-port: removed (added in vllm 0.32.0); drop it from "
                    "the profile"]  # fmt: skip


def test_a_version_with_no_synced_catalog_names_the_sync_command() -> None:
    with pytest.raises(ProfileError) as info:
        catalogs.catalog_for("vllm", None, "0.29.1")
    assert info.value.problems == [
        "profiles/catalogs/generated/vllm@0.29.1.yaml: no catalog for vllm 0.29.1 (synced: 0.31.0, 0.32.0); add it "
        "with `knobfleet catalog sync vllm --version 0.29.1`"
    ]


LEAF = """\
# tuned on 0.31 for the long-context pool
schema_version: 1
name: p
version: 3
extends: base
env:
  ENG_KEEP: 1
  ENG_GONE: 7  # measured on H200
args:
  decoder-tp: 2  # two ranks
  max-seqs: 8
"""


def test_migrate_text_renames_in_place_comments_removed_and_overrides_inherited() -> None:
    moves = [
        versions.Move("args", "decoder-tp", 2, "decoder-sp"),
        versions.Move("env", "ENG_GONE", 7, None, "no longer needed"),
        versions.Move("args", "old-inherited", "x", "new-inherited", inherited=True),
    ]
    got = versions.migrate_text(LEAF, moves, "eng 2.0", 4, {"gpu": "H200", "sm_count": 132, "engine_version": None})
    assert (
        got.text
        == """\
# tuned on 0.31 for the long-context pool
schema_version: 1
name: p
version: 4
extends: base
env:
  ENG_KEEP: 1
  # ENG_GONE: 7  # removed in eng 2.0: no longer needed
args:
  decoder-sp: 2  # two ranks
  max-seqs: 8
  old-inherited: null  # renamed to new-inherited in eng 2.0
  new-inherited: "x"
fingerprint:
  gpu: "H200"
  sm_count: 132
  engine_version: "eng 2.0"
"""
    )


def test_migrate_text_refuses_a_flow_mapping_it_would_edit_and_leaves_the_others() -> None:
    got = versions.migrate_text("name: p\nversion: 1\nargs: {a: 1}\n", [versions.Move("args", "a", 1, "b")], "e 2", 2)
    assert got.text is None and got.reason.startswith("line 3: args is a flow mapping")
    kept = versions.migrate_text("name: p\nversion: 1\nargs: {a: 1}\nenv:\n  E_X: 1\n",
                                 [versions.Move("env", "E_X", 1, None, "gone")], "e 2", 2)  # fmt: skip
    assert kept.text is not None and "args: {a: 1}\n" in kept.text


@pytest.mark.parametrize(
    ("text", "moves", "want"),
    [
        # a section migrate emptied itself (env: {}), or written null, gets its first key as a block again
        ("name: p\nversion: 2\nenv: {}\n", [versions.Move("env", "E_OLD", 1, "E_NEW", inherited=True)],
         {"E_OLD": None, "E_NEW": 1}),
        ("name: p\nversion: 2\nenv: null\n", [versions.Move("env", "E_OLD", 1, "E_NEW", inherited=True)],
         {"E_OLD": None, "E_NEW": 1}),
        # a quoted key, renamed in place; four-space indent kept for the appended keys
        ('name: p\nversion: 2\nenv:\n    "E_OLD": 3\n', [versions.Move("env", "E_OLD", 3, "E_NEW"),
         versions.Move("env", "E_INH", 0.00001, "E_INH2", inherited=True)],
         {"E_NEW": 3, "E_INH": None, "E_INH2": 1e-05}),
    ],
    ids=["empty-flow", "null", "quoted-and-indented"],
)  # fmt: skip
def test_migrate_text_edits_the_layouts_people_write(text: str, moves: list[Any], want: dict[str, Any]) -> None:
    got = versions.migrate_text(text, moves, "e 2", 3)
    assert got.text is not None, got.reason
    assert safeyaml.loads(got.text)["env"] == want, got.text


@pytest.mark.parametrize(
    ("text", "move", "reason"),
    [
        ("name: p\nversion: 1\nargs:\n  a: 1\n  b: 2\n", versions.Move("args", "a", 1, "b"),
         "args.b is already set in this file, and a is renamed to it"),
        ("name: p\nversion: 1\nargs:\n  a: |\n    x\n", versions.Move("args", "a", "x", None, "gone"),
         "line 4: a has a value over several lines; migrate it by hand"),
    ],
)  # fmt: skip
def test_migrate_text_refuses_what_it_cannot_edit_safely(text: str, move: Any, reason: str) -> None:
    got = versions.migrate_text(text, [move], "e 2", 2)
    assert got.text is None and got.reason.startswith(reason), got.reason


YAML11_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false"}  # keys the loader refuses unquoted (safeyaml)
NAMES = st.from_regex(r"[a-z][a-z0-9]{0,6}(-[a-z0-9]{1,4})?", fullmatch=True).filter(lambda n: n not in YAML11_WORDS)
VALUES = st.one_of(st.integers(-(10**6), 10**6), st.booleans(), st.text("abc xyz:#'\"", max_size=8))


@settings(max_examples=60, deadline=None)
@given(
    knobs=st.dictionaries(NAMES, VALUES, min_size=1, max_size=6),
    picks=st.lists(st.integers(0, 2), min_size=6, max_size=6),
    comment=st.booleans(),
)
def test_migrate_text_yields_the_profile_with_each_move_applied(
    knobs: dict[str, Any], picks: list[int], comment: bool
) -> None:
    """Whatever the knobs and comments: the result loads as YAML; a renamed knob has its value under the new name,
    a removed one is gone, the rest are unchanged, and the version is bumped."""
    import json

    body = "".join(f"  {k}: {json.dumps(v)}" + ("  # note: x" if comment else "") + "\n" for k, v in knobs.items())
    text = f"name: p\nversion: 2\nargs:\n{body}"
    moves, want = [], {}
    for (k, v), pick in zip(knobs.items(), picks, strict=False):
        if pick == 1 and f"{k}-v2" not in knobs:
            moves.append(versions.Move("args", k, v, f"{k}-v2"))
            want[f"{k}-v2"] = v
        elif pick == 2:
            moves.append(versions.Move("args", k, v, None, "gone"))
        else:
            want[k] = v
    got = versions.migrate_text(text, moves, "eng 9.0", 3)
    assert got.text is not None
    doc = safeyaml.loads(got.text)
    assert doc["version"] == 3 and doc["fingerprint"] == {"engine_version": "eng 9.0"}
    assert (doc.get("args") or {}) == want


def test_resolve_validates_on_the_version_the_fingerprint_names(profiles_dir: Path) -> None:
    (profiles_dir / "old.yaml").write_text(
        "name: old\nversion: 1\nextends: vllm-tiny\nenv:\n  VLLM_ENGINE_ITERATION_TIMEOUT_S: 120\n"
        "fingerprint:\n  engine_version: vllm 0.31.0\n"
    )
    p = ProfileStore(profiles_dir).resolve("old")
    assert p.validated_on == "0.31.0" and p.env["VLLM_ENGINE_ITERATION_TIMEOUT_S"] == 120
    with pytest.raises(ProfileError, match=r"env.VLLM_ENGINE_ITERATION_TIMEOUT_S: vllm 0.32.0 has no"):
        ProfileStore(profiles_dir).resolve("old", engine_version="0.32.0")


# --- the use cases: profiles migrate, and the pre-check's per-host version --------------------------------------

OLD_PROFILE = """\
# valid on vLLM 0.31: the engine iteration timeout was raised for the long prompts
name: old
version: 1
extends: vllm-tiny
env:
  VLLM_ENGINE_ITERATION_TIMEOUT_S: 120  # long prompts
args:
  max-num-seqs: 8
fingerprint:
  engine_version: vllm 0.31.0
"""


@pytest.fixture
def old(profiles_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from knobfleet.ops import profiles as app

    path = profiles_dir / "old.yaml"
    path.write_text(OLD_PROFILE)
    monkeypatch.setattr(app, "store", lambda: ProfileStore(profiles_dir))
    return path


def test_migrate_writes_the_next_version_valid_on_the_target_then_says_there_is_nothing_left(old: Path) -> None:
    from knobfleet.ops import profiles as app

    dry = app.migrate("old", "vllm@0.32.0", write=False)
    assert old.read_text() == OLD_PROFILE and dry.after == 2 and dry.summary.startswith("would write old@2")
    got = app.migrate("old", "vllm@0.32.0")
    assert [(m.name, m.new_name, m.note) for m in got.moves] == [
        ("VLLM_ENGINE_ITERATION_TIMEOUT_S", None, "last in vllm 0.31.0")
    ]
    text = old.read_text()
    assert "version: 2\n" in text and "# valid on vLLM 0.31" in text  # the operator's comments stay
    assert "  # VLLM_ENGINE_ITERATION_TIMEOUT_S: 120  # removed in vllm 0.32.0: last in vllm 0.31.0\n" in text
    p = ProfileStore(old.parent).resolve("old", check_lock=False)
    assert p.validated_on == "0.32.0" and "VLLM_ENGINE_ITERATION_TIMEOUT_S" not in p.env and p.args["max-num-seqs"] == 8
    again = app.migrate("old", "vllm@0.32.0")
    assert (again.before, again.after, again.summary) == (2, 2, "old@2 already targets vllm 0.32.0: nothing changed")
    assert old.read_text() == text


@pytest.mark.parametrize(
    ("to", "error"),
    [
        ("vllm", "--to 'vllm': expected ENGINE@VERSION, e.g. vllm@0.32.0"),
        ("sglang@0.5.23", "profiles/old.yaml: engine: old is a vllm profile, not sglang; use --to vllm@VERSION"),
        ("vllm@0.29.1", "profiles/catalogs/generated/vllm@0.29.1.yaml: no catalog for vllm 0.29.1 (synced: 0.31.0, "
                        "0.32.0); add it with `knobfleet catalog sync vllm --version 0.29.1`"),
    ],
)  # fmt: skip
def test_a_bad_migrate_target_is_one_line_and_changes_nothing(old: Path, to: str, error: str) -> None:
    from knobfleet.errors import KnobfleetError
    from knobfleet.ops import profiles as app

    with pytest.raises(KnobfleetError) as info:
        app.migrate("old", to)
    assert str(info.value) == error and old.read_text() == OLD_PROFILE


def test_the_pre_check_refuses_a_host_on_a_version_that_lacks_a_knob(old: Path) -> None:
    from knobfleet.fleet.hostvars import HostVars
    from knobfleet.ops.precheck import version_refusal

    p = ProfileStore(old.parent).resolve("old", check_lock=False)
    on = {
        "named 0.31": (HostVars(host="a", engine="vllm", engine_version="0.31.0"), {}),
        "file 0.31+cpu": (HostVars(host="b", engine="vllm", version_file="/v"), {"engine_version": "0.31.0+cpu"}),
        "file 0.32": (HostVars(host="c", engine="vllm", version_file="/v"), {"engine_version": "0.32.0+cpu"}),
        "named 0.33": (HostVars(host="d", engine="vllm", engine_version="0.33.0"), {}),
        "unreadable": (HostVars(host="e", engine="vllm", version_file="/v"), {"engine_version": None}),
        "no version": (HostVars(host="f", engine="vllm"), {}),
        # vLLM's own word (dev-mode /server_info), over a version file that names another install
        "engine 0.32": (
            HostVars(host="g", engine="vllm", version_file="/v"),
            {"server_info": {"system_env": {"vllm_version": "0.32.0+cpu"}}, "engine_version": "0.31.0"},
        ),
        "engine 0.31": (HostVars(host="h", engine="vllm"), {"server_info": {"system_env": {"vllm_version": "0.31.0"}}}),
    }
    got = {k: version_refusal(p, hv, doc) for k, (hv, doc) in on.items()}
    assert got == {
        "named 0.31": None,
        "file 0.31+cpu": None,
        "file 0.32": "runs vllm 0.32.0 (/v): profile old@1: env.VLLM_ENGINE_ITERATION_TIMEOUT_S: vllm 0.32.0 has no "
        "VLLM_ENGINE_ITERATION_TIMEOUT_S: removed (last in vllm 0.31.0); drop it from the profile; nothing was changed",
        "named 0.33": "runs vllm 0.33.0 (knob_serve_engine_version): no catalog for vllm 0.33.0 (synced: 0.31.0, "
        "0.32.0); add it with `knobfleet catalog sync vllm --version 0.33.0`; nothing was changed",
        "unreadable": "engine version unreadable: /v gives None; fix the file, or name the version in "
        "knob_serve_engine_version; nothing was changed",
        "no version": None,
        "engine 0.32": "runs vllm 0.32.0 (the engine's server info): profile old@1: "
        "env.VLLM_ENGINE_ITERATION_TIMEOUT_S: vllm 0.32.0 has no VLLM_ENGINE_ITERATION_TIMEOUT_S: removed (last in "
        "vllm 0.31.0); drop it from the profile; nothing was changed",
        "engine 0.31": None,
    }


# --- the engine version as desired state: a profile pins it, a host names its installs ---------------------------

PINNED = OLD_PROFILE.replace("extends: vllm-tiny\n", "extends: vllm-tiny\nengine_version: 0.31.0\n")


def test_a_pinned_profile_is_valid_on_its_version_launches_its_install_and_migrates_as_the_upgrade(
    old: Path,
) -> None:
    from knobfleet.errors import RenderError
    from knobfleet.fleet.hostvars import HostVars
    from knobfleet.ops import profiles as app
    from knobfleet.ops.precheck import version_refusal
    from knobfleet.render import expected_argv, launcher_of

    old.write_text(PINNED)
    p = ProfileStore(old.parent).resolve("old", check_lock=False)
    assert (p.engine_version, p.validated_on) == ("0.31.0", "0.31.0")
    assert p.canonical()["engine_version"] == "0.31.0"  # part of what the hash covers: a pin change is a rollout
    installs = {"0.31.0": ("/opt/vllm-0.31.0/bin/vllm",), "0.32.0": ("/opt/vllm-0.32.0/bin/vllm",)}
    both = HostVars(host="a", engine="vllm", launchers=installs)
    assert expected_argv(p, both)[:2] == ["/opt/vllm-0.31.0/bin/vllm", "serve"]
    assert launcher_of(p, HostVars(host="b", engine="vllm", launcher=("/usr/bin/vllm",))) == ("/usr/bin/vllm",)
    with pytest.raises(RenderError) as info:
        launcher_of(p, HostVars(host="c", engine="vllm", launchers={"0.32.0": ("/opt/v32",)}))
    assert str(info.value) == (
        "host c: profile old@1 pins vllm 0.31.0, but knob_serve_launchers names no install of it (has: 0.32.0); "
        "add knob_serve_launchers['0.31.0']: [that install's launcher]"
    )
    # the pre-check: a host that names its installs launches the pinned one; one that does not must run it
    assert version_refusal(p, both, {}) is None
    on_32 = HostVars(host="d", engine="vllm", engine_version="0.32.0")
    assert version_refusal(p, on_32, {}) == (
        "runs vllm 0.32.0 (knob_serve_engine_version), and profile old@1 pins vllm 0.31.0: name that version's "
        "install in knob_serve_launchers, or upgrade the host; nothing was changed"
    )
    app.migrate("old", "vllm@0.32.0")
    up = ProfileStore(old.parent).resolve("old", check_lock=False)
    assert (up.version, up.engine_version, up.validated_on) == (2, "0.32.0", "0.32.0")
    assert expected_argv(up, both)[0] == "/opt/vllm-0.32.0/bin/vllm" and 'engine_version: "0.32.0"\n' in old.read_text()


def test_an_unpinned_profile_hashes_as_before() -> None:
    assert "engine_version" not in profile().canonical()


def test_drift_names_the_engine_versions_of_the_fleet_and_warns_on_skew() -> None:
    from knobfleet import report
    from knobfleet.live.verify import HostVerdict, summary

    hosts = [HostVerdict("lab1", "in_sync", engine_version="0.32.0"), HostVerdict("lab2", "in_sync",
             engine_version="0.31.0"), HostVerdict("lab3", "in_sync")]  # fmt: skip
    s = summary(hosts)
    assert s["engine_versions"] == {"0.32.0": ["lab1"], "0.31.0": ["lab2"]} and s["engine_version_skew"] is True
    assert "warning: engine version skew: 0.31.0 on lab2; 0.32.0 on lab1" in report.drift_tail(s).splitlines()
    assert hosts[0].as_json()["engine_version"] == "0.32.0" and "engine_version" not in hosts[2].as_json()
    assert "engine_versions" not in summary(hosts[2:])  # a fleet that reports no version: the summary as before


@pytest.mark.parametrize(
    ("pin", "reported", "status", "found"),
    [
        ("0.32.0", "0.31.0", "in_sync", True),  # the install behind the pinned launcher is another version
        ("0.32.0", "0.32.0", "in_sync", False),
        (None, "0.31.0", "in_sync", False),  # an unpinned profile runs whatever the host has
        ("0.32.0", None, "in_sync", False),  # no version file: nothing to compare
        ("0.32.0", "0.31.0", "unreachable", False),
    ],
)
def test_a_host_reporting_another_version_than_its_profile_pins_drifts(
    pin: str | None, reported: str | None, status: str, found: bool
) -> None:
    from knobfleet.live.verify import Declared, HostVerdict
    from knobfleet.ops.drift import version_mismatch

    got = version_mismatch(Declared("p", 2, "sha256:x", pin), HostVerdict("h", status, engine_version=reported))  # type: ignore[arg-type]
    assert (got is not None) == found
    if got is not None:
        assert (got.kind.value, got.expected, got.actual, got.severity) == ("engine_version_mismatch", pin, reported,
                                                                           "error")  # fmt: skip
        assert (
            got.message
            == "the host reports engine version 0.31.0; p@2 pins 0.32.0: check the install behind its launcher"
        )


@pytest.mark.parametrize(
    ("doc", "want"),
    [
        # what runs, from the engine itself, wins over a version file (a host with several installs)
        (
            {"engine_version": "0.31.0+cpu", "server_info": {"version": "0.32.0"}},
            ("0.32.0", "the engine's server info"),
        ),
        ({"engine_version": "0.31.0+cpu", "server_info": {"max_total_num_tokens": 1}}, ("0.31.0", "version file")),
        ({"server_info": {"version": "0.5.22+sim"}}, ("0.5.22", "the engine's server info")),
        ({"server_info": {"version": 5}}, (None, "")),  # not text: says nothing
        ({"server_info": "not json"}, (None, "")),
        ({}, (None, "")),
        (None, (None, "")),
    ],
)
def test_the_version_a_probe_shows(doc: dict[str, Any] | None, want: tuple[str | None, str]) -> None:
    assert hostversion.reported(doc) == want


def test_a_profile_valid_on_the_pinned_catalog_stays_valid_whatever_its_fingerprint_says(profiles_dir: Path) -> None:
    """The fingerprint picks another version's catalog only for a profile the pinned one refuses (review finding:
    a profile fingerprinted 0.5.22 that uses a flag 0.5.23 added stopped resolving)."""
    (profiles_dir / "tuned22.yaml").write_text(
        "name: tuned22\nversion: 1\nextends: ctas512\nargs:\n  enable-http-worker-reuseport: true\n"
        "fingerprint:\n  engine_version: sglang 0.5.22\n"
    )
    assert ProfileStore(profiles_dir).resolve("tuned22").validated_on == "0.5.23"


def test_a_named_version_with_a_build_label_is_that_version(old: Path) -> None:
    from knobfleet.fleet.hostvars import HostVars
    from knobfleet.ops.precheck import version_refusal

    p = ProfileStore(old.parent).resolve("old", check_lock=False)
    assert version_refusal(p, HostVars(host="a", engine="vllm", engine_version="0.31.0+cpu"), {}) is None
    assert version_refusal(p, HostVars(host="a", engine="vllm", engine_version="v0.31.0"), {}) is None


def test_migrate_refuses_what_would_break_a_profile_that_extends_it(old: Path) -> None:
    from knobfleet.errors import ProfileError as Refused
    from knobfleet.ops import profiles as app

    old.write_text(OLD_PROFILE.replace("  VLLM_ENGINE_ITERATION_TIMEOUT_S: 120  # long prompts\n", "  {}\n"
                                       ).replace("env:\n  {}\n", ""))  # fmt: skip
    child = old.parent / "old-child.yaml"  # valid on 0.31.0 only, through old's fingerprint
    child.write_text("name: old-child\nversion: 1\nextends: old\nenv:\n  VLLM_ENGINE_ITERATION_TIMEOUT_S: 120\n")
    assert ProfileStore(old.parent).resolve("old-child", check_lock=False).validated_on == "0.31.0"
    before = old.read_text()
    with pytest.raises(Refused, match=r"migrating it would break old-child, which extends it \(nothing changed"):
        app.migrate("old", "vllm@0.32.0")
    assert old.read_text() == before


def test_migrate_finds_the_version_a_profile_with_no_version_is_valid_on(old: Path) -> None:
    """The refusal's hint says `profiles migrate ... --to vllm@0.32.0`: it must work for a profile written for
    0.31.0 that names no version (review finding: it failed with the same error)."""
    from knobfleet.ops import profiles as app

    old.write_text(OLD_PROFILE.replace("fingerprint:\n  engine_version: vllm 0.31.0\n", ""))
    got = app.migrate("old", "vllm@0.32.0")
    assert got.after == 2 and [m.name for m in got.moves] == ["VLLM_ENGINE_ITERATION_TIMEOUT_S"]

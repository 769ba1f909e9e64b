"""Resolving an extends chain (ProfileStore.resolve): the depth limit at its bound, flags written with their
dashes, nulls that remove nothing, what a child inherits (fingerprint), the engine of a store's own catalogs,
and every secret in a profile named at once."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from knobfleet.errors import ProfileError
from knobfleet.profiles import catalog
from knobfleet.profiles.model import Catalog, Knob, Profile, Serve
from knobfleet.profiles.store import MAX_DEPTH, ProfileStore


def write(d: Path, name: str, body: str) -> None:
    (d / f"{name}.yaml").write_text(body)


def problems(d: Path, name: str) -> list[str]:
    with pytest.raises(ProfileError) as info:
        ProfileStore(d).resolve(name)
    return info.value.problems


def chain(d: Path, n: int) -> str:
    write(d, "c0", "name: c0\nversion: 1\n")
    for i in range(1, n):
        write(d, f"c{i}", f"name: c{i}\nversion: 1\nextends: c{i - 1}\n")
    return f"c{n - 1}"


def test_a_chain_of_max_depth_resolves(profiles_dir: Path) -> None:
    leaf = chain(profiles_dir, MAX_DEPTH)
    assert ProfileStore(profiles_dir).resolve(leaf).chain == tuple(f"c{i}" for i in range(MAX_DEPTH))


def test_one_more_is_refused_naming_the_chain(profiles_dir: Path) -> None:
    leaf = chain(profiles_dir, MAX_DEPTH + 1)
    seen = " -> ".join(f"c{i}" for i in range(MAX_DEPTH, 0, -1))
    assert problems(profiles_dir, leaf) == [f"profiles/c1.yaml: extends: chain deeper than 8 ({seen}); flatten it"]


def test_a_missing_parent_without_a_likely_name(profiles_dir: Path) -> None:
    write(profiles_dir, "x", "name: x\nversion: 1\nextends: zzzzzz\n")
    assert problems(profiles_dir, "x") == ["profiles/x.yaml: extends: profile 'zzzzzz' not found; check the name"]


def test_flags_may_be_written_with_their_dashes(profiles_dir: Path) -> None:
    write(
        profiles_dir, "x", "name: x\nversion: 1\nextends: default\nargs:\n  --tp-size: 4\n  '--enable-metrics': null\n"
    )
    p = ProfileStore(profiles_dir).resolve("x")
    assert p.args["tp-size"] == 4 and "--tp-size" not in p.args and "enable-metrics" not in p.args
    write(profiles_dir, "y", "name: y\nversion: 1\nextends: default\nenv:\n  --SGLANG_X: 1\n")
    assert problems(profiles_dir, "y") == [
        "profiles/y.yaml: env.--SGLANG_X: invalid env var name; use letters, digits and _ and do not start with a digit"
    ]


def test_a_null_for_a_key_nobody_set_removes_nothing(profiles_dir: Path) -> None:
    write(
        profiles_dir, "x", "name: x\nversion: 1\nextends: default\nenv:\n  NOBODY_SET_THIS: null\nargs:\n  nope: null\n"
    )
    base = ProfileStore(profiles_dir).resolve("default")
    p = ProfileStore(profiles_dir).resolve("x")
    assert (p.env, p.args) == (base.env, base.args)


def test_the_fingerprint_is_inherited_unless_the_child_has_its_own(profiles_dir: Path) -> None:
    write(profiles_dir, "fp", "name: fp\nversion: 1\nfingerprint: {gpu: h200, sm_count: 132}\n")
    write(profiles_dir, "plain", "name: plain\nversion: 1\n")
    write(profiles_dir, "child", "name: child\nversion: 1\nextends: fp\n")
    write(profiles_dir, "own", "name: own\nversion: 1\nextends: fp\nfingerprint: {gpu: b200}\n")
    st = ProfileStore(profiles_dir)
    assert (st.resolve("child").fingerprint.gpu, st.resolve("child").fingerprint.sm_count) == ("h200", 132)
    assert (st.resolve("own").fingerprint.gpu, st.resolve("own").fingerprint.sm_count) == ("b200", None)
    assert st.resolve("plain").fingerprint.gpu is None


def test_a_profile_without_engine_takes_the_default_of_its_stores_catalogs(tmp_path: Path) -> None:
    cats = tmp_path / "catalogs"
    cats.mkdir()
    (cats / "toy.yaml").write_text(
        "engine: toy\nenv_prefixes: [TOY_]\n"
        "serve: {default: true, launcher: [toy], fixed_args: [], readiness_path: /health}\n"
        "knobs:\n  TOY_N: {kind: env, type: int}\n"
    )
    write(tmp_path, "t", "name: t\nversion: 1\nenv:\n  TOY_N: 3\n")
    catalog.catalog_for.cache_clear()
    catalog.default_engine.cache_clear()
    try:
        p = ProfileStore(tmp_path).resolve("t")
    finally:
        catalog.catalog_for.cache_clear()
        catalog.default_engine.cache_clear()
    assert (p.engine, p.env) == ("toy", {"TOY_N": 3})


def test_every_secret_and_every_bad_value_is_named_at_once(profiles_dir: Path) -> None:
    write(
        profiles_dir,
        "x",
        "name: x\nversion: 1\nextends: default\nenv:\n  HF_TOKEN: a\n  MY_API_KEY: b\n  SGLANG_SM120_MMA_BLOCK_H: 7\n",
    )
    fix = "set it in the host vars as knob_serve_host_env.{0}, from Ansible Vault or lookup('env', '{0}')"
    # in the order the chain sets them: BLOCK_H comes from default, the secrets from x
    assert problems(profiles_dir, "x") == [
        "profiles/x.yaml: env.SGLANG_SM120_MMA_BLOCK_H: 7 is not one of 16, 32, 64",
        "profiles/x.yaml: env.HF_TOKEN: a secret does not belong in a profile (it would be in git and in every "
        "report); " + fix.format("HF_TOKEN"),
        "profiles/x.yaml: env.MY_API_KEY: a secret does not belong in a profile (it would be in git and in every "
        "report); " + fix.format("MY_API_KEY"),
    ]


def test_a_catalog_marks_its_own_secrets() -> None:
    cat = Catalog(
        engine="toy",
        env_prefixes=("TOY_",),
        serve=Serve(launcher=("toy",), fixed_args=(), readiness_path="/h"),
        knobs={
            "TOY_CRED": Knob(kind="env", type="str", secret=True),
            "TOY_N": Knob(kind="env", type="int"),
            "api-key": Knob(kind="flag", type="str", secret=True),  # a flag: its value is on the command line
        },
    )
    assert cat.secret_names() == ("TOY_CRED", "api-key")
    assert cat.is_secret("TOY_CRED") and not cat.is_secret("TOY_N") and cat.is_secret("TOY_API_KEY")


def test_a_content_hash_never_changes() -> None:
    """Published versions are locked by this hash: a change to how it is computed breaks every lock. Gate
    weights are hashed with their keys as text (8 sorts after 16)."""
    p = Profile(
        name="h",
        version=3,
        engine="vllm",
        env={"VLLM_B": "x", "VLLM_A": 1},
        args={"max-num-seqs": 8, "enforce-eager": True},
        gate={"concurrency": (8, 16), "weights": {8: 0.5, 16: 0.5}, "baseline": "b"},
    )
    blob = (
        '{"args":{"enforce-eager":true,"max-num-seqs":8},"engine":"vllm","env":{"VLLM_A":1,"VLLM_B":"x"},'
        '"gate":{"baseline":"b","concurrency":[8,16],"consistency":true,"max_regression":0.03,"min_effect":0.01,'
        '"weights":{"16":0.5,"8":0.5}},"name":"h","schema_version":1,"version":3}'
    )
    assert p.content_hash == "sha256:" + hashlib.sha256(blob.encode()).hexdigest()
    assert p.content_hash == "sha256:70b6de8321dc993148fa539c449ca965cb1c1d4ab4af5564c7fb5f1fe54e6805"


def test_the_leafs_description_and_the_chains_allow_unknown_are_kept(profiles_dir: Path) -> None:
    write(
        profiles_dir,
        "x",
        "name: x\nversion: 1\nextends: default\ndescription: my tuning\nallow_unknown: [SGLANG_NEW_THING, --new-flag]\n"
        "env:\n  SGLANG_NEW_THING: 1\nargs:\n  new-flag: 2\n",
    )
    p = ProfileStore(profiles_dir).resolve("x")
    assert p.description == "my tuning" and p.allow_unknown == ("SGLANG_NEW_THING", "new-flag")

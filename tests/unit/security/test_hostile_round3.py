"""Third audit: allow-lists where deny-lists were (bash's read-only names, the GPU stack's injection and plugin
libraries, units the host itself needs), finite numbers at every parse of free-form options."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from knobfleet import rules
from knobfleet.cli.parse import parse_weights
from knobfleet.errors import InventoryError, KnobfleetError
from knobfleet.fleet.hostvars import from_inventory_vars
from knobfleet.profiles.store import ProfileStore

PROFILE = "name: x\nversion: 1\nextends: default\n"


@pytest.mark.parametrize("name", ["UID", "EUID", "PPID", "BASH_VERSINFO", "SHELLOPTS", "GROUPS", "FUNCNAME"])
def test_names_bash_will_not_assign_are_refused_in_profiles_and_host_env(profiles_dir: Path, name: str) -> None:
    (profiles_dir / "x.yaml").write_text(PROFILE + f"env:\n  {name}: '1'\n")
    with pytest.raises(Exception) as info:
        ProfileStore(profiles_dir).resolve("x")
    assert f"env.{name}: bash will not let the serve script set {name} (read-only)" in str(info.value)
    with pytest.raises(InventoryError) as exc:
        from_inventory_vars("h1", {"knob_serve_host_env": {name: "1"}}, "inv")
    assert f"'{name}': bash will not let the serve script set it (read-only); remove it" in str(exc.value)


@pytest.mark.parametrize(
    "name", ["CUDA_INJECTION64_PATH", "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_PROFILER_PLUGIN", "LD_PRELOAD"]
)
def test_libraries_the_gpu_stack_loads_need_allow_unknown(profiles_dir: Path, name: str) -> None:
    (profiles_dir / "x.yaml").write_text(PROFILE + f"env:\n  {name}: /opt/x.so\n")
    with pytest.raises(Exception) as info:
        ProfileStore(profiles_dir).resolve("x")
    assert f"env.{name}: a loader variable" in str(info.value)
    assert rules.is_loader_env(name)
    # the operator's host vars may set one: they are trusted, the profile is not
    assert from_inventory_vars("h1", {"knob_serve_host_env": {name: "/opt/x.so"}}, "inv").host_env[name]


@pytest.mark.parametrize(
    "service", ["ssh", "sshd", "ssh.service", "dbus", "systemd-journald", "systemd-anything", "getty@tty1", "docker"]
)
def test_the_engine_service_may_not_be_a_unit_the_host_needs(service: str) -> None:
    with pytest.raises(InventoryError) as exc:
        from_inventory_vars("h1", {"knob_serve_service": service}, "inv")
    assert "is a unit the host itself needs" in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("service", ["sglang-dsv4-decode", "vllm-tiny", "sshuttle-engine", "my-docker-engine"])
def test_engine_services_with_near_names_are_kept(service: str) -> None:
    assert from_inventory_vars("h1", {"knob_serve_service": service}, "inv").service == service


@given(
    st.lists(
        st.tuples(
            st.integers(-5, 2_000_000),
            st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8)),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_weights_are_finite_or_refused_in_one_line(pairs: list[tuple[int, object]]) -> None:
    text = ",".join(f"{c}={w}" for c, w in pairs)
    try:
        out = parse_weights(text)
    except KnobfleetError as exc:
        assert str(exc).startswith("--weights ") and "\n" not in str(exc)
        return
    assert all(math.isfinite(w) and w >= 0 for w in out.values()) and sum(out.values()) > 0
    assert all(1 <= c <= 1_000_000 for c in out)


@pytest.mark.parametrize("text", ["48=nan", "48=inf", "48=1e400", "48=0.3,64=-inf", "9" * 5000 + "=1"])
def test_non_finite_weights_are_refused(text: str) -> None:
    with pytest.raises(KnobfleetError, match=r"^--weights "):
        parse_weights(text)


def test_a_rewrite_keeps_the_files_mode(tmp_path: Path) -> None:
    import os

    from knobfleet import safefile

    path = tmp_path / "out.json"
    path.write_text("old")
    os.chmod(path, 0o600)
    safefile.write_text(path, "new")
    assert path.read_text() == "new" and os.stat(path).st_mode & 0o777 == 0o600
    safefile.write_text(tmp_path / "fresh.json", "x")
    assert os.stat(tmp_path / "fresh.json").st_mode & 0o777 == 0o644
    safefile.write_text(path, "again", mode=0o640)
    assert os.stat(path).st_mode & 0o777 == 0o640


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("DB_PASS", True),
        ("REDIS_PASS", True),
        ("--db-pass", True),
        ("dbPass", True),
        ("AWS_CREDENTIALS", True),
        ("MY_CREDENTIAL_FILE_BODY", True),
        ("SGLANG_DIAG_BYPASS_HEALTH_GENERATE", False),  # BYPASS is another word
        ("SGLANG_PREFILL_DELAYER_MAX_DELAY_PASSES", False),
        ("VLLM_ENABLE_PREGRAD_PASSES", False),
        ("--max-total-tokens", False),
    ],
)
def test_the_secret_rule_knows_pass_and_credentials(name: str, secret: bool) -> None:
    from knobfleet.module_utils.knob_redact import is_secret

    assert is_secret(name) is secret


def test_a_profile_may_not_set_a_password(profiles_dir: Path) -> None:
    (profiles_dir / "x.yaml").write_text(PROFILE + "env:\n  DB_PASS: hunter2\n")
    with pytest.raises(Exception) as info:
        ProfileStore(profiles_dir).resolve("x")
    assert "a secret does not belong in a profile" in str(info.value) and "hunter2" not in str(info.value)


# --- cause 1: every writer through safefile (nodes the test makes in its own temp dir) ------------------------


def _hostile(where: Path, kind: str) -> None:
    import os
    import stat

    if kind == "fifo":
        os.mkfifo(where)
    elif kind == "device":
        os.mknod(where, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero's numbers, made here
    elif kind == "dangling-symlink":
        os.symlink(where.parent.parent / "outside-the-project.yaml", where)
    elif kind == "folder":
        where.mkdir()


HOSTILE = ["fifo", "device", "dangling-symlink", "folder"]


@pytest.mark.parametrize("kind", HOSTILE)
def test_waves_suggest_never_writes_through_a_hostile_node(
    profiles_dir: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    import signal

    from knobfleet.errors import KnobfleetError
    from knobfleet.kernel import advisor
    from knobfleet.kernel.advisor import write_candidate
    from knobfleet.profiles.store import ProfileStore

    monkeypatch.setattr(advisor, "store", lambda: ProfileStore(profiles_dir))  # the test's copy, never the repo's
    base = ProfileStore(profiles_dir).resolve("ctas512")
    target = profiles_dir / "ctas512-ctas256.yaml"
    _hostile(target, kind)
    signal.alarm(10)  # a FIFO opened for writing would block: the test fails instead of hanging
    try:
        with pytest.raises(KnobfleetError) as exc:
            write_candidate(base, 256)
    finally:
        signal.alarm(0)
    assert "\n" not in str(exc.value)
    assert not (profiles_dir.parent / "outside-the-project.yaml").exists()


@pytest.mark.parametrize("kind", HOSTILE)
def test_the_profiles_lock_is_never_written_through_a_hostile_node(profiles_dir: Path, kind: str) -> None:
    from knobfleet.errors import KnobfleetError
    from knobfleet.profiles.store import ProfileStore

    store = ProfileStore(profiles_dir)
    store.lock_path.unlink()
    _hostile(store.lock_path, kind)
    with pytest.raises(KnobfleetError) as exc:
        store.write_lock()
    assert "nothing was written" in str(exc.value) or "cannot read" in str(exc.value)
    assert not (profiles_dir.parent / "outside-the-project.yaml").exists()


@pytest.mark.parametrize("kind", ["dangling-symlink", "fifo"])
def test_the_crash_file_never_follows_a_symlink_and_the_boundary_still_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    from knobfleet import cli

    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(state))
    _hostile(state / "crash.txt", kind)
    assert cli._unexpected(RuntimeError("boom")) == 1
    err = capsys.readouterr().err
    assert err.startswith("knobfleet: internal error: RuntimeError: boom") and "details in" not in err
    assert not (tmp_path / "outside-the-project.yaml").exists()


def test_the_crash_file_is_owner_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from knobfleet import cli

    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))
    cli._unexpected(RuntimeError("boom"))
    assert (tmp_path / "state" / "crash.txt").stat().st_mode & 0o777 == 0o600


def test_every_cache_read_goes_through_one_bounded_reader() -> None:
    """The caches are read through ``safefile.read_cache`` only (a FIFO, device or folder planted at a cache path
    is a miss, never a blocking read): no module reads a file under a cache folder any other way."""
    import re

    pkg = Path(__file__).resolve().parents[3] / "python" / "knobfleet"
    offenders = []
    for f in pkg.rglob("*.py"):
        text = f.read_text(encoding="utf-8")
        for m in re.finditer(r"^.*(cache|_plan_file|_path\(key).*\.read_(text|bytes)\(.*$", text, re.M):
            offenders.append(f"{f.relative_to(pkg)}: {m.group(0).strip()}")
    assert offenders == []


@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_a_hostile_node_in_a_cache_is_a_miss(tmp_path: Path, kind: str) -> None:
    import signal

    from knobfleet import safefile

    node = tmp_path / "cache.json"
    _hostile(node, kind)
    signal.alarm(10)
    try:
        assert safefile.read_cache(node) is None
    finally:
        signal.alarm(0)
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 2048)
    assert safefile.read_cache(big, max_bytes=1024) is None and safefile.read_cache(big) == " " * 2048


@pytest.mark.parametrize("bound", [".nan", ".inf", "-.inf"])
def test_a_catalog_bound_that_is_not_finite_is_refused(profiles_dir: Path, bound: str) -> None:
    """A NaN bound compares false with everything, so every value would pass it: the catalog is refused with one
    line naming the file, the knob and the field."""
    from knobfleet.errors import ProfileError
    from knobfleet.profiles import catalog

    overlay = profiles_dir / "catalogs" / "sglang.overlay.yaml"
    overlay.write_text(
        overlay.read_text()
        + f"\n  SGLANG_TEST_BOUND:\n    kind: env\n    type: float\n    origin: a test\n    min: {bound}\n"
    )
    catalog.catalog_for.cache_clear()
    with pytest.raises(ProfileError) as exc:
        catalog.catalog_for("sglang", profiles_dir / "catalogs")
    text = str(exc.value)
    assert "sglang.overlay.yaml" in text and "SGLANG_TEST_BOUND" in text and "a bound must be a finite number" in text

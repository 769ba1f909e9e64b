"""The version lock (profiles/profiles.lock) as a user meets it: the exact refusal when a published version
changed (naming the parents only when there are some), a damaged lock named with its fix, and a lock write
that stays beside the lock and leaves the old one whole when it cannot finish."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from knobfleet.errors import KnobfleetError, ProfileError
from knobfleet.profiles.store import LOCK_HEADER, ProfileStore


def refusal(store: ProfileStore, name: str) -> str:
    with pytest.raises(ProfileError) as info:
        store.resolve(name)
    (msg,) = info.value.problems
    return msg


@pytest.mark.parametrize(
    ("name", "edit", "via"),
    [
        ("base", ("tp-size: 2", "tp-size: 4"), ""),  # a root profile: no "includes"
        ("vllm-seqs8", ("max-num-seqs: 8", "max-num-seqs: 6"), " (its content includes vllm-tiny)"),
        ("ctas512", ("TARGET_CTAS: 512", "TARGET_CTAS: 640"), " (its content includes base, default)"),
    ],
)
def test_a_changed_published_version_is_refused_with_both_hashes(
    profiles_dir: Path, name: str, edit: tuple[str, str], via: str
) -> None:
    store = ProfileStore(profiles_dir)
    store.write_lock()
    locked = store.read_lock()[store.resolve(name).ref]
    path = profiles_dir / f"{name}.yaml"
    path.write_text(path.read_text().replace(*edit))
    now = store.resolve(name, check_lock=False)
    assert now.content_hash != locked
    assert refusal(store, name) == (
        f"profiles/{name}.yaml: version: {now.ref} is published with {locked[:19]}… but its content now hashes "
        f"to {now.content_hash[:19]}…{via}; published versions are immutable: bump `version` and run "
        "`knobfleet profiles lock`"
    )
    assert locked[:19].startswith("sha256:") and len(locked[:19]) == len("sha256:") + 12


@pytest.mark.parametrize(
    "body",
    [
        "- base@1\n- base@2\n",  # a list
        "base@1: 3\n",  # a hash that is not text
        "base@1: sha256:ab\nbase@2: [sha256:cd]\n",  # one bad line among good ones
        "just text\n",
    ],
)
def test_a_damaged_lock_names_the_file_and_the_fix(profiles_dir: Path, body: str) -> None:
    (profiles_dir / "profiles.lock").write_text(body)
    store = ProfileStore(profiles_dir)
    for call in (store.read_lock, lambda: store.resolve("base"), store.write_lock):
        with pytest.raises(ProfileError) as info:
            call()
        assert info.value.problems == [
            "profiles/profiles.lock: expected `name@version: sha256:…` lines; regenerate it with "
            "`knobfleet profiles lock`"
        ]


def test_a_lock_that_is_not_yaml_names_the_file(profiles_dir: Path) -> None:
    (profiles_dir / "profiles.lock").write_text("base@1: [unclosed\n")
    with pytest.raises(ProfileError) as info:
        ProfileStore(profiles_dir).read_lock()
    (msg,) = info.value.problems
    assert msg.startswith("profiles/profiles.lock: ") and len(msg) > len("profiles/profiles.lock: ")


@pytest.mark.parametrize("body", ["", LOCK_HEADER])
def test_an_empty_lock_locks_nothing(profiles_dir: Path, body: str) -> None:
    (profiles_dir / "profiles.lock").write_text(body)
    assert ProfileStore(profiles_dir).read_lock() == {}


def test_the_lock_is_written_beside_itself_not_in_the_system_temp_dir(
    profiles_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """os.replace is atomic only within one filesystem: the new lock is written next to the old one, so it
    works even where the system temp dir is unusable (or on another filesystem)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-dir"))
    lock, _ = ProfileStore(profiles_dir).write_lock()
    assert "base@2" in lock and (profiles_dir / "profiles.lock").read_text().startswith(LOCK_HEADER)


def test_a_lock_write_that_cannot_finish_leaves_the_old_lock_whole(
    profiles_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = "base@1: sha256:0b25\n"
    (profiles_dir / "profiles.lock").write_text(before)
    names = {p.name for p in profiles_dir.iterdir()}

    def no_rename(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_rename)
    with pytest.raises(
        KnobfleetError, match=r"profiles\.lock: cannot write \(No space left on device\); nothing was written$"
    ):
        ProfileStore(profiles_dir).write_lock()
    assert (profiles_dir / "profiles.lock").read_text() == before
    assert {p.name for p in profiles_dir.iterdir()} == names  # the temp file is removed too (safefile)

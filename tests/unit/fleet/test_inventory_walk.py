"""The inventory folder walk (fleet/inventory.py ``_walk``), as Ansible reads a folder: symlinked folders are
followed, each folder entered once on a path. Generated trees of folders and symlinks (to an ancestor, a sibling,
itself, nowhere) in the test's temp dir: the pre-check returns within its bounds with a one-line answer, a loop is
named and refused, the fingerprint is None for it (never cached), and a symlinked folder without a loop is read
(its files are in the fingerprint: a change there is a cache miss)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from knobfleet.fleet import inventory

HOSTS = "all:\n  hosts:\n    a:\n      ansible_host: 127.0.0.1\n"
# (folder index, link name, what it points to: an ancestor by levels up, a sibling folder, itself, nothing)
LINK = st.tuples(
    st.integers(0, 3), st.sampled_from(["l1", "l2", "l3"]), st.sampled_from(["up1", "up2", "self", "sib", "none"])
)


def build(root: Path, links: list[tuple[int, str, str]]) -> None:
    folders = [root / "group_vars", root / "group_vars" / "all", root / "host_vars", root / "host_vars" / "a"]
    for f in folders:
        f.mkdir(parents=True, exist_ok=True)
    (root / "hosts.yml").write_text(HOSTS)
    (folders[1] / "x.yml").write_text("x: 1\n")
    for i, name, to in links:
        where = folders[i] / name
        if where.exists() or where.is_symlink():
            continue
        target = {"up1": "..", "up2": "../..", "self": ".", "sib": "../all" if i == 1 else "..", "none": "missing"}[to]
        os.symlink(target, where)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(links=st.lists(LINK, max_size=8))
def test_any_tree_of_symlinks_gets_a_bounded_one_line_answer(tmp_path: Path, links: list[tuple[int, str, str]]) -> None:
    root = tmp_path / "inv"
    shutil.rmtree(root, ignore_errors=True)
    build(root, links)
    started = time.monotonic()
    why = inventory.check_sources(root)
    key = inventory.fingerprint(root, None)
    assert time.monotonic() - started < 5.0
    assert why is None or "\n" not in why
    if why is not None and "a loop" in why:
        assert key is None
    loops = any(to in ("up1", "up2", "self") or (to == "sib" and i != 1) for i, _n, to in links)
    if not loops and why is None:
        assert key is not None


def test_a_loop_is_named_and_refused(tmp_path: Path) -> None:
    root = tmp_path / "inv"
    build(root, [(0, "l1", "up1"), (0, "l2", "up1"), (0, "l3", "up1")])  # three self-links: 3**16 paths before
    started = time.monotonic()
    why = inventory.check_sources(root)
    assert why is not None and why.endswith(
        f"/group_vars/l1: a symlink back to a folder above it ({root}), a loop; remove it"
    )
    assert inventory.fingerprint(root, None) is None
    assert time.monotonic() - started < 2.0


def test_a_symlinked_folder_is_read_and_fingerprinted(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "vars.yml").write_text("v: 1\n")
    root = tmp_path / "inv"
    build(root, [])
    os.symlink(shared, root / "group_vars" / "all" / "shared")
    assert inventory.check_sources(root) is None
    before = inventory.fingerprint(root, None)
    (shared / "vars.yml").write_text("v: 2\n")
    assert before is not None and inventory.fingerprint(root, None) not in (None, before)

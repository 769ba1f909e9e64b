"""A profile, its parent, the version lock, the profiles folder and a catalog overlay that are not regular files (a
FIFO, a device, a folder, a dangling symlink, a symlink loop): one line naming the path, what is there and the fix,
never "not found", never skipped (issue 56, cause 12: an overlay that was a FIFO or a dangling symlink was left out
of the catalog in silence, a FIFO parent was reported "not found"). Nothing changes, nothing blocks; every node is
made in the test's temp folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from knobfleet import cli
from knobfleet.errors import EXIT_ERROR, EXIT_OK
from tests.unit.test_paths import PHRASE, plant, refused, tree

ENG = "schema_version: 1\nname: eng\nversion: 1\nengine: myengine\nenv: {}\n"  # a project's own engine
CHILD = "schema_version: 1\nname: child\nversion: 1\nextends: parent\nenv:\n  SGLANG_OPT_USE_MULTI_STREAM_OVERLAP: 1\n"
FIX = "replace it with a regular YAML file"
# where the node goes (relative to the project), the command, and the line it must give
PLACES = {
    "profile": ("profiles/odd.yaml", ["profiles", "show", "odd"], "{p}: {what}, not a profile file; " + FIX),
    "parent": (
        "profiles/parent.yaml",
        ["profiles", "show", "child"],
        "{p}: {what}, not a profile file (extended by profiles/child.yaml); " + FIX,
    ),
    "listed profile": ("profiles/odd.yaml", ["profiles", "list"], "{p}: {what}, not a profile file; " + FIX),
    "project overlay": (
        "catalogs/sglang.overlay.yaml",
        ["profiles", "validate"],
        "{p}: {what}, not a catalog overlay; " + FIX,
    ),
    "project catalog": (
        "catalogs/myengine.yaml",
        ["profiles", "show", "eng"],
        "{p}: {what}, not a catalog file; " + FIX,
    ),
    "lock": (
        "profiles/profiles.lock",
        ["profiles", "show", "mybase"],
        "{p}: {what}, not a lock file; remove it and run `knobfleet profiles lock` (or restore it from git); "
        "nothing was written",
    ),
}
FILE_KINDS = ["fifo", "device", "folder", "dangling", "loop"]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from knobfleet.profiles import catalog

    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))  # never this machine's own state folder
    monkeypatch.delenv("KNOBFLEET_HOME", raising=False)
    monkeypatch.delenv("KNOBFLEET_EXAMPLES", raising=False)
    assert cli.run(["init", str(tmp_path / "proj")]) == EXIT_OK
    monkeypatch.chdir(tmp_path / "proj")
    catalog.catalog_for.cache_clear()  # type: ignore[attr-defined]  # the overlays are this project's
    catalog.default_engine.cache_clear()
    return tmp_path / "proj"


@pytest.mark.parametrize("kind", FILE_KINDS)
@pytest.mark.parametrize("place", sorted(PLACES))
def test_a_project_file_that_is_not_a_regular_file_is_one_line_naming_it(
    capsys: pytest.CaptureFixture[str], project: Path, place: str, kind: str
) -> None:
    rel, argv, line = PLACES[place]
    if place == "parent":
        (project / "profiles" / "child.yaml").write_text(CHILD)
    if place == "project catalog":
        (project / "profiles" / "eng.yaml").write_text(ENG)
    plant(project / rel, kind)
    before = tree(project)
    assert refused(capsys, argv, EXIT_ERROR) == line.format(p=rel, what=PHRASE[kind])
    assert tree(project) == before


@pytest.mark.parametrize("kind", ["fifo", "device", "file", "dangling", "loop"])
def test_a_profiles_folder_that_is_not_a_folder_is_refused_not_read_as_empty(
    capsys: pytest.CaptureFixture[str], project: Path, kind: str
) -> None:
    import shutil

    shutil.rmtree(project / "profiles")
    plant(project / "profiles", kind)
    before = tree(project)
    assert refused(capsys, ["profiles", "list"], EXIT_ERROR) == (
        f"profiles: {PHRASE[kind]}, not a profiles folder; point `profiles` in knobfleet.toml (or KNOBFLEET_HOME) at "
        "a folder of profile files"
    )
    assert tree(project) == before


def test_what_is_absent_is_still_not_found_and_regular_files_still_work(
    capsys: pytest.CaptureFixture[str], project: Path
) -> None:
    assert refused(capsys, ["profiles", "show", "nope"], EXIT_ERROR).startswith("profiles: profile 'nope' not found")
    (project / "profiles" / "child.yaml").write_text(CHILD.replace("extends: parent", "extends: gone"))
    assert "extends: profile 'gone' not found" in refused(capsys, ["profiles", "show", "child"], EXIT_ERROR)
    (project / "profiles" / "child.yaml").write_text(CHILD.replace("extends: parent", "extends: mybase"))
    (project / "catalogs" / "sglang.overlay.yaml").symlink_to(project / "real-overlay.yaml")
    (project / "real-overlay.yaml").write_text("engine: sglang\nknobs: {}\n")  # a symlink to a file: read
    capsys.readouterr()
    assert cli.run(["profiles", "show", "child"]) == EXIT_OK
    assert cli.run(["profiles", "list"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "child" in out and "mybase" in out

"""Path options and output paths, checked before any work. Inputs: regular files only, bounded, opened
non-blocking (a FIFO or a zero device is refused with one line, never read). Outputs: never replace a device, a
FIFO, a directory or a symlink; written by temp file + rename in the same folder.

Every special file here is made by the test in its own temp folder (mkfifo, mknod of a null-like and a zero-like
char device, symlinks): never the machine's own /dev files."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from knobfleet import safefile
from knobfleet.cli import build_parser
from knobfleet.errors import InventoryError, KnobfleetError

NULL_LIKE = os.makedev(1, 3)  # the numbers of /dev/null and /dev/zero; the nodes are our own, in tmp_path
ZERO_LIKE = os.makedev(1, 5)


def fifo(d: Path) -> Path:
    p = d / "fifo"
    os.mkfifo(p)
    return p


def null_dev(d: Path) -> Path:
    p = d / "null"
    os.mknod(p, stat.S_IFCHR | 0o600, NULL_LIKE)
    return p


def zero_dev(d: Path) -> Path:
    p = d / "zero"
    os.mknod(p, stat.S_IFCHR | 0o600, ZERO_LIKE)
    return p


def folder(d: Path) -> Path:
    p = d / "folder"
    p.mkdir()
    return p


def symlink(d: Path) -> Path:
    target = d / "target.txt"
    target.write_text("keep me\n")
    p = d / "link"
    p.symlink_to(target)
    return p


SPECIAL: dict[str, tuple[Callable[[Path], Path], str]] = {
    "fifo": (fifo, "is a FIFO (named pipe)"),
    "null device": (null_dev, "is a character device"),
    "zero device": (zero_dev, "is a character device"),
    "folder": (folder, "is a directory"),
    "symlink": (symlink, "is a symlink"),
}


def snapshot(p: Path) -> tuple[int, int, str | None]:
    st = os.lstat(p)
    return st.st_mode, st.st_rdev, os.readlink(p) if stat.S_ISLNK(st.st_mode) else None


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Parse ``argv`` as the CLI does; it must end in exit 64 with exactly one line on stderr."""
    parser = build_parser()
    with pytest.raises(SystemExit) as info:
        parser.parse_args(argv)
    assert info.value.code == 64
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


OUTPUT_OPTIONS = [
    (["drift", "--prom", "{p}"], "--prom"),
    (["kernel", "bench", "--host", "h", "--out", "{p}"], "--out"),
    (["waves-calibrate", "{ok}", "--store", "{p}"], "--store"),
]


@pytest.mark.parametrize("kind", sorted(set(SPECIAL) - {"folder"}))
@pytest.mark.parametrize(("argv", "option"), OUTPUT_OPTIONS)
def test_output_options_never_replace_a_special_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, argv: list[str], option: str
) -> None:
    make, phrase = SPECIAL[kind]
    p = make(tmp_path)
    ok = tmp_path / "sweep.json"
    ok.write_text("{}")
    before = snapshot(p)
    line = refused([a.replace("{p}", str(p)).replace("{ok}", str(ok)) for a in argv], capsys)
    assert line.endswith(f"{p}: {phrase}; knobfleet never replaces one: name a regular file or a new path"), line
    assert f"argument {option}" in line
    assert snapshot(p) == before


@pytest.mark.parametrize("argv", [["drift", "--prom", "{p}"], ["kernel", "bench", "--host", "h", "--out", "{p}"]])
def test_an_output_option_naming_a_folder_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    line = refused([a.replace("{p}", str(tmp_path)) for a in argv], capsys)
    assert line.endswith(f"{tmp_path}: is a directory; knobfleet never replaces one: name a regular file or a new path")


@pytest.mark.parametrize("kind", ["fifo", "null device", "symlink"])
@pytest.mark.parametrize("argv", [["drift", "--save-probes", "{p}"], ["ab", "a", "b", "--report", "{p}"]])
def test_output_folders_must_be_real_folders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, argv: list[str]
) -> None:
    make, phrase = SPECIAL[kind]
    p = make(tmp_path)
    before = snapshot(p)
    line = refused([a.replace("{p}", str(p)) for a in argv], capsys)
    assert line.endswith(f"{p}: {phrase}; an output folder must be a folder (knobfleet makes it when missing)"), line
    assert snapshot(p) == before


INPUT_OPTIONS = [
    (["drift", "-i", "{p}"], "an inventory must be a regular file or a folder"),
    (["drift", "--vault-password-file", "{p}"], "a vault password file must be a regular file"),
    (["drift", "--vault-id", "prod@{p}"], "a vault password file must be a regular file"),
    (["waves-calibrate", "{p}"], "a sweep file must be a regular file"),
]


@pytest.mark.parametrize("kind", ["fifo", "null device", "zero device"])
@pytest.mark.parametrize(("argv", "fix"), INPUT_OPTIONS)
def test_input_options_refuse_special_files_without_reading_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, argv: list[str], fix: str
) -> None:
    make, phrase = SPECIAL[kind]
    p = make(tmp_path)
    line = refused([a.replace("{p}", str(p)) for a in argv], capsys)
    assert line.endswith(f"{p}: {phrase}; {fix}"), line


def test_an_oversized_input_is_refused_by_its_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    big = tmp_path / "pw"
    with big.open("wb") as fh:
        fh.truncate(65 * 1024)  # sparse: takes no disk
    line = refused(["drift", "--vault-password-file", str(big)], capsys)
    assert line.endswith(f"{big}: is larger than 64 KiB; a vault password file is smaller, check the path")


def test_safefile_reads_are_bounded_even_when_the_size_lies(tmp_path: Path) -> None:
    zero = zero_dev(tmp_path)
    with pytest.raises(safefile.FileRefused, match=r"^is a character device; a file must be a regular file$"):
        safefile.read_bytes(zero, 1024)
    pipe = fifo(tmp_path)
    with pytest.raises(safefile.FileRefused, match=r"^is a FIFO \(named pipe\); a file must be a regular file$"):
        safefile.read_bytes(pipe, 1024)  # non-blocking open: never waits for a writer
    text = tmp_path / "t.txt"
    text.write_bytes(b"caf\xe9")
    with pytest.raises(safefile.FileRefused, match=r"^byte 3: not valid UTF-8; save the file as UTF-8$"):
        safefile.read_text(text, 1024)


@pytest.mark.parametrize("kind", sorted(SPECIAL))
def test_writes_never_replace_a_special_file(tmp_path: Path, kind: str) -> None:
    make, phrase = SPECIAL[kind]
    p = make(tmp_path)
    before = snapshot(p)
    with pytest.raises(KnobfleetError) as info:
        safefile.write_text(p, "new\n")
    assert str(info.value) == (
        f"{p}: {phrase}; knobfleet never replaces one: name a regular file or a new path; nothing was written"
    )
    assert snapshot(p) == before
    assert sorted(x.name for x in tmp_path.iterdir() if x.name.startswith(".")) == []  # no temp file left
    if kind == "symlink":
        assert (tmp_path / "target.txt").read_text() == "keep me\n"


def test_a_regular_output_is_replaced_atomically(tmp_path: Path) -> None:
    out = tmp_path / "drift.prom"
    out.write_text("old\n")
    inode = out.stat().st_ino
    safefile.write_text(out, "new\n", mode=0o640)
    assert out.read_text() == "new\n" and out.stat().st_ino != inode  # a rename, not a rewrite in place
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    assert [x.name for x in tmp_path.iterdir()] == ["drift.prom"]


def test_the_drift_textfile_writer_refuses_a_device(tmp_path: Path) -> None:
    from knobfleet.ops.drift import write_atomic

    dev = null_dev(tmp_path)
    with pytest.raises(KnobfleetError, match="is a character device; knobfleet never replaces one"):
        write_atomic(dev, "x 1\n")
    assert stat.S_ISCHR(os.lstat(dev).st_mode)


@pytest.mark.parametrize(
    ("where", "make", "expected"),
    [
        ("group_vars/all", fifo, "group_vars/all/fifo: is a FIFO (named pipe); inventory files must be regular files"),
        ("host_vars", null_dev, "host_vars/null: is a character device; inventory files must be regular files"),
    ],
)
def test_an_inventory_folder_with_a_special_file_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, make: Callable[[Path], Path], expected: str
) -> None:
    from knobfleet.fleet.inventory import read_hosts

    monkeypatch.chdir(tmp_path)
    inv = tmp_path / "inv"
    (inv / where).mkdir(parents=True)
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    h1: {}\n")
    make(inv / where)
    with pytest.raises(InventoryError) as info:
        read_hosts(inv)
    assert str(info.value) == f"inv: inv/{expected}"


@pytest.mark.parametrize(
    ("name", "body", "expected"),
    [
        (
            "hosts.yml",
            b"all:\n  hosts:\n    caf\xe9: {}\n",
            "hosts.yml: byte 21: not valid UTF-8; save the inventory file as UTF-8",
        ),
        (
            "host_vars/h1.yml",
            b"knob_serve_port: \xff\n",
            "hosts.yml: host_vars/h1.yml: byte 17: not valid UTF-8; save the inventory file as UTF-8",
        ),
    ],
)
def test_a_non_utf8_inventory_or_host_vars_file_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, body: bytes, expected: str
) -> None:
    from knobfleet.fleet.inventory import read_hosts

    monkeypatch.chdir(tmp_path)
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    h1: {}\n")
    (tmp_path / name).write_bytes(body)
    with pytest.raises(InventoryError) as info:
        read_hosts(tmp_path / "hosts.yml")
    assert str(info.value) == expected


def test_a_vault_password_file_from_the_environment_is_checked_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ansible.constants  # noqa: F401 - loaded before the variable is set: Ansible keeps what it first read

    from knobfleet.fleet.inventory import read_hosts

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KNOBFLEET_INVENTORY_CACHE", "0")
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(zero_dev(tmp_path)))
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    h1: {}\n")
    with pytest.raises(InventoryError) as info:
        read_hosts(tmp_path / "hosts.yml")
    assert str(info.value) == (
        f"{tmp_path}/zero: is a character device; a vault password file must be a regular file; "
        "fix --vault-password-file / --vault-id"
    )


@pytest.mark.parametrize("command", [["drift"], ["history"]])
def test_an_inventory_from_the_environment_is_checked_like_i(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    from knobfleet.cli import run

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KNOBFLEET_INVENTORY", str(fifo(tmp_path)))
    assert run(command) == 1
    assert capsys.readouterr().err == "fifo: is a FIFO (named pipe); an inventory must be a regular file or a folder\n"


@pytest.mark.parametrize(
    ("name", "body", "expected"),
    [
        (
            "bad.yml",
            "all:\n  hosts:\n    h1:\n      knob_serve_port: [SECRETVALUE\n",
            "bad.yml: not a YAML or INI inventory Ansible can parse; "
            "check it with `ansible-inventory -i bad.yml --list`",
        ),
        (
            "shadow",
            "root:$6$c2FsdA$SECRETVALUE:19000:0:99999:7:::\n",
            "shadow: no hosts; check the pattern against `ansible-inventory --list`",
        ),
    ],
)
def test_inventory_parse_errors_never_echo_the_file(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    name: str,
    body: str,
    expected: str,
) -> None:
    from knobfleet.fleet.inventory import read_hosts

    monkeypatch.chdir(tmp_path)
    (tmp_path / name).write_text(body)
    with pytest.raises(InventoryError) as info:
        read_hosts(Path(name))
    assert str(info.value) == expected
    out, err = capfd.readouterr()  # Ansible's own warnings (which quote the line) are not printed either
    assert "SECRETVALUE" not in out + err + str(info.value)

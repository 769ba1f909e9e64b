"""What Ansible itself reads for knobfleet is pre-checked (issue 40, cause 7): an ``ANSIBLE_CONFIG`` or an
``ansible.cfg`` that is a FIFO, a device node or a folder is refused with one line before Ansible is imported or
started; an executable vault password file is run by knobfleet, bounded in time and output, and one that never
answers or never stops writing is stopped and refused with one line that holds none of its output. Every node is
one the test makes in its own temp dir (a FIFO, a symlink to a FIFO, a device node made with mknod)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from knobfleet.errors import InventoryError, UsageError
from knobfleet.fleet import ansible_cfg, inventory

REPO = Path(__file__).resolve().parents[3]


def node(tmp_path: Path, kind: str) -> Path:
    p = tmp_path / f"cfg-{kind}"
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "device":
        os.mknod(p, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero's numbers, made here
    elif kind == "symlink-to-fifo":
        os.mkfifo(tmp_path / "fifo-target")
        os.symlink(tmp_path / "fifo-target", p)
    return p


@pytest.mark.parametrize("kind", ["fifo", "device", "symlink-to-fifo"])
def test_an_ansible_config_that_is_not_a_file_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    monkeypatch.setenv("ANSIBLE_CONFIG", str(node(tmp_path, kind)))
    with pytest.raises(UsageError) as exc:
        ansible_cfg.config_file(tmp_path)
    assert "Ansible reads it at start and would hang or fail" in str(exc.value) and "\n" not in str(exc.value)


def test_a_project_ansible_cfg_fifo_is_refused_and_the_command_returns(tmp_path: Path) -> None:
    """The whole command, in a subprocess bounded by a timeout: it answers with one line instead of hanging in
    Ansible's config reader."""
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    a:\n      ansible_host: 127.0.0.1\n")
    os.mkfifo(tmp_path / "ansible.cfg")
    env = {**os.environ, "KNOBFLEET_STATE_DIR": str(tmp_path / "state"), "KNOBFLEET_INVENTORY_CACHE": "0"}
    env.pop("ANSIBLE_CONFIG", None)
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "knobfleet", "render", "ctas512", "-i", str(inv), "--what", "env"],
                         capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)  # fmt: skip
    assert out.returncode != 0 and time.monotonic() - started < 30
    assert "is a FIFO (named pipe); Ansible reads it at start" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def script(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "vault-pass.sh"
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(0o700)
    return p


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("exec sleep 60", "no answer within"),
        ("while :; do echo hunter2hunter2; done", "wrote more than 64 KiB"),
        ("echo hunter2hunter2; exit 3", "exited 3"),
        ("printf ''", "printed an empty password"),
    ],
    ids=["never-answers", "never-stops", "fails", "empty"],
)
def test_a_vault_script_is_bounded_and_its_output_never_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, why: str
) -> None:
    monkeypatch.setattr(inventory, "VAULT_SCRIPT_TIMEOUT_S", 1.0)
    started = time.monotonic()
    with pytest.raises(InventoryError) as exc:
        inventory._run_vault_script(str(script(tmp_path, body)), "default")
    assert why in str(exc.value) and "hunter2" not in str(exc.value) and "\n" not in str(exc.value)
    assert time.monotonic() - started < 10


def test_a_vault_script_that_answers_gives_its_first_line(tmp_path: Path) -> None:
    assert inventory._run_vault_script(str(script(tmp_path, "echo 's3cret pass'")), "default") == b"s3cret pass"
    client = tmp_path / "pw-client.sh"
    client.write_text('#!/bin/sh\n[ "$1" = --vault-id ] && echo "for-$2"\n')
    client.chmod(0o700)
    assert inventory._run_vault_script(str(client), "prod") == b"for-prod"

"""knobfleet.lab.hostfiles: which lab holds a lab host's address, and what the operator is told to do about it
(data-driven); tests/unit/lab/test_neighbours.py finds it among this machine's processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from knobfleet.lab import hostfiles

NSPAWN = b"/usr/bin/systemd-nspawn"


@pytest.mark.parametrize(
    ("cmdline", "expected"),
    [
        ([NSPAWN, b"--boot", b"--directory=/w/a/.state/lab/hosts/lab2/root", b"--machine=knobfleet-lab2"],
         ("knobfleet-lab2", Path("/w/a/.state/lab"))),
        ([b"systemd-nspawn", b"--machine=knobfleet-lab20", b"--directory=/tmp/s/lab/hosts/lab20/root"],
         ("knobfleet-lab20", Path("/tmp/s/lab"))),
        ([NSPAWN, b"--directory=/srv/containers/web", b"--machine=knobfleet-lab2"], None),  # not a lab's layout
        ([b"/usr/bin/python3", b"--machine=knobfleet-lab2", b"--directory=/w/.state/lab/hosts/lab2/root"], None),
        ([NSPAWN, b"--machine=knobfleet-lab2"], None),  # no --directory
        ([NSPAWN, b"--directory=/w/a/.state/lab/hosts/lab2/root"], None),  # no machine name
        ([], None),  # a kernel thread's empty cmdline
    ],
)  # fmt: skip
def test_the_lab_running_a_machine_is_read_from_its_nspawn_argv(
    cmdline: list[bytes], expected: tuple[str, Path] | None
) -> None:
    assert hostfiles.lab_running(cmdline) == expected


@pytest.mark.parametrize(
    ("holder", "says"),
    [
        (Path("/work/main/.state/lab"), "127.0.1.1:22 is taken by the lab of another checkout (/work/main/.state/lab); "
         "stop it with `KNOBFLEET_STATE_DIR=/work/main/.state knobfleet lab down` (or `knobfleet lab down` in that "
         "checkout)"),
        (None, "127.0.1.1:22 is already taken by another process; free it (ss -ltnp 'sport = :22') or stop that "
         "service"),
    ],
)  # fmt: skip
def test_a_taken_address_names_what_to_stop(holder: Path | None, says: str) -> None:
    assert hostfiles.port_taken("127.0.1.1", holder) == says

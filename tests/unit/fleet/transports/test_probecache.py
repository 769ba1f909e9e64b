"""The controller's half of the probe cache, through the real ssh transport with a stand-in ssh that runs the remote
command with the local bash (a temp state root on this machine; no network)."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from knobfleet import paths
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.transports import base, probecache
from knobfleet.fleet.transports import ssh as transport
from knobfleet.fleet.transports.base import bundle
from knobfleet.fleet.transports.sshrun import FunctionRun
from knobfleet.fleet.transports.sshsession import Sessions

SOURCE = b"from ansible.module_utils.knob_fs import split\ndef f(a):\n    return {'a': a, 's': split('/x/y')}\n"


@pytest.fixture
def host(tmp_path: Path) -> HostVars:
    exe = tmp_path / "fake-ssh"
    exe.write_text('#!/bin/bash\nexec bash -c "${@: -1}"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    py = os.path.realpath(sys.executable)
    return HostVars(
        host="h1", address="h1", connection={"ansible_ssh_executable": str(exe), "ansible_python_interpreter": py}
    )


def probe(host: HostVars, tmp_path: Path, known: probecache.Known) -> base.Outcome:
    state = tmp_path / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    payload = bundle(SOURCE, paths.module_utils_dir(), {"secret_key": "k"})
    args = {"h1": {"state_dir": f"{state}/svc"}}
    roots = {"h1": probecache.root_of(args["h1"]) or ""}
    return transport.run_function(
        [host], FunctionRun(tmp_path / "cp", payload, "m", "f", args, cache_roots=roots, known=known)
    )["h1"]


def test_root_of() -> None:
    assert probecache.root_of({"state_dir": "/var/lib/knobfleet/svc"}) == "/var/lib/knobfleet/.probe"
    assert probecache.root_of({"state_dir": "/srv/kf/svc/"}) == "/srv/kf/.probe"
    for bad in ({}, {"state_dir": "svc"}, {"state_dir": "/svc"}, {"state_dir": "/a/../svc"}):
        assert probecache.root_of(bad) is None


def test_event_lines() -> None:
    mark = probecache.MARK
    assert probecache.event(f"noise\n{mark} hit {'a' * 64}\n".encode()) == probecache.Event("hit", "a" * 64)
    assert probecache.event(f"{mark} replaced {'b' * 64} entry x: bad\n".encode()) == probecache.Event(
        "replaced", "b" * 64, "entry x: bad"
    )
    assert probecache.event(f"{mark} miss no entry\n".encode()) == probecache.Event("miss", "", "no entry")
    assert probecache.event(b"Traceback\n") is None


def test_the_bundle_goes_once_then_only_its_digest_and_a_lost_entry_costs_one_resend(
    host: HostVars, tmp_path: Path
) -> None:
    known = probecache.Known(tmp_path / "known")
    first = probe(host, tmp_path, known)
    assert first.cache == "stored" and first.doc == {
        "a": {"state_dir": f"{tmp_path}/state/svc", "secret_key": "k"},
        "s": ["/x", "y"],
    }
    (entry,) = (tmp_path / "state" / ".probe").iterdir()
    second = probe(host, tmp_path, known)
    assert (second.cache, second.doc) == ("hit", first.doc)
    entry.unlink()  # the host lost it: the digest-only call misses and the bundle follows at once
    third = probe(host, tmp_path, known)
    assert (third.cache, third.doc) == ("stored", first.doc)
    assert probe(host, tmp_path, known).cache == "hit"


def test_the_short_payload_carries_only_the_private_options() -> None:
    payload = bundle(SOURCE, paths.module_utils_dir(), {"secret_key": "k"})
    assert probecache.short_payload(payload) == b'{"args": {"secret_key": "k"}}'
    assert probecache.bundle_digest(payload) == probecache.bundle_digest(bundle(SOURCE, paths.module_utils_dir()))


PID_SOURCE = b"import os\ndef f(a):\n    return {'a': a, 'pid': os.getpid()}\n"


def ask(host: HostVars, tmp_path: Path, known: probecache.Known, kept: Any = None) -> base.Outcome:
    state = tmp_path / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    payload = bundle(PID_SOURCE, paths.module_utils_dir(), {"secret_key": "k"})
    args = {"h1": {"state_dir": f"{state}/svc"}}
    roots = {"h1": probecache.root_of(args["h1"]) or ""}
    got = transport.run_function(
        [host],
        FunctionRun(tmp_path / "cp", payload, "m", "f", args, cache_roots=roots, known=known, sessions=kept),
    )
    return got["h1"]


def test_a_kept_session_answers_repeated_calls_from_one_interpreter_and_a_dead_one_is_replaced(
    host: HostVars, tmp_path: Path
) -> None:
    known = probecache.Known(tmp_path / "known")
    kept = Sessions()
    try:
        first = ask(host, tmp_path, known, kept)  # the entry is not known yet: stored the usual way
        assert first.cache == "stored" and first.doc is not None
        second = ask(host, tmp_path, known, kept)
        third = ask(host, tmp_path, known, kept)
        assert (second.cache, third.cache) == ("session", "session")
        assert second.doc is not None and third.doc is not None
        assert second.doc["pid"] == third.doc["pid"] != first.doc["pid"]  # one interpreter for both
        assert second.doc["a"] == first.doc["a"]  # the same options, the private one included
        os.kill(second.doc["pid"], 9)  # the host's side dies: that call runs the usual way
        fourth = ask(host, tmp_path, known, kept)
        assert fourth.cache == "hit" and fourth.doc is not None and fourth.doc["a"] == first.doc["a"]
        fifth = ask(host, tmp_path, known, kept)  # and the next one has a new session
        assert fifth.cache == "session" and fifth.doc is not None and fifth.doc["pid"] != second.doc["pid"]
        assert ask(host, tmp_path, known).cache == "hit"  # without a pool: as before
        assert kept.close_all() == 1  # the fifth call's session, still open
    finally:
        kept.close_all()


def test_past_the_bound_on_kept_sessions_a_host_is_asked_the_one_shot_way(host: HostVars, tmp_path: Path) -> None:
    known = probecache.Known(tmp_path / "known")
    kept = Sessions(max_open=0)
    try:
        assert ask(host, tmp_path, known, kept).cache == "stored"
        assert ask(host, tmp_path, known, kept).cache == "hit"  # no session could be kept
    finally:
        assert kept.close_all() == 0


def test_two_versions_against_the_same_host_each_keep_their_entry(host: HostVars, tmp_path: Path) -> None:
    known = probecache.Known(tmp_path / "known")
    assert probe(host, tmp_path, known).cache == "stored"
    other = SOURCE.replace(b"'s': split", b"'v': 2, 's': split")  # another knobfleet's probe
    state = tmp_path / "state"
    payload = bundle(other, paths.module_utils_dir(), {"secret_key": "k"})
    args = {"h1": {"state_dir": f"{state}/svc"}}
    roots = {"h1": probecache.root_of(args["h1"]) or ""}

    def probe_other() -> base.Outcome:
        return transport.run_function(
            [host], FunctionRun(tmp_path / "cp", payload, "m", "f", args, cache_roots=roots, known=known)
        )["h1"]

    assert probe_other().cache == "stored"
    for _ in range(2):  # alternating: each is a hit, neither resends its bundle
        assert (probe(host, tmp_path, known).cache, probe_other().cache) == ("hit", "hit")

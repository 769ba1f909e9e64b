"""sshcalls.mux_plans: what the head start's record says of each host's ControlMaster. ``ssh -G`` is asked only for
hosts whose argv or ssh config changed since the record was written (here a stand-in ``ssh`` that logs each call
and answers as ``ssh -G`` does)."""

from __future__ import annotations

from pathlib import Path

from knobfleet.fleet.transports.sshcalls import mux_plans

G = "controlpath /cp/{host}\nsendenv LANG\nrequesttty auto\nforwardagent no\n"


def stand_in(tmp_path: Path) -> tuple[Path, Path]:
    log = tmp_path / "calls"
    ssh = tmp_path / "ssh"
    host_is_last = 'for a; do h="$a"; done'
    ssh.write_text(
        f'#!/bin/sh\n{host_is_last}\necho "$h" >> {log}\n'
        f'[ "$h" = "tty" ] && printf "controlpath /cp/tty\\nrequesttty force\\n" && exit 0\n'
        f'printf "{G}" | sed "s/{{host}}/$h/"\n'
    )
    ssh.chmod(0o755)
    return ssh, log


def test_ssh_g_is_asked_once_per_changed_host_and_its_answer_kept(tmp_path: Path) -> None:
    ssh, log = stand_in(tmp_path)
    conf = tmp_path / "config"
    conf.write_text("Host *\n")

    def argv(host: str) -> list[str]:
        return [str(ssh), "-F", str(conf), "-o", "BatchMode=yes", host, "python3 -I -S -c BOOT"]

    plan = {h: (argv(h), False) for h in ("a", "b", "tty")}
    stamp, got = mux_plans(plan, None)
    assert got == {"a": ("/cp/a", ["LANG"], []), "b": ("/cp/b", ["LANG"], [])}  # tty: ssh would ask for a TTY
    assert sorted(log.read_text().split()) == ["a", "b", "tty"]
    record = {
        "pairs": [[h, a, f] for h, (a, f) in plan.items()],
        "stamp": stamp,
        "mux": {h: list(w) for h, w in got.items()},
    }
    log.write_text("")
    assert mux_plans(plan, record) == (stamp, got) and log.read_text() == ""  # nothing changed: nothing asked
    plan["b"] = (argv("b2"), True)
    stamp2, got2 = mux_plans(plan, record)
    assert log.read_text().split() == ["b2"] and got2["b"] == ("/cp/b2", ["LANG"], []) and got2["a"] == got["a"]
    log.write_text("")
    conf.write_text("Host *\n  Port 2222\n")  # the config changed: every host is asked again
    stamp3, _ = mux_plans(plan, {**record, "stamp": stamp2})
    assert stamp3 != stamp2 and sorted(log.read_text().split()) == ["a", "b2", "tty"]


def test_no_hosts_no_question() -> None:
    assert mux_plans({}, None) == ("", {})

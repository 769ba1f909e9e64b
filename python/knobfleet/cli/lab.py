"""``lab up|down|status|ssh``: the embedded fleet of nspawn hosts."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TYPE_CHECKING

from knobfleet import argtypes
from knobfleet.cli.common import Sub
from knobfleet.errors import EXIT_OK, KnobfleetError

if TYPE_CHECKING:
    from knobfleet.lab.nspawn import Lab


def _out(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _notes(notes: list[str]) -> None:
    for note in notes:
        sys.stderr.write(f"{note}\n")


def paths_display(path: object) -> str:
    from pathlib import Path

    from knobfleet import paths

    return paths.display(Path(str(path)))


def _lab(args: argparse.Namespace) -> Lab:
    """The lab a ``lab`` subcommand acts on: --id's, else the one the command means (``labid.selected``)."""
    from knobfleet import labid, paths
    from knobfleet.lab.nspawn import Lab

    lab_id = getattr(args, "id", None)
    return Lab(labid.lab_dir(paths.state_dir(), labid.valid_id(lab_id))) if lab_id else Lab()


def cmd_lab_up(args: argparse.Namespace) -> int:
    from knobfleet import labid, paths, report_text
    from knobfleet.lab import slots
    from knobfleet.lab.nspawn import Lab

    lab = _lab(args) if args.id else Lab(slots.for_up(paths.state_dir()))
    started = time.monotonic()
    vllm = tuple(h for h in (args.vllm or "").split(",") if h)
    sglang = tuple(h for h in (args.sglang or "").split(",") if h)
    try:
        hosts = lab.up(
            args.n, vllm, router=args.router or False, group_size=args.groups, sglang=sglang, runtime=args.runtime
        )
    finally:
        _notes(lab.notes)
    took = time.monotonic() - started
    from knobfleet.ops.fleet import default_inventory

    used = default_inventory() if lab.identity.slot == 0 else lab.dir / "inventory"
    _out(
        report_text.table(
            ["host", "address", "state", "pid"], [[h.name, h.address, h.state, h.pid or "-"] for h in hosts]
        )
    )
    if args.monitoring:
        from knobfleet.lab import monitoring
        from knobfleet.telemetry.promconfig import Target

        extra = []
        if args.router:  # the router's own metrics (smg_*: requests, errors, worker health)
            from knobfleet.lab.router_lab import LabRouter

            extra.append(Target("router", LabRouter(lab.dir).metrics_address, "router"))
        url = monitoring.start_for_lab(lab, extra)
        _out(
            f"lab: Prometheus {url} (node_exporter on each host; drift textfile: "
            f"`knobfleet drift --prom {paths_display(monitoring.textfile_dir(lab.dir) / 'knobfleet.prom')}`)"
        )
    _out(
        f"lab: {sum(h.state == 'running' for h in hosts)} host(s) answering SSH after {took:.1f}s; "
        f"inventory: {paths_display(used)} (the default of every command while this lab runs)"
    )
    if lab.identity.id != labid.DEFAULT_ID:
        _out(
            f"lab: id {lab.identity.id}, at {lab.identity.addresses(len(hosts))}; commands use it while it is the "
            f"only lab of this checkout that runs, or with {labid.ENV}={lab.identity.id} (`lab down --id "
            f"{lab.identity.id}` stops it)"
        )
    if args.router:
        from knobfleet.lab.router_lab import LabRouter

        info = LabRouter(lab.dir).info()
        _out(
            f"router: {info.url} in front of {len(info.workers)} engine(s); metrics {info.metrics_url}; log {info.log}"
        )
    return EXIT_OK


def cmd_lab_down(args: argparse.Namespace) -> int:
    from knobfleet import labid, paths
    from knobfleet.lab.nspawn import Lab

    every = [Lab(folder) for _, folder in labid.ids(paths.state_dir()) if folder.is_dir()] if args.all else []
    labs = every if args.all else [_lab(args)]
    for lab in labs:
        stopped = lab.down()
        _notes(lab.notes)
        which = "" if lab.identity.id == labid.DEFAULT_ID and not args.all else f" {lab.identity.id}"
        _out(f"lab{which}: stopped {len(stopped)} host(s){': ' + ', '.join(stopped) if stopped else ''}")
    return EXIT_OK


def cmd_lab_status(args: argparse.Namespace) -> int:
    from knobfleet import report_text

    lab = _lab(args)
    hosts = lab.status()
    services = lab.services()
    speeds = {h.name: lab.host_speed(h.name) for h in hosts if h.state == "running"}
    if args.json:
        _out(
            report_text.to_json(
                {
                    "lab": {**lab.identity.as_json(), "dir": str(lab.dir)},
                    "services": [s.as_json() for s in services],
                    "hosts": [
                        {
                            "name": h.name,
                            "address": h.address,
                            "ssh_port": 22,
                            "ssh_user": "root",
                            "ssh_key": str(lab.key),
                            "known_hosts": str(lab.known_hosts),
                            "state": h.state,
                            "speed": speeds.get(h.name),
                        }
                        for h in hosts
                    ],
                }
            )
        )
    elif hosts:
        _out(
            report_text.table(
                ["host", "address", "state", "pid", "speed"],
                [
                    [h.name, h.address, h.state, h.pid or "-", f"{speeds[h.name]:g}" if h.name in speeds else "-"]
                    for h in hosts
                ],
            )
        )
        if services:
            _out(
                report_text.table(
                    ["service", "url", "state", "pid", "detail"],
                    [[s.name, s.url, s.state, s.pid or "-", s.detail] for s in services],
                )
            )
    else:
        _out("lab: no hosts; boot them with `knobfleet lab up -n 3`")
    return EXIT_OK


def cmd_lab_speed(args: argparse.Namespace) -> int:
    lab = _lab(args)
    factor = lab.set_host_speed(args.host, args.factor)
    how = "as fast as the others" if factor == 1.0 else f"{abs(1 - factor):.0%} {'slower' if factor < 1 else 'faster'}"
    _out(f"lab: {args.host} runs at speed {factor:g} ({how}); its engine reads it within a second, no restart")
    return EXIT_OK


def cmd_lab_ssh(args: argparse.Namespace) -> int:
    name: str = args.host
    if not (name.startswith("lab") and name[3:].isdigit()):
        raise KnobfleetError(f"lab ssh: {name!r} is not a lab host; use lab1, lab2, …")
    lab = _lab(args)
    host = lab.named(name)
    if lab.pid(host) is None:
        raise KnobfleetError(f"lab ssh: {name} is not running; `knobfleet lab up` first")
    command = [c for c in args.command if c != "--"]
    argv = lab.ssh_argv(host, command)
    os.execvp(argv[0], argv)
    return EXIT_OK  # pragma: no cover


def _id_opt(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--id", metavar="NAME", default=None, help=f"lab id: {what} ($KNOBFLEET_LAB also names one)")


def register(sub: Sub[argparse.ArgumentParser]) -> None:
    lab = sub.add_parser("lab", help="the embedded fleet of nspawn hosts")
    lsub = lab.add_subparsers(dest="lab_command", metavar="SUBCOMMAND", required=True)
    p = lsub.add_parser("up", help="boot lab1..labN (idempotent)")
    p.add_argument("-n", type=argtypes.integer(1, 64), default=3, help="number of hosts (default 3)")
    p.add_argument(
        "--vllm",
        default=None,
        metavar="HOSTS",
        help="hosts that run real vLLM (CPU build, tiny local model) instead of the stand-in, e.g. lab3 "
        "(installs vLLM once into /var/cache/knobfleet: ~2 min, 3.4 GB)",
    )
    p.add_argument(
        "--sglang",
        default=None,
        metavar="HOSTS",
        help="hosts that run real SGLang 0.5.23 (CPU path, tiny local model) instead of the stand-in, e.g. lab1 "
        "(installs SGLang once into /var/cache/knobfleet: ~3 min, 6.4 GB; ~3 GiB of memory per host)",
    )
    p.add_argument(
        "--router",
        nargs="?",
        const="sglang-router",
        default=None,
        choices=("sglang-router", "smg"),
        metavar="KIND",
        help="start a router on 127.0.0.1 only, in front of every host's engine: sglang-router (0.3.2, the default) "
        "or smg (SMG 1.13, what SGLang users run today); installed once into /var/cache/knobfleet",
    )
    p.add_argument(
        "--runtime",
        default="systemd",
        choices=("systemd", "podman", "docker"),
        help="what runs each stand-in engine, and real SGLang (--sglang): systemd (the serve script execs it, the "
        "default), podman or docker (a container of a local image, built from files and loaded at boot, started by "
        "a hand-written `podman run` or `docker run` unit; real SGLang's cached install is mounted read-only; "
        "nothing is pulled; docker hosts boot with CAP_NET_ADMIN, see docs/CONTAINERS.md)",
    )
    p.add_argument(
        "--groups",
        type=argtypes.integer(2, 64),
        default=0,
        metavar="N",
        help="run the stand-in as multi-node engines of N consecutive hosts each (lab1+lab2 = lab-g1, ...), declared "
        "in the lab inventory's knob_engine_groups",
    )
    p.add_argument(
        "--monitoring",
        action="store_true",
        help="also start Prometheus on 127.0.0.1:19090 (the default lab's; other labs move it by 100 a slot), "
        "scraping every engine, node_exporter on each host and the controller's drift textfile, with the shipped "
        "alert rules",
    )
    _id_opt(p, "start the lab of that name beside any other (its own addresses, machines, ports and inventory); "
            "default: the default lab (lab1..N at 127.0.1.N) when it is free, else the first free one")  # fmt: skip
    p.set_defaults(func=cmd_lab_up)
    p = lsub.add_parser("down", help="stop every lab host; leave no mounts or processes")
    _id_opt(p, "the lab to stop (default: this checkout's running lab)")
    p.add_argument("--all", action="store_true", help="stop every lab this checkout started")
    p.set_defaults(func=cmd_lab_down)
    p = lsub.add_parser("status", help="lab hosts and their state")
    _id_opt(p, "the lab to show (default: this checkout's running lab)")
    p.add_argument("--json", action="store_true", help="print one JSON document and nothing else")
    p.set_defaults(func=cmd_lab_status)
    p = lsub.add_parser(
        "speed",
        help="make a lab host's engine slower (or faster) by a fixed factor, outside anything knobfleet manages "
        "(the way one GPU of a SKU runs slower): 0.92 = 8%% slower, 1 = as the others",
    )
    p.add_argument("host", help="lab1, lab2, … (a running host of this lab)")
    p.add_argument("factor", type=argtypes.number(0.1, 10.0), help="relative speed, 0.1 to 10 (1 = reset)")
    _id_opt(p, "the lab of that host (default: this checkout's running lab)")
    p.set_defaults(func=cmd_lab_speed)
    p = lsub.add_parser("ssh", help="ssh into a lab host (strict host keys)")
    p.add_argument("host", help="lab1, lab2, …")
    _id_opt(p, "the lab of that host (default: this checkout's running lab)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="command to run there (default: a shell)")
    p.set_defaults(func=cmd_lab_ssh)

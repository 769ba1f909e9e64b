"""``knobfleet tune SPACE``: a knob space to production in stages (model, kernel, engine, live), with a record
that ``--resume`` continues from, and an HTML report of every stage."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from knobfleet import argtypes
from knobfleet.cli import common
from knobfleet.cli.common import Sub, inventory_opts
from knobfleet.cli.common import out as _out
from knobfleet.errors import EXIT_DRIFT, EXIT_ERROR, EXIT_OK

if TYPE_CHECKING:
    from knobfleet.profiles.model import Profile
    from knobfleet.profiles.store import ProfileStore
    from knobfleet.tune.space import Space
    from knobfleet.waves import Calibration


def load_space(path: Path):  # type: ignore[no-untyped-def]
    from knobfleet import paths, safefile
    from knobfleet.profiles import safeyaml
    from knobfleet.tune.space import SpaceError, parse

    try:  # read once, bounded and non-blocking (a FIFO or device there is refused unread); parsed and hashed
        text = safefile.read_text(path, safeyaml.MAX_BYTES, "SPACE file")
        doc = safeyaml.loads(text)
    except (safefile.FileRefused, safeyaml.YamlProblem) as exc:
        raise SpaceError([f"{paths.display(path)}: {exc}"]) from None
    return parse(doc, path, text)


def cmd_tune(args: argparse.Namespace) -> int:
    from knobfleet.tune import owner, run

    sp = load_space(Path(args.space))
    st, base, inventory, names = _base_and_hosts(sp, args)
    path = run.record_path(sp)
    with owner.owned(path, sp.name):  # one run of a campaign at a time: a second shell's is refused, naming this one
        return _campaign(args, sp, st, base, inventory, names, path)


def _campaign(
    args: argparse.Namespace, sp: Space, st: ProfileStore, base: Profile, inventory: Path, names: list[str], path: Path
) -> int:
    """The campaign, its record at ``path`` (new, or continued with --resume), run while this process owns it."""
    from knobfleet import paths, report_text
    from knobfleet.experiment import records
    from knobfleet.ops import interrupts
    from knobfleet.tune import run
    from knobfleet.tune.stages import HostStages

    existing = _record_before(sp, path, args.resume)
    sms, cal, note = _model_gpu(sp)
    live = "canary" if sp.live.skip is None else "rollout"
    common.confirm(
        "tune",
        f"Run campaign {sp.name}: A/B candidates against {base.ref} on {sp.engine.host}, then take the winner "
        f"live through the {live}?",
        len(names),
        args,
    )

    def step(message: str) -> None:
        if not args.json:
            sys.stderr.write(f"tune {sp.name}: {message}\n")

    stages = HostStages(sp, inventory)
    c = run.Campaign(
        sp,
        base,
        stages,
        path,
        sms,
        cal,
        note,
        write_profile=run.write_profile_file(st.directory),
        resolve=lambda name: st.resolve(name),
        on_step=step,
    )
    if args.resume and existing is not None and existing.get("status") != "done":
        c.load(existing)
    else:
        if existing is not None:  # a finished campaign of the same name: kept, next to the new one
            path.rename(path.with_name(f"{path.stem}-{int(existing.get('started') or 0)}.json"))
        c.new_record()
    try:
        with interrupts.handled():
            doc = c.run()
    finally:
        if args.report is not None and path.exists():
            from knobfleet.cli.report import write_html

            write_html(records.read(path), args.report, "tune")
    if args.json:
        _out(report_text.to_json(doc))
    else:
        _out(render(doc))
        _out(f"record: {paths.display(path)}")
    verdict = (doc.get("decision") or {}).get("verdict")
    return EXIT_OK if verdict in ("promote", "keep", "advisory") else EXIT_DRIFT if verdict else EXIT_ERROR


def _base_and_hosts(sp: Space, args: argparse.Namespace) -> tuple[ProfileStore, Profile, Path, list[str]]:
    """The profile store, the space's base profile (its knobs checked against the base's catalog), the inventory and
    its hosts, among which the space's engine and kernel hosts must be."""
    from knobfleet import paths
    from knobfleet.ops import fleet
    from knobfleet.ops import profiles as app
    from knobfleet.profiles import catalog as catalogs
    from knobfleet.tune import space

    st = app.store()
    base = st.resolve(sp.base)
    cat = catalogs.catalog_for(base.engine, st.catalog_dir, base.validated_on)
    space.check_against(sp, cat)
    inventory = common.inventory(args)
    names = [h.host for h in fleet.hosts(inventory, None)]
    for key, host in (("stages.engine.host", sp.engine.host), ("stages.kernel.host", sp.kernel.host)):
        if host is not None and host not in names:
            raise space.SpaceError(
                [f"{paths.display(Path(sp.path))}: {key}: {host!r} is not in the inventory ({', '.join(names)})"]
            )
    _live_preconditions(sp, fleet.hosts(inventory, None))
    return st, base, inventory, names


def _live_preconditions(sp: Space, hosts: list[Any]) -> None:
    """What the live stage needs, checked before the first stage runs (the canary's own split: a router in front of
    every host, enough hosts for canaries and baseline): SpaceError in one line naming the SPACE's field and fix."""
    from knobfleet import paths
    from knobfleet.errors import UsageError
    from knobfleet.experiment.canary_hosts import split
    from knobfleet.experiment.canary_run import CanaryOptions
    from knobfleet.tune import space

    if sp.live.skip is not None:
        return
    try:
        split(hosts, CanaryOptions(hosts=sp.live.hosts))
    except UsageError as exc:
        raise space.SpaceError(
            [f"{paths.display(Path(sp.path))}: stages.live: {exc}; the live stage would stop there after the model "
             "and engine stages: give the hosts a router, or set stages.live.skip: \"why\" to promote through the "
             "rollout"]
        ) from None  # fmt: skip


def _record_before(sp: Space, path: Path, resume: bool) -> dict[str, Any] | None:
    """The campaign's record from an earlier run, if any: an unfinished one is continued only with --resume, and
    --resume needs one."""
    from knobfleet import paths
    from knobfleet.experiment import records
    from knobfleet.tune import run

    existing = None
    if path.exists():
        existing = records.read(path)
        if not resume and existing.get("status") != "done":
            raise run.TuneError(
                f"{paths.display(path)}: campaign {sp.name} is {existing.get('status')}; continue it with "
                "`knobfleet tune SPACE --resume`, or remove the record to start over"
            )
    elif resume:
        raise run.TuneError(f"{paths.display(path)}: no campaign {sp.name} to resume; run without --resume")
    return existing


def _model_gpu(sp: Space) -> tuple[int, Calibration | None, str]:
    """The model stage's GPU: its SM count (the stored calibration's, else gpus.json's), the calibration and the line
    that says which."""
    from knobfleet import waves
    from knobfleet.kernel.commands import calibration_line

    gpus = waves.load_gpus()
    cal, note = calibration_line(sp.model.gpu, None)
    sms = cal.sms if cal is not None else gpus[sp.model.gpu]
    return sms, cal, note


def render(doc: dict[str, object]) -> str:
    from knobfleet.tune.report import summary_lines

    return "\n".join(summary_lines(doc))


def register(sub: Sub[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "tune",
        help="a knob space to production: model, kernel, engine A/B and canary stages, resumable (--resume)",
    )
    p.add_argument("space", help="the SPACE file (YAML): base profile, knobs, traffic, budget, stages")
    inventory_opts(p, limit=False)
    p.add_argument("--resume", action="store_true", help="continue the campaign of this SPACE where it stopped")
    p.add_argument(
        "--report", type=argtypes.html_file, default=None, metavar="FILE.html",
        help="write every stage as one self-contained HTML page (checked before anything runs)",
    )  # fmt: skip
    common.json_opt(p)
    common.yes_opt(p)
    p.set_defaults(func=cmd_tune)

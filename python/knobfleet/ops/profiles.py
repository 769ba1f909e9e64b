"""Use cases on profiles: resolve and validate them, their JSON schema, and what they render to on hosts.
Each function takes plain arguments, returns data for ``report``, and raises ``KnobfleetError`` subclasses; the
CLI maps those to exit codes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from knobfleet.errors import ProfileError
from knobfleet.profiles.model import Profile, ProfileDoc
from knobfleet.profiles.store import ProfileStore

if TYPE_CHECKING:  # jinja2 (render) costs ~50 ms to import; drift and verify never render
    from knobfleet.render import Rendered


def store() -> ProfileStore:
    return ProfileStore()


@dataclass(frozen=True)
class Validation:
    ok: list[Profile]
    unlocked: list[str]


def validate_profiles(names: list[str]) -> Validation:
    """Resolve every named profile (all when none named); collect every problem before failing."""
    st = store()
    targets = names or st.names()
    ok: list[Profile] = []
    problems: list[str] = []
    for name in targets:
        try:
            ok.append(st.resolve(name))
        except ProfileError as exc:
            problems.extend(p for p in exc.problems if p not in problems)
    if problems:
        raise ProfileError(problems)
    lock = st.read_lock()
    return Validation(ok, [p.ref for p in ok if p.ref not in lock])


def profile_schema() -> dict[str, Any]:
    return ProfileDoc.model_json_schema()


def render(profile_name: str, inventory: Path | None, host: str | None) -> list[Rendered]:
    profile = store().resolve(profile_name)
    from knobfleet.fleet.fleetkey import fleet_key
    from knobfleet.render import render_host

    key = fleet_key()
    return [render_host(profile, hv, secret_key=key) for hv in _hosts(inventory, host)]


def _hosts(inventory: Path | None, limit: str | None) -> list[Any]:
    from knobfleet.ops.fleet import hosts

    return hosts(inventory, limit)


def render_vars(profile_name: str, inventory: Path | None = None) -> str:
    """``render --what vars``: the profile and its engine as the role's extra vars (YAML, strings !unsafe), and
    with ``inventory``, its engine groups' per-rank vars (``knob_serve_groups``: what knobfleet passes to the role
    so that each rank renders its own --node-rank), so a plain ``ansible-playbook -e @FILE`` renders every host
    as ``apply`` would."""
    from knobfleet.engines.adapter import engine
    from knobfleet.fleet.runner import dump_vars
    from knobfleet.render import profile_vars

    profile = store().resolve(profile_name)
    adapter = engine(profile.engine)
    unsafe: dict[str, Any] = {"knob_serve_profile": profile_vars(profile), "knob_serve_engine": adapter.role_vars()}
    if inventory is not None:
        from knobfleet.ops import ranks

        groups = ranks.of(_hosts(inventory, None))
        if groups:
            unsafe["knob_serve_groups"] = ranks.role_vars(groups, adapter.name)
    return dump_vars({}, unsafe)


def rendered_json(r: Rendered) -> dict[str, Any]:
    from knobfleet.module_utils.knob_redact import shown_digest

    return {
        "host": r.host,
        "script_sha256": shown_digest(r.script_sha256, r.script_shown != r.script, r.secret_key),
        "unit_sha256": shown_digest(r.unit_sha256, r.unit_shown != r.unit, r.secret_key),
        "env": r.env_shown,
        "argv": r.argv_shown,
    }


@dataclass(frozen=True)
class MigrateResult:
    """``profiles migrate``: the profile file, its version before and after (equal: nothing changed), the knobs
    that moved (renamed or removed), and the one-line summary."""

    path: Path
    engine: str
    target: str
    before: int
    after: int
    moves: list[Any]
    summary: str

    def as_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path), "engine": self.engine, "target": self.target, "before": self.before,
            "after": self.after, "changed": self.after != self.before,
            "moves": [{"section": m.section, "name": m.name, "new_name": m.new_name, "note": m.note,
                       "inherited": m.inherited} for m in self.moves],
            "summary": self.summary,
        }  # fmt: skip


def parse_target(text: str) -> tuple[str, str]:
    """``ENGINE@VERSION`` -> (engine, version); a bad one is a UsageError naming the form."""
    from knobfleet.errors import UsageError

    engine, at, version = text.partition("@")
    if not at or not engine or not version:
        raise UsageError(f"--to {text!r}: expected ENGINE@VERSION, e.g. vllm@0.32.0")
    return engine, version


def migrate(name: str, to: str, *, write: bool = True, source: str | None = None) -> MigrateResult:
    """Write the next version of profile ``name`` for the engine version ``to`` (``ENGINE@VERSION``): renamed
    knobs under their new names, removed ones left out with a comment (and listed), ``fingerprint.engine_version``
    set. The new text is validated against the target's catalog before the file is replaced; any problem changes
    nothing. ``source``: the version the profile is valid on (default: its fingerprint's, else the pinned one)."""
    import shutil
    import tempfile

    from knobfleet import paths, safefile
    from knobfleet.errors import UsageError
    from knobfleet.profiles import catalog as catalogs
    from knobfleet.profiles import hostversion, versions

    engine, version = parse_target(to)
    st = store()
    chain = st.chain(name)
    leaf_path, leaf = chain[-1]
    try:
        current = st.resolve(name, check_lock=False, engine_version=source)  # on the version it targets now
    except ProfileError:
        if source is not None:
            raise
        current = _valid_somewhere(st, name, engine)  # the newest synced version it is valid on, else the error
    if current.engine != engine:
        raise UsageError(f"{paths.display(leaf_path)}: engine: {leaf.name} is a {current.engine} profile, not "
                         f"{engine}; use --to {current.engine}@VERSION")  # fmt: skip
    target = catalogs.catalog_for(engine, st.catalog_dir, version)
    profile = current
    label = f"{engine} {target.version or version}"
    targets = hostversion.parse_version(profile.fingerprint.engine_version) == (target.version or version) and (
        profile.engine_version in (None, target.version or version)
    )
    moves = versions.moves_for(profile, target, set(leaf.env), {k.removeprefix("--") for k in leaf.args})
    if targets and not moves:
        return MigrateResult(leaf_path, engine, label, leaf.version, leaf.version, [],
                             f"{leaf.name}@{leaf.version} already targets {label}: nothing changed")  # fmt: skip
    fingerprint = profile.fingerprint.model_dump()
    text = leaf_path.read_text(encoding="utf-8")
    got = versions.migrate_text(
        text,
        moves,
        label,
        leaf.version + 1,
        fingerprint,
        pin=(target.version or version) if profile.engine_version else None,
    )
    if got.text is None:
        raise ProfileError([f"{paths.display(leaf_path)}: cannot migrate: {got.reason}; nothing changed"])
    with tempfile.TemporaryDirectory(prefix="knobfleet-migrate-") as tmp:  # the new file, checked before it lands
        for path in leaf_path.parent.glob("*.yaml"):  # its parents, and the profiles that extend it
            shutil.copyfile(path, Path(tmp) / path.name)
        (Path(tmp) / leaf_path.name).write_text(got.text, encoding="utf-8")
        trial = ProfileStore(Path(tmp), st.catalog_dir)

        def shown(problems: list[str]) -> list[str]:
            return [p.replace(str(Path(tmp).resolve()), paths.display(leaf_path.parent)) for p in problems]

        try:
            trial.resolve(leaf.name, check_lock=False, engine_version=version)
        except ProfileError as exc:
            lines = shown(exc.problems)
            raise ProfileError([f"{paths.display(leaf_path)}: the migrated profile is still not valid on {label} "
                                f"(nothing changed): {lines[0]}", *lines[1:]]) from None  # fmt: skip
        for child in _children(st, leaf.name, leaf_path):
            try:
                trial.resolve(child, check_lock=False)
            except ProfileError as exc:
                raise ProfileError([f"{paths.display(leaf_path)}: migrating it would break {child}, which extends it "
                                    f"(nothing changed; migrate {child} too, or first): {shown(exc.problems)[0]}"]
                                   ) from None  # fmt: skip
    if write:
        safefile.write_text(leaf_path, got.text)
    renamed = sum(1 for m in moves if m.new_name)
    removed = len(moves) - renamed
    verb = "wrote" if write else "would write"
    summary = (f"{verb} {leaf.name}@{leaf.version + 1} for {label} ({paths.display(leaf_path)}): {renamed} renamed, "
               f"{removed} removed" + ("; publish it with `knobfleet profiles lock`" if write else ""))  # fmt: skip
    return MigrateResult(leaf_path, engine, label, leaf.version, leaf.version + 1, moves, summary)


def _valid_somewhere(st: ProfileStore, name: str, engine: str) -> Profile:
    """``name`` resolved on the newest synced version of ``engine`` it is valid on (a profile written for an older
    engine that names no version), else the pinned catalog's error."""
    from knobfleet.profiles import catalog as catalogs

    for version in reversed(catalogs.synced_versions(engine, st.catalog_dir)):
        try:
            return st.resolve(name, check_lock=False, engine_version=version)
        except ProfileError:
            continue
    return st.resolve(name, check_lock=False)  # raises the pinned catalog's problems


def _children(st: ProfileStore, leaf: str, leaf_path: Path) -> list[str]:
    """The profiles of ``leaf_path``'s folder whose extends chain includes ``leaf`` (not itself)."""
    from knobfleet.profiles.loader import load_doc

    docs = {}
    for path in sorted(leaf_path.parent.glob("*.yaml")):
        try:
            docs[path.stem] = load_doc(path)
        except ProfileError:
            continue  # a broken file is its own problem, reported where it is used
    out = []
    for name, doc in docs.items():
        seen, cur = set(), doc
        while cur.extends is not None and cur.extends not in seen and cur.extends in docs:
            if cur.extends == leaf:
                out.append(name)
                break
            seen.add(cur.extends)
            cur = docs[cur.extends]
    return out

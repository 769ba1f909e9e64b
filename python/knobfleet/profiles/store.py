"""Profile names → resolved, validated ``Profile``; the version lock (``profiles/profiles.lock``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from knobfleet import paths, rules, safefile
from knobfleet.errors import ProfileError
from knobfleet.profiles import catalog as catalogs
from knobfleet.profiles import safeyaml
from knobfleet.profiles.loader import load_doc
from knobfleet.profiles.model import Catalog, Fingerprint, Gate, Profile, ProfileDoc, Scalar

MAX_DEPTH = 8
LOCK_NAME = "profiles.lock"
LOCK_HEADER = (
    "# Published profile versions: name@version -> content hash of the resolved profile.\n"
    "# Written by `knobfleet profiles lock`. A locked version's content may never change:\n"
    "# change the profile, bump its `version`, then run `knobfleet profiles lock`.\n"
)


@dataclass
class _Merged:
    env: dict[str, tuple[Scalar, Path]] = field(default_factory=dict)
    args: dict[str, tuple[Scalar, Path]] = field(default_factory=dict)


def _profile_file(path: Path, extended_by: Path | None = None) -> bool:
    """Whether the profile file at ``path`` is there (False: not found); anything else at that name (a FIFO, a
    device, a folder, a dangling symlink, a symlink loop) is a ProfileError naming it, never "not found"."""
    try:
        return safefile.is_present(path)
    except safefile.FileRefused as exc:
        where = rules.shown(paths.display_node(path))
        what = "profile file" + (f" (extended by {rules.shown(paths.display(extended_by))})" if extended_by else "")
        raise ProfileError([safefile.not_a(where, exc, what)]) from None


class ProfileStore:
    """Profiles in one folder. Names map to ``<folder>/<name>.yaml``."""

    def __init__(self, directory: Path | None = None, catalog_dir: Path | None = None) -> None:
        self.named = directory or paths.profiles_dir()  # as named: a dangling symlink there is refused as one
        self.directory = Path(os.path.realpath(self.named))  # a loop: read, refused there
        own = self.directory / "catalogs"
        # A checkout keeps its catalogs under profiles/; a user's project uses the ones knobfleet ships.
        self.catalog_dir = catalog_dir or (own if own.is_dir() else paths.catalogs_dir())

    @property
    def lock_path(self) -> Path:
        return self.directory / LOCK_NAME

    def names(self) -> list[str]:
        """The profiles of the folder; an unreadable folder, or a FIFO or file where it should be, is a ProfileError
        (never read as a folder without profiles). A folder that does not exist has none."""
        try:
            found = safefile.list_dir(self.named) or []
        except safefile.FileRefused as exc:
            where = rules.shown(paths.display_node(self.named))
            fix = "point `profiles` in knobfleet.toml (or KNOBFLEET_HOME) at a folder of profile files"
            raise ProfileError([safefile.not_a(where, exc, "profiles folder", fix)]) from None
        return [n.removesuffix(".yaml") for n in found if n.endswith(".yaml") and not n.startswith(".")]

    def path_of(self, name_or_path: str) -> Path:
        if name_or_path.endswith((".yaml", ".yml")) or os.sep in name_or_path:
            return Path(os.path.realpath(name_or_path))  # not resolve(): before 3.13 it raises on a symlink loop
        path = self.directory / f"{name_or_path}.yaml"
        if not _profile_file(path):
            hint = catalogs.did_you_mean(name_or_path, self.names())
            raise ProfileError(
                [
                    f"{paths.display(self.directory)}: profile {name_or_path!r} not found"
                    f"{hint or '; run `knobfleet profiles list`'}"
                ]
            )
        return path

    def chain(self, name_or_path: str) -> list[tuple[Path, ProfileDoc]]:
        """The files of a profile's ``extends`` chain, root first, each with its document."""
        return self._chain(name_or_path)

    def _chain(self, name_or_path: str) -> list[tuple[Path, ProfileDoc]]:
        path = self.path_of(name_or_path)
        chain: list[tuple[Path, ProfileDoc]] = []
        seen: list[str] = []
        while True:
            doc = load_doc(path)
            if doc.name in seen:
                cycle = " -> ".join([*seen, doc.name])
                raise ProfileError([f"{paths.display(path)}: extends: cycle {cycle}; remove one extends"])
            seen.append(doc.name)
            chain.append((path, doc))
            if doc.extends is None:
                break
            if len(chain) >= MAX_DEPTH:
                raise ProfileError(
                    [f"{paths.display(path)}: extends: chain deeper than {MAX_DEPTH} ({' -> '.join(seen)}); flatten it"]
                )
            parent = path.parent / f"{doc.extends}.yaml"
            if not _profile_file(parent, path):
                hint = catalogs.did_you_mean(doc.extends, self.names())
                raise ProfileError(
                    [f"{paths.display(path)}: extends: profile {doc.extends!r} not found{hint or '; check the name'}"]
                )
            path = parent
        chain.reverse()
        return chain

    def resolve(self, name_or_path: str, *, check_lock: bool = True, engine_version: str | None = None) -> Profile:
        """Resolve ``extends``, validate every value against the catalog (of ``engine_version``: another synced
        version of the engine than the pinned one), check the lock."""
        chain = self._chain(name_or_path)
        merged = _Merged()
        engine: str | None = None
        pin: str | None = None
        gate: Gate | None = None
        fingerprint: Fingerprint | None = None
        allow: list[str] = []
        for path, doc in chain:
            for section, target in (("env", merged.env), ("args", merged.args)):
                for key, value in getattr(doc, section).items():
                    key = key.removeprefix("--") if section == "args" else key
                    if value is None:
                        target.pop(key, None)
                    else:
                        target[key] = (value, path)
            engine = doc.engine or engine
            pin = doc.engine_version or pin
            gate = doc.gate or gate
            fingerprint = doc.fingerprint or fingerprint
            allow.extend(a.removeprefix("--") for a in doc.allow_unknown if a not in allow)
        leaf_path, leaf = chain[-1]
        if engine is None:
            engine = catalogs.default_engine(self.catalog_dir)
        engine_version = engine_version or pin  # a pinned version is the one it must be valid on
        cat = catalogs.catalog_for(engine, self.catalog_dir, engine_version)
        problems = self._problems(cat, merged, allow)
        if problems and engine_version is None and fingerprint is not None and fingerprint.engine_version:
            # not valid on the pinned catalog: valid on the synced version its fingerprint names, it targets that
            aimed = self.target_version(engine, fingerprint.engine_version)
            if aimed is not None and aimed != cat.version:
                other = catalogs.catalog_for(engine, self.catalog_dir, aimed)
                if not self._problems(other, merged, allow):
                    cat, problems = other, []
        if problems:
            raise ProfileError(problems)
        profile = Profile(
            name=leaf.name,
            version=leaf.version,
            engine=engine,
            engine_version=pin,
            description=leaf.description,
            env={k: v for k, (v, _) in sorted(merged.env.items())},
            args={k: v for k, (v, _) in sorted(merged.args.items())},
            allow_unknown=tuple(allow),
            gate=gate or Gate(),
            fingerprint=fingerprint or Fingerprint(),
            chain=tuple(doc.name for _, doc in chain),
            validated_on=cat.version,
        )
        if check_lock:
            self.check_locked(profile, leaf_path)
        return profile

    @staticmethod
    def _problems(cat: Catalog, merged: _Merged, allow: list[str]) -> list[str]:
        """Every problem of the merged knobs against ``cat``, one line each (secrets, names, values)."""
        problems: list[str] = []
        from knobfleet.module_utils.knob_redact import secret_shape

        def secret_env(key: str, value: object) -> bool:
            return cat.is_secret(key)

        def secret_flag(key: str, value: object) -> bool:
            return not isinstance(value, bool) and cat.is_secret_flag(key)

        kinds = (
            ("env", merged.env, "knob_serve_host_env", secret_env, catalogs.check_env),
            ("args", merged.args, "knob_serve_host_args", secret_flag, catalogs.check_flag),
        )
        for part, knobs, var, secret, check in kinds:
            for key, (value, origin) in knobs.items():
                where = f"{paths.display(origin)}: {part}.{key}"
                lookup = f"lookup('env', '{key}')" if part == "env" else "lookup('env', ...)"
                shape = secret_shape(value)
                if shape:
                    problems.append(
                        f"{where}: the value looks like a secret ({shape}); a secret does not belong in a profile (it "
                        f"would be in git and in every report): set it in the host vars as {var}.{key}, from Ansible "
                        f"Vault or {lookup}"
                    )
                elif secret(key, value):
                    problems.append(
                        f"{where}: a secret does not belong in a profile (it would be in git and in every report); "
                        f"set it in the host vars as {var}.{key}, from Ansible Vault or {lookup}"
                    )
                elif why := check(cat, key, value, tuple(allow)):
                    problems.append(f"{where}: {why}")
        return problems

    def target_version(self, engine: str, fingerprint_version: str) -> str | None:
        """The synced engine version a profile's ``fingerprint.engine_version`` names, or None (the pinned
        catalog validates it: a fingerprint naming a version with no catalog is only a note)."""
        from knobfleet.profiles.hostversion import parse_version

        version = parse_version(fingerprint_version)
        return version if version in catalogs.synced_versions(engine, self.catalog_dir) else None

    # --- the lock ---------------------------------------------------------------------------

    def read_lock(self) -> dict[str, str]:
        try:  # a FIFO or a dangling symlink there is named, never read as "nothing published yet"
            if not safefile.is_present(self.lock_path):
                return {}
        except safefile.FileRefused as exc:
            where = rules.shown(paths.display_node(self.lock_path))
            fix = "remove it and run `knobfleet profiles lock` (or restore it from git); nothing was written"
            raise ProfileError([safefile.not_a(where, exc, "lock file", fix)]) from None
        try:
            data = safeyaml.load_file(self.lock_path)
        except safeyaml.YamlProblem as exc:
            raise ProfileError([f"{paths.display(self.lock_path)}: {exc}"]) from None
        if data is None:
            return {}
        if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
            raise ProfileError(
                [
                    f"{paths.display(self.lock_path)}: expected `name@version: sha256:…` lines; "
                    "regenerate it with `knobfleet profiles lock`"
                ]
            )
        return {str(k): v for k, v in data.items()}

    def check_locked(self, profile: Profile, path: Path) -> None:
        locked = self.read_lock().get(profile.ref)
        if locked is not None and locked != profile.content_hash:
            via = ""
            if len(profile.chain) > 1:
                via = f" (its content includes {', '.join(profile.chain[:-1])})"
            raise ProfileError(
                [
                    f"{paths.display(path)}: version: {profile.ref} is published with {locked[:19]}… but its "
                    f"content now hashes to {profile.content_hash[:19]}…{via}; published versions are "
                    "immutable: bump `version` and run `knobfleet profiles lock`"
                ]
            )

    def write_lock(self) -> tuple[dict[str, str], list[str]]:
        """Record every profile's current version. Returns (lock, newly added refs).

        Refuses (ProfileError) when a locked version changed: that needs a version bump, not a relock."""
        lock = self.read_lock()
        added: list[str] = []
        problems: list[str] = []
        for name in self.names():
            try:
                profile = self.resolve(name, check_lock=True)
            except ProfileError as exc:
                problems.extend(exc.problems)
                continue
            if profile.ref not in lock:
                lock[profile.ref] = profile.content_hash
                added.append(profile.ref)
        if problems:
            raise ProfileError(problems)
        body = LOCK_HEADER + "".join(f"{ref}: {lock[ref]}\n" for ref in sorted(lock))
        from knobfleet import safefile

        safefile.write_text(self.lock_path, body)  # a FIFO, device, symlink or folder there: one line, unwritten
        return lock, added

"""The campaign driver: the four stages in order, the record rewritten after every step, ``--resume``.

    model   every candidate scored by the wave planner for the GPU; the best few within a margin go on
    kernel  the survivors' kernel measured on a GPU host (``kernel bench``) or read from a stored sweep
    engine  the best few against the current profile in interleaved ``ab`` on one host (sequential rule,
            futility stop, guardrail); a candidate that crashes or fails the consistency check is out
    live    the winner through ``canary`` on live traffic (promoted to the rest by the canary itself), or, with
            ``live: {skip: ...}``, through the normal rollout

The hosts' side goes through ``Stages`` (the real one below; tests and perf/tune_quality.py pass their own), so
this module holds no decision of its own: those are in ``tune/campaign.py``. The record lives at
``<state>/tune/<name>.json``: a step that finished is never run again after an interruption, the step that was
running is redone from its start, and the engine host is put back on the current profile first.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from knobfleet import paths, safefile
from knobfleet.errors import KnobfleetError
from knobfleet.profiles.model import Profile
from knobfleet.tune import campaign
from knobfleet.tune.space import Space

RECORD_KIND = "tune"


class TuneError(KnobfleetError):
    """The campaign cannot start or go on (a changed SPACE file, a stage that cannot run)."""


class Stages(Protocol):
    """What the campaign does on hosts. Each method is one step; each returns what the record keeps."""

    def live_weights(self) -> dict[int, float]: ...

    def kernel_rows(self, ctas: list[int], block_h: list[int], batches: list[int]) -> list[dict[str, Any]]: ...

    def ab(
        self,
        base: Profile,
        candidate: Profile,
        max_rounds: int,
        weights: dict[int, float],
        deadline_s: float | None = None,
    ) -> dict[str, Any]: ...

    def restore(self, base: Profile) -> None: ...

    def canary(self, winner: Profile) -> dict[str, Any]: ...

    def rollout(self, winner: Profile) -> dict[str, Any]: ...


def record_dir() -> Path:
    return paths.state_dir() / "tune"


def record_path(space: Space, folder: Path | None = None) -> Path:
    return (folder or record_dir()) / f"{space.name}.json"


def candidate_profile(
    space: Space, base: Profile, index: int, knobs: dict[str, Any], name: str | None = None
) -> Profile:
    """The base profile with a candidate's knobs: what ``ab`` applies (the winner is also written as a file)."""
    shown = ", ".join(f"{k}={v}" for k, v in knobs.items())
    own = name or campaign.candidate_name(space, index)
    return base.model_copy(
        update={
            "name": own,
            "version": 1,
            "description": f"tune {space.name}: {base.name} with {shown}",
            "env": dict(sorted({**base.env, **knobs}.items())),
            "chain": (*base.chain, own),
        }
    )


def profile_text(space: Space, base: Profile, knobs: dict[str, Any], name: str) -> str:
    lines = [
        f"# Written by `knobfleet tune {Path(space.path).name}`: the campaign's winner over {base.ref}.",
        "# Commit it with the lock (`knobfleet profiles lock`) to keep what was shipped.",
        "schema_version: 1",
        f"name: {name}",
        "version: 1",
        f"extends: {base.name}",
        f"description: chosen by tune {space.name} over {base.name}.",
        "env:",
    ]
    lines += [f"  {k}: {json.dumps(v)}" for k, v in knobs.items()]
    return "\n".join(lines) + "\n"


@dataclass
class Campaign:
    space: Space
    base: Profile
    stages: Stages
    path: Path
    sms: int
    calibration: Any = None
    calibration_note: str = ""
    clock: Callable[[], float] = time.monotonic
    write_profile: Callable[[str, str], Path] | None = None  # (name, text) -> the winner's file
    resolve: Callable[[str], Profile] | None = None  # the winner's file read back as any profile is
    on_step: Callable[[str], None] = lambda _msg: None
    doc: dict[str, Any] = field(default_factory=dict)

    # -- the record ------------------------------------------------------------------------------------------

    def new_record(self) -> None:
        self.doc = {
            "space": {"path": self.space.path, "sha256": self.space.sha256, "name": self.space.name},
            "base": self.base.ref,
            "status": "running",
            "started": time.time(),
            "gpu": self.space.model.gpu,
            "sms": self.sms,
            "calibration": self.calibration_note,
            "budget": {
                "wall_s": self.space.budget.wall_s,
                "host_s": self.space.budget.host_s,
                "gpu_s": self.space.budget.gpu_s,
            },
            "used": campaign.Ledger().as_json(),
            "stages": {},
            "decision": None,
        }

    def load(self, doc: dict[str, Any]) -> None:
        theirs = (doc.get("space") or {}).get("sha256")
        if theirs != self.space.sha256:
            raise TuneError(
                f"{paths.display(Path(self.space.path))}: changed since campaign {self.space.name} started "
                f"(record {theirs}, file now {self.space.sha256}); put the file back, or start over without "
                f"--resume after removing {paths.display(self.path)}"
            )
        self.doc = doc
        self.doc["status"] = "running"

    def save(self) -> None:
        from knobfleet.experiment import records

        records.write(self.path, RECORD_KIND, self.doc)

    @property
    def used(self) -> campaign.Ledger:
        return campaign.Ledger.from_json(self.doc.get("used"))

    def _spend(self, started: float, kind: str, stage: str) -> None:
        used = self.used
        spent = self.clock() - started
        by_stage = self.doc.setdefault("used_by_stage", {})
        by_stage[stage] = round(float(by_stage.get(stage, 0.0)) + spent, 1)
        used.wall_s += spent
        if kind == "host":
            used.host_s += spent
        elif kind == "gpu":
            used.gpu_s += spent
        self.doc["used"] = used.as_json()

    # -- the stages ------------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        st = self.doc["stages"]
        try:
            if "weights" not in self.doc:
                self.doc["weights"] = {str(k): v for k, v in self._weights().items()}
                self.save()
            if not (st.get("model") or {}).get("done"):
                self._model()
            if not (st.get("kernel") or {}).get("done"):
                self._kernel()
            if not (st.get("engine") or {}).get("done"):
                self._engine()
            if not (st.get("live") or {}).get("done"):
                self._live()
        except KeyboardInterrupt:
            self._interrupted()
            raise
        except Exception as exc:
            self.doc["status"] = "failed"
            self._keep_engine_decision(exc)
            self.save()
            raise
        self.doc["status"] = "done"
        self.save()
        return self.doc

    def _keep_engine_decision(self, exc: Exception) -> None:
        """A stage after the engine stage failed: the engine stage's winner stays the campaign's decision (verdict
        ``engine``), so applying it or ``--resume`` needs no rerun of the stages before."""
        engine = self.doc["stages"].get("engine") or {}
        if self.doc.get("decision") or not engine.get("done") or engine.get("winner") is None:
            return
        index = engine["winner"]
        rows = (self.doc["stages"].get("model") or {}).get("rows") or []
        knobs: dict[str, Any] = next((r["knobs"] for r in rows if r.get("index") == index), {})
        why = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        self.doc["decision"] = {
            "verdict": "engine",
            "profile": self.space.result,
            "candidate": index,
            "knobs": knobs,
            "reason": f"the engine stage promoted candidate {index}; the live stage failed ({why}): apply "
            f"{self.space.result} or rerun with --resume to take it live",
        }

    def _weights(self) -> dict[int, float]:
        if self.space.traffic is not None:
            return dict(self.space.traffic)
        self.on_step("traffic: reading the live load (load-profile)")
        return self.stages.live_weights()

    @property
    def weights(self) -> dict[int, float]:
        return {int(k): float(v) for k, v in self.doc["weights"].items()}

    def _model(self) -> None:
        started = self.clock()
        rows, current = campaign.model_stage(self.space, self.base.env, self.weights, self.sms, self.calibration)
        kept = [r for r in rows if r.kept]
        self.doc["stages"]["model"] = {
            "done": True,
            "candidates": len(rows),
            "current_cost": current,
            "kept": [r.index for r in kept],
            "dropped": len(rows) - len(kept),
            "rows": [r.as_json() for r in rows],
            "used_s": round(self.clock() - started, 3),
        }
        self._spend(started, "model", "model")
        self.on_step(f"model: {len(rows)} candidates scored, {len(kept)} kept, {len(rows) - len(kept)} dropped")
        self.save()

    def _kept_after_model(self) -> list[campaign.Scored]:
        rows = self.doc["stages"]["model"]["rows"]
        return [
            campaign.Scored(r["index"], r["knobs"], r["cost"], r["relative"], r["kept"], r["reason"])
            for r in rows
            if r["kept"]
        ]

    def _kernel(self) -> None:
        k = self.space.kernel
        kept = self._kept_after_model()
        section: dict[str, Any] = {"done": True}
        started = self.clock()
        if not self.space.kernel_knobs or k.skip is not None:
            section["skipped"] = k.skip or "the space varies no kernel knob"
            section["kept"] = [s.index for s in kept]
        else:
            envs = [campaign.kernel_knobs({**self.base.env, **s.knobs}) for s in kept]
            base = campaign.kernel_knobs(self.base.env)
            ctas = sorted({e.target_ctas for e in envs} | {base.target_ctas})
            bh = sorted({e.block_h for e in envs} | {base.block_h})
            self.on_step(f"kernel: measuring {len(kept)} candidates and the current profile on the GPU")
            rows = self.stages.kernel_rows(ctas, bh, sorted(self.weights))
            ranked = campaign.kernel_rank(
                kept, self.base.env, rows, self.weights, self.space.model.heads, self.space.model.context, k.keep
            )
            section.update(
                source=k.sweep or k.host, rows=ranked, kept=[r["index"] for r in ranked if r["kept"]], points=len(rows)
            )
        self.doc["stages"]["kernel"] = section
        self._spend(started, "gpu" if k.host else "none", "kernel")
        self.save()

    def _engine(self) -> None:
        e = self.space.engine
        section = self.doc["stages"].setdefault("engine", {"results": [], "done": False})
        order = self.doc["stages"]["kernel"]["kept"][: e.keep]
        by_index = {r["index"]: r for r in self.doc["stages"]["model"]["rows"]}
        finished = {r["index"] for r in section["results"]}
        for index in order:
            if index in finished:
                continue
            round_s, basis = campaign.round_estimate(self.space, section["results"])
            rounds = min(e.max_rounds, campaign.rounds_affordable(self.space, self.used, round_s))
            cand = candidate_profile(self.space, self.base, index, by_index[index]["knobs"])
            result: dict[str, Any] = {"index": index, "name": cand.name, "knobs": by_index[index]["knobs"]}
            result["round_estimate"] = {"s": round(round_s, 1), "basis": basis, "rounds": rounds}
            if rounds < 3:
                result["skipped"] = (
                    f"budget: {rounds} round(s) left at ~{round_s:.0f}s each ({basis}), an A/B needs 3; raise "
                    "budget.host_minutes or budget.wall"
                )
                section["results"].append(result)
                self.save()
                continue
            section["running"] = index
            self.save()
            self.on_step(
                f"engine: ab {self.base.name} vs {cand.name} on {e.host} (at most {rounds} rounds at ~{round_s:.0f}s: "
                f"{basis}; 2 restarts a round)"
            )
            started = self.clock()
            try:
                doc = self.stages.ab(self.base, cand, rounds, self.weights, campaign.budget_left(self.space, self.used))
                result["ab"] = campaign.ab_summary(doc)
                used = self.used  # a ledger read from the record: what is added to it is written back
                used.restart_s += float((doc.get("spent") or {}).get("restart_s") or 0.0)
                self.doc["used"] = used.as_json()
                if result["ab"]["verdict"] == "promote" and (doc.get("consistency") or {}).get("B") == "fail":
                    result["ab"]["verdict"] = "keep"
                    result["out"] = "failed the output-consistency check"
            except KeyboardInterrupt:
                raise
            except KnobfleetError as exc:  # a candidate that does not come up is out, with the engine's reason
                result["out"] = str(exc).splitlines()[0][:300]
            finally:
                self._spend(started, "host", "engine")
            section.pop("running", None)
            section["results"].append(result)
            self.save()
        winner = campaign.engine_pick(section["results"])
        self.on_step(f"engine: putting {e.host} back on {self.base.name}")
        self.stages.restore(self.base)
        section["winner"] = None if winner is None else winner["index"]
        section["done"] = True
        if winner is None:
            self.doc["decision"] = {
                "verdict": "keep",
                "profile": self.base.ref,
                "reason": "no candidate was promoted over the current profile on the engine host",
            }
        self.save()

    def _live(self) -> None:
        winner_index = self.doc["stages"]["engine"]["winner"]
        section: dict[str, Any] = {"done": True}
        if winner_index is None:
            section["skipped"] = "no winner: nothing to take live"
            self.doc["stages"]["live"] = section
            self.save()
            return
        knobs = next(r["knobs"] for r in self.doc["stages"]["model"]["rows"] if r["index"] == winner_index)
        name = self.space.result
        if self.write_profile is not None:
            written = self.write_profile(name, profile_text(self.space, self.base, knobs, name))
            section["profile_file"] = paths.display(written)
        winner = (
            self.resolve(name)
            if self.resolve is not None
            else candidate_profile(self.space, self.base, winner_index, knobs, name=name)
        )
        started = self.clock()
        live = self.space.live
        if live.skip is not None:
            self.on_step(f"live: {live.skip}; promoting {name} through the rollout")
            section["skipped"] = live.skip
            section["rollout"] = self.stages.rollout(winner)
            ok = section["rollout"].get("exit_code") == 0
            verdict = "promote" if ok else "failed"
            reason = "promoted through the rollout (live stage skipped: " + live.skip + ")"
        else:
            self.on_step(f"live: canary {name}{' (advisory)' if live.advisory else ''}")
            section["canary"] = self.stages.canary(winner)
            v = section["canary"].get("verdict")
            verdict = {"promote": "promote", "rollback": "keep"}.get(str(v), "keep")
            if live.advisory:
                verdict = "advisory"
            reason = f"canary: {v} — {section['canary'].get('reason', '')}".rstrip(" —")
        self._spend(started, "host", "live")
        self.doc["stages"]["live"] = section
        self.doc["decision"] = {
            "verdict": verdict,
            "profile": winner.ref if verdict in ("promote", "advisory") else self.base.ref,
            "candidate": winner_index,
            "knobs": knobs,
            "reason": reason,
        }
        self.save()

    def _interrupted(self) -> None:
        """Put the engine host back on the current profile (shielded: a second signal waits), then record."""
        from knobfleet.ops import interrupts

        engine = self.doc["stages"].get("engine") or {}
        if engine and not engine.get("done"):
            try:
                with interrupts.shielded(raise_at_end=False):
                    self.stages.restore(self.base)
                engine.pop("running", None)
            except KnobfleetError as exc:
                self.doc["restore_error"] = str(exc)
        self.doc["status"] = "interrupted"
        self.save()
        while interrupts.pending():  # the signal that ended the campaign: already acted on
            with contextlib.suppress(KeyboardInterrupt):
                interrupts.checkpoint()


def write_profile_file(directory: Path) -> Callable[[str, str], Path]:
    """The winner's file in the project's profiles folder: written once; the same content again is fine; other
    content there is refused (never overwritten)."""

    def write(name: str, text: str) -> Path:
        path = directory / f"{name}.yaml"
        if path.exists() or path.is_symlink():
            try:
                same = safefile.read_text(path, 64 * 1024, "profile") == text
            except safefile.FileRefused as exc:
                raise TuneError(f"{paths.display(path)}: {exc}; nothing was written") from None
            if not same:
                raise TuneError(
                    f"{paths.display(path)}: exists with other content; not overwritten (set `result:` in the "
                    "space to another name, or remove the file)"
                )
            return path
        safefile.write_text(path, text)
        return path

    return write

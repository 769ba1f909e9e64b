"""The host transaction of one knobfleet-managed service: ``begin`` (the refusals, the lock, generation 0),
``mark``, ``release``, ``verify`` and the composite calls ``install`` and ``finish``, and the table of every step;
``stage`` and ``commit`` (the rendered files validated, a new generation stored and installed, all or nothing)
are knob_commit's, ``restore`` knob_restore's, the store, ledger, lock and pruning knob_store's, and the refusals
before anything changes knob_guards'.

Plain importable code: each step is ``HANDLERS[action](module, store, p)``, where ``module`` is what the step uses
of Ansible's AnsibleModule (knob_store.Module: check and diff mode, ``fail_json``, ``warn``, ``run_command``),
``store`` the service's knob_store.Store and ``p`` the module's parameters; ``run`` is the whole call, as
roles/knob_serve/library/knob_generation.py's ``main`` makes it. Standard library only: the roles' modules import
this file as ``ansible.module_utils.knob_txn``, the controller's tests as ``knobfleet.module_utils.knob_txn``.
"""

from __future__ import annotations

from .knob_commit import commit, observed, stage
from .knob_guards import (
    adopt_files,
    check_dropins,
    check_launcher,
    check_ledger,
    check_paths,
    check_script_dir,
    check_unit_name,
)
from .knob_live import evaluate, expected_from_generation
from .knob_restore import restore
from .knob_rules import restore_ok
from .knob_store import (
    Store,
    break_lock,
    lock_holder,
    lock_refusal,
    now,
    prune,
    release,
    remove_generation,
    store_generation,
    take_lock,
)

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only
    from collections.abc import Callable
    from typing import Any, NoReturn

    from knobfleet.module_utils.knob_store import Module

    Handler = Callable[[Module, "Store", dict[str, Any]], dict[str, Any]]


# --- begin ---------------------------------------------------------------------------------------------------


def mark_interrupted(store: Store, p: dict[str, Any], holder: dict[str, Any] | None) -> list[int]:
    """Under this run's lock, no other run can be installing: every generation another run left 'installing'
    (its lock broken, or released by hand) becomes 'interrupted', so it never wedges the host."""
    marked = []
    for n in store.numbers():
        try:
            meta = store.meta(n)
        except (OSError, ValueError):
            continue
        if meta.get("status") == "installing" and meta.get("run_id") != p["run_id"]:
            if holder:
                why = "apply interrupted (lock of run %s broken by %s)" % (holder.get("run_id"), p["operator"])
            else:
                why = "apply of run %s never finished (found 'installing' with no lock held)" % meta.get("run_id")
            meta.update(status="interrupted", updated=now(), reason=why)
            store.write_meta(n, meta)
            marked.append(n)
    return marked


def begin(module: Module, store: Store, p: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {"changed": False, "adopted": False}
    check_paths(module, p)
    if p["action"] == "install":  # a new unit is about to be installed (a restore's begin installs none)
        check_unit_name(module, store, p)
    warned = check_script_dir(module, p)
    if p["action"] == "install":  # what the new generation will execute, before the running engine is stopped
        warned = check_launcher(module, p, p.get("script_content") or "", "the new generation") or warned
    if warned:
        result["warning"] = warned
    if p["foreign_dropins"] != "ignore":
        result["dropins"] = check_dropins(module, p)
    holder = lock_holder(store)
    if module.check_mode:
        result["lock"] = holder
        result["generation"] = store.current()
        return result
    store.ensure()
    check_ledger(module, store)
    if holder and holder.get("run_id") != p["run_id"]:
        if not p["break_lock"]:
            module.fail_json(
                msg="locked by %s (run %s) since %s from %s; if that applier was killed, break the lock "
                "with --break-lock"
                % (holder.get("operator"), holder.get("run_id"), holder.get("since"), holder.get("controller")),
                lock=lock_refusal(store, holder),
                lock_held=True,
            )
        break_lock(store, p)
        result["broke_lock"] = holder
    took = not holder or holder.get("run_id") != p["run_id"]
    if took:
        take_lock(module, store, p)
        result["locked"] = True  # bookkeeping, not a change of the host's configuration
    adopting = False
    try:
        # Under this lock nobody else installs: an 'installing' generation is a dead run's, whether its lock was
        # broken just now or removed by hand.
        result["interrupted"] = mark_interrupted(store, p, result.get("broke_lock"))
        if result.get("broke_lock") or result["interrupted"]:
            store.append_ledger(
                {
                    "time": now(),
                    "event": "lock-broken" if result.get("broke_lock") else "interrupted",
                    "holder": result.get("broke_lock"),
                    "run_id": p["run_id"],
                    "operator": p["operator"],
                    "interrupted": result["interrupted"],
                }
            )
        if not store.numbers():
            files, present = adoptable(module, p)
            adopting = True
            adopt(store, p, files, present)
            result.update(changed=True, adopted=True)
        result["generation"] = store.current()
    except BaseException:
        # Nothing of this begin may outlive its failure: no half adoption, and no lock nobody will release.
        if adopting:
            undos: tuple[Callable[[], None], ...] = (
                lambda: store.unswitch(0, None),
                lambda: remove_generation(store, 0),
            )
            for undo in undos:
                try:
                    undo()
                except (OSError, ValueError):
                    pass
        if took:
            try:
                release(module, store, p)
            except OSError:
                pass
        raise
    return result


def adoptable(module: Module, p: dict[str, Any]) -> tuple[list[tuple[str, bytes, int]], dict[str, Any]]:
    """What generation 0 stores (knob_guards.adopt_files), or the refusal of a file it cannot adopt."""
    adopted, why = adopt_files(module, p)
    if why:
        module.fail_json(msg=why, refused=True)
    assert adopted is not None
    return adopted


def adopt(store: Store, p: dict[str, Any], files: list[tuple[str, bytes, int]], present: dict[str, Any]) -> None:
    """Generation 0 (status adopted): the files found before knobfleet's first apply, stored with their mode,
    owner and group, ``current`` pointing at it, and the ledger's line. A failure half-way is begin's to undo."""
    meta = {
        "generation": 0,
        "status": "adopted",
        "profile": None,
        "version": None,
        "hash": None,
        "files": present,
        "created": now(),
        "updated": now(),
        "operator": p["operator"],
        "run_id": p["run_id"],
        "reason": "files found before knobfleet's first apply",
    }
    store_generation(store, 0, files, meta)
    store.switch_current(0)
    store.append_ledger(
        {
            "time": now(),
            "event": "adopt",
            "generation": 0,
            "status": "adopted",
            "files": sorted(present),
            "run_id": p["run_id"],
            "operator": p["operator"],
        }
    )


# --- mark, verify, and the composite calls -------------------------------------------------------------------


def mark(module: Module, store: Store, p: dict[str, Any]) -> dict[str, Any]:
    number = p["generation"]
    try:
        meta = store.meta(number)
    except (OSError, ValueError) as exc:
        module.fail_json(msg="cannot read %s/meta.json: %s" % (store.gen_dir(number), exc))
    if module.check_mode:
        return {"changed": meta.get("status") != p["status"], "generation": number}
    meta.update(status=p["status"], updated=now())
    if p["reason"]:
        meta["reason"] = p["reason"]
    store.write_meta(number, meta)
    store.append_ledger(
        {
            "time": now(),
            "event": "mark",
            "generation": number,
            "status": p["status"],
            "reason": p["reason"],
            "run_id": p["run_id"],
            "operator": p["operator"],
        }
    )
    try:
        pruned = prune(store, p["keep"]) if p["status"] == "good" else []
    except (OSError, ValueError):
        pruned = []  # cleanup must never fail an apply that worked
    return {"changed": True, "generation": number, "status": p["status"], "pruned": pruned}


def verify(module: Module, store: Store, p: dict[str, Any]) -> dict[str, Any]:
    """The live-state rule (module_utils knob_live) on this host now: the current generation's files, unit,
    and every engine process's /proc environ and cmdline. After a restore, findings that may predate the
    change (a drop-in put back, RULES[kind].restore_ok) are reported but do not fail."""
    doc = observed(p)
    expected, why = expected_from_generation(doc)
    if why is not None:
        module.fail_json(msg="cannot verify: %s" % why)
    findings = evaluate(doc, expected, p["engine"] or {}, run_id=p["run_id"])
    blocking = restore_ok(findings) if p["after"] == "restore" else findings
    generation = (expected or {}).get("generation")
    if blocking:
        module.fail_json(
            msg="generation %s does not verify: %s"
            % ("none" if generation is None else "%04d" % generation, "; ".join(f["message"] for f in blocking[:3])),
            findings=findings,
        )
    return {"changed": False, "generation": generation, "verified": True, "findings": findings}


def describe(step: str, exc: BaseException, p: dict[str, Any]) -> str:
    """One line for an unexpected error of ``step``: what, where, and that the host was left as it was."""
    if isinstance(exc, OSError):
        what = "%s: %s" % (exc.filename or p["state_dir"], exc.strerror or exc)
    else:
        what = "%s: %s" % (type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "")
    return "%s failed: %s; this step's changes were undone" % (step, what)


def composite(names: tuple[str, ...]) -> Handler:
    """One module call for steps that always run back to back (each SSH round trip + module start costs ~0.45 s
    on a host; a real engine's restart waits on none of them): ``install`` is begin, stage and commit (no commit
    in check mode), ``finish`` marks the new generation good (when ``generation`` is given) and releases the
    lock. Each step's result is returned under ``steps``; a failing step fails the call with the earlier
    steps' results and ``failed_step``, so the caller knows, e.g., whether the lock was taken."""

    def run(module: Module, store: Store, p: dict[str, Any]) -> dict[str, Any]:
        steps: dict[str, dict[str, Any]] = {}
        fail = module.fail_json
        current: dict[str, Any] = {"name": names[0], "failing": False}

        def fail_with_steps(**kw: Any) -> NoReturn:
            current["failing"] = True
            fail(steps=steps, failed_step=current["name"], **kw)

        module.fail_json = fail_with_steps
        try:
            for name in names:
                if (name == "commit" and module.check_mode) or (name == "mark" and p["generation"] is None):
                    continue
                current["name"] = name
                try:
                    steps[name] = HANDLERS[name](module, store, p)
                except Exception as exc:  # an OSError anywhere still names the step and returns the steps
                    if current["failing"]:
                        raise
                    module.fail_json(msg=describe(name, exc, p), errno=getattr(exc, "errno", None))
        finally:
            module.fail_json = fail
        out: dict[str, Any] = {"changed": any(r.get("changed") for r in steps.values()), "steps": steps}
        if steps.get("stage", {}).get("diff"):
            out["diff"] = steps["stage"]["diff"]
        return out

    return run


HANDLERS: dict[str, Handler] = {
    "begin": begin,
    "stage": stage,
    "commit": commit,
    "mark": mark,
    "release": release,
    "restore": restore,
    "verify": verify,
}
HANDLERS.update(install=composite(("begin", "stage", "commit")), finish=composite(("mark", "release")))


def run(module: Module) -> NoReturn:
    """The whole module call: the step ``action`` names, on the service's store, its result (or failure) naming
    the step; an OSError or ValueError no step handled fails the call with one line (``describe``)."""
    p = module.params
    fail = module.fail_json
    module.fail_json = lambda **kw: fail(step=p["action"], **kw)  # every result names its step
    store = Store(p["state_dir"])
    try:
        result = HANDLERS[p["action"]](module, store, p)
    except (OSError, ValueError) as exc:
        module.fail_json(msg=describe(p["action"], exc, p), errno=getattr(exc, "errno", None))
    module.exit_json(step=p["action"], **result)

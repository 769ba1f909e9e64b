#!/usr/bin/python3
# -*- coding: utf-8 -*-
"""Ansible module: generations, lock and ledger of one knobfleet-managed service on a host."""

from __future__ import annotations

DOCUMENTATION = r"""
module: knob_generation
short_description: Lock, adopt, store, install, restore and verify knobfleet generations of a service
description:
  - C(begin) refuses the host, changing nothing, when a foreign drop-in is present and C(foreign_dropins)
    is C(fail); takes the per-service lock (failing fast with the holder's name) and, the first time,
    stores the existing script and unit as generation 0 (status adopted).
  - C(stage) writes the rendered script and unit (passed in as text) to the staging directory when they
    differ from what is staged, and validates what it wrote (C(bash -n); C(systemd-analyze verify) under
    the unit's real name). In check mode it writes nothing and compares with the installed files; with
    --diff it returns both diffs.
  - C(commit) compares the staged files with the installed ones; when they differ it stores a new
    generation (files + meta.json), installs both files atomically (temp file in the same directory,
    then rename; root-owned, fixed modes), switches C(current) and appends to the ledger.
  - C(mark) records a generation's status (good, failed, rolled-back) with a reason.
  - C(release) frees the lock held by this run.
  - C(restore) installs generation N (default the previous good one) again after checking its stored
    files against meta.json; refuses, changing nothing, when they are missing or altered.
  - C(verify) observes the host (files, unit, every process of the unit with its /proc environ and cmdline)
    and checks it against the current generation with knobfleet's live-state rule; fails naming what differs.
  - C(install) is C(begin), C(stage) and C(commit) in one call (no C(commit) in check mode); C(finish) is
    C(mark) (when O(generation) is given) and C(release). Their results come back under C(steps), one per
    step; a failure names the step (C(failed_step)) with the results of the steps before it.
  - C(install) (in its C(begin), before the lock or any write) and C(commit) refuse a unit whose name the host's
    packages ship (that name, or its template's, under /lib/systemd/system or /usr/lib/systemd/system), since the
    serve unit would take the place of the host's own service. A restore is never refused by it.
  - Standard library only on the host; part of the C(knobfleet.serving) collection, used by its
    C(knob_serve) role.
version_added: "0.1.0"
author: knobfleet
options:
  action:
    description: What to do (see above).
    type: str
    required: true
    choices: [begin, stage, commit, mark, release, restore, verify, install, finish]
  after:
    description: For C(verify), what came before. After a C(restore), findings that may predate the change
      (a drop-in put back) do not fail the check.
    type: str
    default: apply
    choices: [apply, restore]
  state_dir:
    description: The service's state folder (generations, ledger, lock), root-only.
    type: path
    required: true
  script_path:
    description: Where the serve script is installed.
    type: path
  unit_path:
    description: Where the systemd unit is installed.
    type: path
  script_content:
    description: The rendered serve script (C(stage)). Never logged.
    type: str
  unit_content:
    description: The rendered systemd unit (C(stage)).
    type: str
  run_id:
    description: The controller's run id; owns the lock.
    type: str
    required: true
  operator:
    description: Who applies; recorded in meta.json and the ledger.
    type: str
    default: unknown
  controller:
    description: Controller host and PID holding the lock.
    type: str
    default: ""
  profile:
    description: The profile's C(name), C(version) and C(hash) (C(commit)).
    type: dict
  generation:
    description: The generation to mark or restore (C(restore) defaults to the previous good one).
    type: int
  status:
    description: Status for C(mark).
    type: str
    choices: [good, failed, rolled-back]
  reason:
    description: Why (recorded with a status or a restore).
    type: str
    default: ""
  break_lock:
    description: Break a lock left by a killed applier (its generation is marked interrupted).
    type: bool
    default: false
  keep:
    description: Good generations to keep when marking one good (older ones are pruned).
    type: int
    default: 10
  leave_status:
    description: Status given to the generation a restore leaves (empty keeps it).
    type: str
    default: rolled-back
    choices: [failed, rolled-back, ""]
  event:
    description: Ledger event of a restore; C(restore) also uninstalls when the target held no files.
    type: str
    default: rollback
    choices: [rollback, restore]
  engine:
    description: The engine part of the live-state rule (C(knob_serve_engine)).
    type: dict
  foreign_dropins:
    description: A drop-in knobfleet did not write; C(fail) refuses, C(remove) moves it into the generation.
    type: str
    default: ignore
    choices: [fail, remove, ignore]
  secret:
    description: Secret env names or patterns; their values are shown and stored only as hashes.
    type: list
    elements: str
    default: []
  secret_key:
    description: The fleet's key for secret markers (knobfleet passes its own); empty shows secrets as C(<secret>).
    type: str
    default: ""
  service_user:
    description: The engine's user; may read a script holding a secret.
    type: str
    default: root
  health_url:
    description: The engine's health URL (recorded; used by C(verify)).
    type: str
    default: ""
  info_url:
    description: The engine's info URL, where it reports its env.
    type: str
    default: ""
  allow_writable_script_dir:
    description: Accept (with a warning) a serve script that root runs in a directory a non-root user can
      change; refused otherwise.
    type: bool
    default: false
notes:
  - Supports check mode (C(stage) returns diffs; C(commit) and C(restore) report what they would do).
"""

EXAMPLES = r"""
- name: Take the host lock and adopt pre-knobfleet files as generation 0
  knobfleet.serving.knob_generation:
    action: begin
    state_dir: /var/lib/knobfleet/sglang-decode
    script_path: /opt/serving/serve_decode.sh
    unit_path: /etc/systemd/system/sglang-decode.service
    run_id: manual

- name: Go back to generation 3
  knobfleet.serving.knob_generation:
    action: restore
    state_dir: /var/lib/knobfleet/sglang-decode
    unit_path: /etc/systemd/system/sglang-decode.service
    generation: 3
    reason: rollback requested
    run_id: manual

- name: Check that the live engine runs the current generation
  knobfleet.serving.knob_generation:
    action: verify
    state_dir: /var/lib/knobfleet/sglang-decode
    script_path: /opt/serving/serve_decode.sh
    unit_path: /etc/systemd/system/sglang-decode.service
    run_id: manual
"""

RETURN = r"""
step:
  description: The action that ran; knobfleet keys results by it.
  returned: always
  type: str
  sample: commit
generation:
  description: The current generation after the action.
  returned: success
  type: int
  sample: 4
previous:
  description: The generation that was current before.
  returned: success
  type: int
  sample: 3
findings:
  description: What the live-state rule found (C(verify)), each with kind, severity, action and message.
  returned: when action is verify
  type: list
  elements: dict
verified:
  description: True when C(verify) found nothing blocking.
  returned: when action is verify
  type: bool
steps:
  description: For C(install) and C(finish), each step's own result (begin, stage, commit; mark, release).
  returned: when action is install or finish
  type: dict
failed_step:
  description: For C(install) and C(finish), the step that failed.
  returned: on failure of install or finish
  type: str
lock_held:
  description: True when the call was refused because another run holds the service's lock.
  returned: on failure for another run's lock
  type: bool
lock:
  description: The lock's holder as the lock file records it (C(run_id), C(operator), C(since), C(controller);
    C(corrupt) when the file cannot be read). On a refusal for another run's lock also C(path) (the lock file),
    C(holder_host) and C(holder_pid) (from C(controller), C(host:pid); null where it is not). In check mode
    C(begin) reports the holder it found.
  returned: on failure for another run's lock; when action is begin in check mode
  type: dict
  sample: {"run_id": "20250101T120000-a1b2c3", "operator": "alice", "since": "2025-01-01T12:00:00+00:00",
           "controller": "ctl:4242", "path": "/var/lib/knobfleet/sglang-decode/lock", "holder_host": "ctl",
           "holder_pid": 4242}
"""

# The host transaction (generation store, ledger, lock and prune; begin, stage, commit, mark, release, restore,
# verify) is plain importable code in module_utils (knob_txn and the files it imports); this module keeps its
# documentation and its argument spec.
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.knob_txn import run


def main():
    module = AnsibleModule(
        argument_spec=dict(
            action=dict(
                type="str",
                required=True,
                choices=["begin", "stage", "commit", "mark", "release", "restore", "verify", "install", "finish"],
            ),
            after=dict(type="str", default="apply", choices=["apply", "restore"]),
            state_dir=dict(type="path", required=True),
            script_path=dict(type="path"),
            unit_path=dict(type="path"),
            script_content=dict(type="str", no_log=True),  # may hold secrets: never in logs or artifacts
            unit_content=dict(type="str"),
            run_id=dict(type="str", required=True),
            operator=dict(type="str", default="unknown"),
            controller=dict(type="str", default=""),
            profile=dict(type="dict"),
            generation=dict(type="int"),
            status=dict(type="str", choices=["good", "failed", "rolled-back"]),
            reason=dict(type="str", default=""),
            break_lock=dict(type="bool", default=False),
            keep=dict(type="int", default=10),
            leave_status=dict(type="str", default="rolled-back", choices=["failed", "rolled-back", ""]),
            event=dict(type="str", default="rollback", choices=["rollback", "restore"]),
            engine=dict(type="dict"),
            secret=dict(type="list", elements="str", default=[]),
            secret_key=dict(type="str", default="", no_log=True),
            service_user=dict(type="str", default="root"),
            foreign_dropins=dict(type="str", default="ignore", choices=["fail", "remove", "ignore"]),
            health_url=dict(type="str", default=""),
            info_url=dict(type="str", default=""),
            allow_writable_script_dir=dict(type="bool", default=False),
        ),
        required_if=[
            ("action", "begin", ["script_path", "unit_path"]),
            ("action", "stage", ["script_path", "unit_path", "script_content", "unit_content"]),
            ("action", "install", ["script_path", "unit_path", "script_content", "unit_content", "profile"]),
            ("action", "finish", ["status"]),
            ("action", "commit", ["script_path", "unit_path", "profile"]),
            ("action", "mark", ["generation", "status"]),
            ("action", "verify", ["script_path", "unit_path"]),
        ],
        supports_check_mode=True,
    )
    run(module)  # the step, on the service's state dir; exits with its result, or fails naming the step


if __name__ == "__main__":
    main()

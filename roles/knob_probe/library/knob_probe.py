#!/usr/bin/python3
# -*- coding: utf-8 -*-
"""Ansible module: a host's whole observed state for one knobfleet-managed service, as one JSON document."""

from __future__ import annotations

DOCUMENTATION = r"""
module: knob_probe
short_description: Observe a knobfleet-managed engine service (read-only)
description:
  - Returns managed files (sha256, mode, owner, mtime, content when small), systemd unit properties and
    drop-ins, every process of the unit's cgroup with its environ, cmdline and start time, the generations
    and C(current), the lock, the engine's health and its info endpoint.
  - Changes nothing. Bounded in time; files are read without following symlinks and with a size bound.
  - The document is what knobfleet's live-state rule (module_utils knob_live) reads.
version_added: "0.1.0"
author: knobfleet
options:
  service:
    description: The unit name without C(.service).
    type: str
    required: true
  script_path:
    description: The installed serve script.
    type: path
    required: true
  unit_path:
    description: The installed unit.
    type: path
    required: true
  state_dir:
    description: The service's state folder (generations, ledger, lock).
    type: path
    required: true
  health_url:
    description: Health URL to query (empty skips it).
    type: str
    default: ""
  info_url:
    description: The engine's info URL (empty skips it).
    type: str
    default: ""
  http_timeout_s:
    description: Bound of each HTTP request.
    type: float
    default: 2.0
  secret:
    description: Secret env names or patterns; values leave the host only as hashes.
    type: list
    elements: str
    default: []
  secret_key:
    description: The fleet's key for secret markers (knobfleet passes its own); empty shows secrets as C(<secret>).
    type: str
    default: ""
  liveness_url:
    description:
      - An OpenAI completions URL for one bounded one-token completion, a liveness witness where the health URL
        does not generate (empty skips it). C(knobfleet verify) sets it; C(drift) does not.
    type: str
    default: ""
  liveness_timeout_s:
    description: Bound of the liveness completion.
    type: float
    default: 10.0
  version_file:
    description:
      - A file whose first line is the engine's version (its package's version file); empty skips it. The ranks of
        one engine group must run the same version.
    type: str
    default: ""
  launcher:
    description:
      - The launcher argv knobfleet renders for this host; where neither the running engine nor the installed serve
        script names one, the engine package's version is read from this launcher's environment.
    type: list
    elements: str
    default: []
  packages:
    description:
      - The engine's distribution names, in order (the catalog's C(serve.packages)); the probe reports the first
        whose C(<name>-<version>.dist-info/METADATA) the launcher's environment holds. Empty, the module or
        console script the launcher runs.
    type: list
    elements: str
    default: []
notes:
  - Supports check mode (it changes nothing either way).
"""

EXAMPLES = r"""
- name: Observe the engine service
  knobfleet.serving.knob_probe:
    service: sglang-decode
    script_path: /opt/serving/serve_decode.sh
    unit_path: /etc/systemd/system/sglang-decode.service
    state_dir: /var/lib/knobfleet/sglang-decode
    health_url: http://127.0.0.1:30000/health_generate
  register: knob_probe_result
"""

RETURN = r"""
step:
  description: Always C(probe); knobfleet keys results by it.
  returned: always
  type: str
  sample: probe
probe:
  description: The probe document (schema_version 1).
  returned: always
  type: dict
"""

from ansible.module_utils.knob_observe import observe


def probe(p):
    """The probe document for params ``p`` (the module's options). Standard library only: knobfleet's
    SSH fast path runs this same function with ``python3 -I`` over a multiplexed connection, with the
    module_utils it imports shipped alongside."""
    return observe(p)


def main():
    # Imported here, not at the top: the fast path execs this file on hosts without Ansible installed.
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec=dict(
            service=dict(type="str", required=True),
            script_path=dict(type="path", required=True),
            unit_path=dict(type="path", required=True),
            state_dir=dict(type="path", required=True),
            health_url=dict(type="str", default=""),
            info_url=dict(type="str", default=""),
            http_timeout_s=dict(type="float", default=2.0),
            secret=dict(type="list", elements="str", default=[]),
            secret_key=dict(type="str", default="", no_log=True),
            liveness_url=dict(type="str", default=""),
            liveness_timeout_s=dict(type="float", default=10.0),
            version_file=dict(type="str", default=""),
            launcher=dict(type="list", elements="str", default=[]),
            packages=dict(type="list", elements="str", default=[]),
        ),
        supports_check_mode=True,
    )
    module.exit_json(changed=False, step="probe", probe=probe(module.params))


if __name__ == "__main__":
    main()

"""The Ansible inventory the lab writes for the hosts that are up (``nspawn.Lab.write_inventory``), with the group
vars of its engine groups, its vLLM and real-SGLang hosts and its router, and the connection vars that reach them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from knobfleet import paths
from knobfleet.lab import hostfiles, labruntime
from knobfleet.lab.hostfiles import LabHost
from knobfleet.lab.labroot import write

if TYPE_CHECKING:
    from knobfleet.lab.labview import LabView


def ssh_vars(lab: LabView) -> str:
    """Connection vars for Ansible and testinfra: literal paths, no templating needed."""
    return (
        "# Written by `knobfleet lab up`: how to reach the lab hosts. Strict host key checking stays on.\n"
        f"ansible_ssh_private_key_file: {lab.key}\n"
        "ansible_ssh_common_args: >-\n"
        f"  -o UserKnownHostsFile={lab.known_hosts}\n"
        "  -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes -o ConnectTimeout=10\n"
    )


def write_inventory(lab: LabView, hosts: list[LabHost]) -> Path:
    """An inventory for exactly the hosts that are up (``inventories/lab`` lists lab1..lab3), and the
    connection vars of the default lab inventory when this is the default lab."""
    inv = lab.dir / "inventory"
    (inv / "group_vars" / "all").mkdir(parents=True, exist_ok=True)
    lines = [
        "# Written by `knobfleet lab up`; use with -i for labs of other sizes than 3.",
        "all:",
        "  children:",
        "    decode:",
        "      hosts:",
    ]
    vllm_hosts, sglang_hosts = lab.vllm_host_names(), lab.sglang_host_names()
    for host in hosts:
        if host.name not in vllm_hosts | sglang_hosts:
            lines += [f"        {host.name}:", f"          ansible_host: {host.address}"]
    for group, members in (("vllm", vllm_hosts), ("sglang", sglang_hosts)):
        if members & {h.name for h in hosts}:
            lines += [f"    {group}:", "      hosts:"]
            for host in hosts:
                if host.name in members:
                    lines += [f"        {host.name}:", f"          ansible_host: {host.address}"]
    write(inv / "hosts.yml", "\n".join(lines) + "\n")
    default = paths.default_inventory() / "group_vars" / "all"
    shutil.copy2(default / "main.yml", inv / "group_vars" / "all" / "main.yml")
    if vllm_hosts:
        write(inv / "group_vars" / "vllm.yml", lab.vllm_group_vars())
    if sglang_hosts:
        write(inv / "group_vars" / "sglang.yml", lab.sglang_group_vars())
    else:
        (inv / "group_vars" / "sglang.yml").unlink(missing_ok=True)
    groups_yml = inv / "group_vars" / "all" / "groups.yml"
    if lab.group_size():
        write(groups_yml, lab.groups_vars(len(hosts)))
    else:
        groups_yml.unlink(missing_ok=True)
    router_yml = inv / "group_vars" / "all" / "router.yml"
    model = lab.router_model_dir()
    if model:
        from knobfleet.lab.router_lab import LabRouter, router_group_vars

        write(router_yml, router_group_vars(model, LabRouter(lab.dir).port))
    else:
        router_yml.unlink(missing_ok=True)
    runtime_yml, runtime_vars = inv / "group_vars" / "all" / "runtime.yml", labruntime.group_vars(lab.dir)
    if runtime_vars:
        write(runtime_yml, runtime_vars)
    else:
        runtime_yml.unlink(missing_ok=True)
    write(inv / "group_vars" / "all" / "lab_ssh.yml", lab.ssh_vars())
    if lab.identity.slot == 0 and lab.dir == (paths.state_dir() / "lab").resolve() and os.access(default, os.W_OK):
        write(default / "lab_ssh.yml", lab.ssh_vars())
    return inv


def groups_vars(lab: LabView, count: int) -> str:
    """The lab's engine groups (``knob_engine_groups``) and the stand-in's version file, as group vars."""
    import yaml

    doc = {
        "knob_engine_groups": hostfiles.lab_groups(count, lab.group_size()),
        "knob_serve_version_file": hostfiles.SIM_VERSION_FILE,
    }
    return (
        "# Written by `knobfleet lab up --groups N`: each group of N hosts runs one multi-node engine (rank 0\n"
        "# serves the API, the others join it); knobfleet renders each rank's --nnodes/--node-rank/\n"
        "# --dist-init-addr.\n" + yaml.safe_dump(doc, sort_keys=False)
    )


def vllm_group_vars(lab: LabView) -> str:
    """Host vars of the lab's vLLM hosts (group ``vllm``): the engine, its service, launcher and model."""
    from knobfleet.engines.sync import vllm_venv

    inst = lab.vllm or vllm_venv.layout()
    env = "".join(f"  {k}: {v!r}\n" for k, v in sorted(hostfiles.VLLM_ENV.items()))
    return (
        "# Written by `knobfleet lab up --vllm`: these hosts run real vLLM (CPU build) on a tiny local model.\n"
        "knob_engine: vllm\n"
        f"knob_serve_service: {hostfiles.VLLM_SERVICE}\n"
        f"knob_serve_script_path: {hostfiles.VLLM_SCRIPT_PATH}\n"
        f"knob_serve_launcher: [{inst.vllm}]\n"
        f"knob_serve_model_path: {inst.model_dir}\n"
        f"knob_serve_port: {hostfiles.VLLM_PORT}\n"
        "knob_serve_readiness_path: ''\n"
        "knob_serve_readiness_timeout_s: 300\n"
        # Drain on SIGTERM (in-flight requests finish, up to 20 s); TimeoutStopSec covers it with a margin.
        "knob_serve_timeout_stop_s: 45\n"
        "knob_serve_host_args:\n  shutdown-timeout: '20'\n"
        f"knob_serve_host_env:\n{env}"
    )


def sglang_group_vars(lab: LabView) -> str:
    """Host vars of the lab's real-SGLang hosts (group ``sglang``): its service, launcher, model and flags."""
    import yaml

    from knobfleet.lab import sglang_install

    inst = lab.sglang or sglang_install.layout()
    doc = {
        "knob_engine": "sglang",
        "knob_serve_service": hostfiles.SGLANG_SERVICE,
        "knob_serve_script_path": hostfiles.SGLANG_SCRIPT_PATH,
        "knob_serve_launcher": [str(inst.python), "-m", "sglang.launch_server"],
        "knob_serve_model_path": str(inst.model_dir),
        "knob_serve_port": hostfiles.SGLANG_PORT,
        # 40-100 s from start to ready on a loaded 2-core machine (imports dominate), more at --tp 2.
        "knob_serve_readiness_timeout_s": 300,
        "knob_serve_host_args": dict(hostfiles.SGLANG_HOST_ARGS),
        "knob_serve_host_env": dict(hostfiles.SGLANG_ENV),
        **labruntime.engine_group_vars(lab.dir, inst.python, inst.root),
    }
    return (
        "# Written by `knobfleet lab up --sglang`: these hosts run real SGLang 0.5.23 (CPU path, knobfleet's\n"
        "# placeholder sgl_kernel) on a tiny local model.\n" + yaml.safe_dump(doc, sort_keys=False)
    )

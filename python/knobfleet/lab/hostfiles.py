"""What a lab host looks like before knobfleet touches it (pure: file contents only).

Each lab host gets its own sshd config (listening on its loopback address only), its own host key,
the lab's authorized key, a hand-written serve script and unit — the way a hand-managed GPU host
looks — and the stand-in engine installed as the ``sglang_sim`` package, with ``flags.json``: the launch
flags of the SGLang version the catalog was generated from (``sim_flags``), so the stand-in accepts exactly
what that SGLang accepts.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SERVICE = "sglang-dsv4-decode"
SCRIPT_PATH = "/root/serve_dsv4_decode.sh"
SIM_SITE = "/usr/local/lib/python3.11/dist-packages/sglang_sim"
SIM_VERSION_FILE = SIM_SITE + "/VERSION"  # the stand-in's package version (the ranks of a group must agree)
GROUP_DIST_PORT = 5000  # rank 0's rendezvous port in lab groups (groups.DEFAULT_DIST_PORT)
SIM_FLAGS_FILE = "flags.json"  # in the sim package; a committed copy is checked against sim_flags()
SIM_FLAG_FIELDS = ("type", "aliases", "negation", "nargs", "choices", "default", "deprecated")

# Units of the machine's root that a lab host never needs; masking them makes a host boot in seconds.
MASKED_UNITS = (
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "man-db.timer",
    "dpkg-db-backup.timer",
    "e2scrub_all.timer",
    "e2scrub_reap.service",
    "fstrim.timer",
    "logrotate.timer",
    "systemd-tmpfiles-clean.timer",
    "cron.service",
    "console-getty.service",
    "getty@tty1.service",
    "serial-getty@.service",
    "container-getty@.service",
    "postgresql.service",
    "postgresql@.service",
    "nginx.service",
    "redis-server.service",
    "memcached.service",
    "docker.service",
    "containerd.service",
    "rsyslog.service",
    "systemd-networkd.service",
    "systemd-resolved.service",
    "systemd-timesyncd.service",
    "networking.service",
    "ifupdown-pre.service",
    "systemd-networkd-wait-online.service",
    "exim4.service",
    "postfix.service",
    "unattended-upgrades.service",
    "ModemManager.service",
    "NetworkManager.service",
    "avahi-daemon.service",
    "cups.service",
    "bluetooth.service",
    "systemd-journal-flush.service",
    "systemd-update-utmp.service",
    "systemd-update-utmp-runlevel.service",
    "sys-kernel-config.mount",
    "sys-kernel-debug.mount",
    "sys-kernel-tracing.mount",
    "sys-fs-fuse-connections.mount",
    "dev-hugepages.mount",
    "dev-mqueue.mount",
    "tmp.mount",
    "systemd-machine-id-commit.service",
    "systemd-journald-audit.socket",
    "systemd-binfmt.service",
    "systemd-sysusers.service",
    "systemd-pstore.service",
    "systemd-random-seed.service",
    "systemd-logind.service",
)
# What stays enabled from multi-user.target.wants of the machine's root.
# A lab host can run real vLLM (CPU build, tiny local model: knobfleet.lab.vllm_install) instead of the stand-in.
VLLM_SERVICE = "vllm-tiny"
VLLM_SCRIPT_PATH = "/root/serve_vllm.sh"
VLLM_PORT = 8000
# Both cores for 2-3 instances (no binding to core 0), a 1 GiB KV cache, eager mode (every lab host starts with
# an empty compile cache), the dev-mode /server_info that reports the resolved config, nothing from a hub.
VLLM_ENV = {
    "HF_HUB_OFFLINE": "1",
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_SERVER_DEV_MODE": "1",
}
# A lab host can run real SGLang (0.5.23 on its CPU path, the same tiny model: knobfleet.lab.sglang_install).
SGLANG_SERVICE = "sglang-tiny"
SGLANG_SCRIPT_PATH = "/root/serve_sglang.sh"
SGLANG_PORT = 30000
# SGLang's CPU platform is picked only with SGLANG_USE_CPU_ENGINE=1; nothing is loaded from a hub.
SGLANG_ENV = {
    "HF_HUB_OFFLINE": "1",
    "SGLANG_USE_CPU_ENGINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
# The lab's own flags on every launch: the CPU device, a KV pool of 65,536 tokens (SGLang sizes it from the
# machine's RAM otherwise: ~15 M tokens, a minute to allocate) and the /metrics endpoint the router and canary read.
SGLANG_HOST_ARGS: dict[str, str | bool] = {"device": "cpu", "max-total-tokens": "65536", "enable-metrics": True}
KEEP_WANTS = (
    "ssh.service",
    "dbus.service",
    f"{SERVICE}.service",
    f"{VLLM_SERVICE}.service",
    f"{SGLANG_SERVICE}.service",
    "remote-fs.target",
)


@dataclass(frozen=True)
class LabHost:
    """Host ``index`` of the lab in ``slot`` (``labid``): its name is the lab's own (lab1..N in every lab), its
    address, machine name and cgroups are the slot's (127.0.<slot+1>.N; the default lab, slot 0, at 127.0.1.N)."""

    index: int
    slot: int = 0

    @property
    def name(self) -> str:
        return f"lab{self.index}"

    @property
    def address(self) -> str:
        if not 1 <= self.index <= 254:
            raise ValueError("lab host index must be 1..254")
        return f"127.0.{self.slot + 1}.{self.index}"

    @property
    def machine(self) -> str:
        return f"knobfleet-{self.unique}"

    @property
    def unique(self) -> str:
        """The host's name among the labs of every checkout: ``labN`` in slot 0, ``s<slot>-labN`` beyond."""
        return self.name if self.slot == 0 else f"s{self.slot}-{self.name}"


def lab_running(cmdline: list[bytes]) -> tuple[str, Path] | None:
    """(the machine, the folder of its lab) of a ``systemd-nspawn`` that runs a lab host, from that process's argv
    (``--directory`` is ``<lab>/hosts/<name>/root``, as ``Lab._boot`` writes it); None for any other process."""
    if not cmdline or not cmdline[0].endswith(b"systemd-nspawn"):
        return None
    opts = dict(a[2:].partition(b"=")[::2] for a in cmdline[1:] if a.startswith(b"--") and b"=" in a)
    root = Path(os.fsdecode(opts.get(b"directory", b"")))
    if b"machine" not in opts or root.name != "root" or root.parent.parent.name != "hosts":
        return None
    return os.fsdecode(opts[b"machine"]), root.parent.parent.parent


def port_taken(address: str, holder: Path | None) -> str:
    """What to do when ``address``:22 is taken before a lab host boots there: stop the other checkout's lab that
    holds it (``holder``: its lab folder, from ``lab_running``), or free the port from whatever else listens."""
    if holder is not None:
        return (
            f"{address}:22 is taken by the lab of another checkout ({holder}); stop it with "
            f"`KNOBFLEET_STATE_DIR={holder.parent} knobfleet lab down` (or `knobfleet lab down` in that checkout)"
        )
    return f"{address}:22 is already taken by another process; free it (ss -ltnp 'sport = :22') or stop that service"


def sshd_config(host: LabHost) -> str:
    return (
        "# knobfleet lab: this host's sshd listens on its own loopback address only.\n"
        f"ListenAddress {host.address}:22\n"
        "HostKey /etc/ssh/ssh_host_ed25519_key\n"
        "PermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "UsePAM no\n"
        "UseDNS no\n"
        "MaxStartups 200:30:400\n"
        "MaxSessions 200\n"
        "PrintMotd no\n"
    )


SIM_MODEL_PATH = "/models/DeepSeek-V4-sim"


def lab_groups(count: int, size: int) -> dict[str, dict[str, Any]]:
    """``knob_engine_groups`` of a lab of ``count`` hosts in groups of ``size`` consecutive hosts (lab1+lab2 are
    lab-g1, ...): each group one multi-node engine, rank 0 its first host."""
    return {
        f"lab-g{g + 1}": {"members": {f"lab{g * size + r + 1}": r for r in range(size)}} for g in range(count // size)
    }


def rank_of(host: LabHost, size: int) -> tuple[int, LabHost]:
    """``host``'s rank in its lab group and the group's rank 0."""
    rank = (host.index - 1) % size
    return rank, LabHost(host.index - rank, host.slot)


def serve_script(host: LabHost, model_path: str = SIM_MODEL_PATH, group_size: int = 0) -> str:
    """The hand-written serve script an operator left before knobfleet arrived (``model_path``: a local model
    directory when a router must load the model's tokenizer, see ``router_lab``). ``group_size``: the host is a
    rank of a multi-node engine of that many hosts (``lab_groups``), started with SGLang's multi-node flags."""
    ranked = ""
    if group_size > 1:
        rank, head = rank_of(host, group_size)
        ranked = f" \\\n    --nnodes {group_size} --node-rank {rank} --dist-init-addr {head.address}:{GROUP_DIST_PORT}"
    return (
        "#!/bin/bash\n"
        "# DSv4 decode server -- edit TARGET_CTAS here and restart sglang-dsv4-decode\n"
        "export SGLANG_SIM_GPU=rtx-pro-6000\n"
        "export SGLANG_SIM_STARTUP_S=1.5\n"
        "export SGLANG_SIM_TIME_SCALE=0.25\n"
        "export SGLANG_SM120_MMA_TARGET_CTAS=256\n"
        "export SGLANG_OPT_USE_MULTI_STREAM_OVERLAP=0\n"
        f"exec /usr/bin/python3 -m sglang_sim.launch_server --model-path {model_path} \\\n"
        f"    --host {host.address} --port 30000 --tp 2 --trust-remote-code --disable-overlap-schedule{ranked}\n"
    )


def vllm_serve_script(host: LabHost, vllm: str, model: str) -> str:
    """The hand-written vLLM serve script of a vLLM lab host (adopted as generation 0 by the first apply)."""
    env = "".join(f"export {k}={v}\n" for k, v in sorted(VLLM_ENV.items()))
    return (
        "#!/bin/bash\n"
        "# tiny-llama on vLLM (CPU) -- started by hand\n"
        f"{env}"
        f"exec {vllm} serve {model} --host {host.address} --port {VLLM_PORT} \\\n"
        "    --max-model-len 512 --dtype float32 --enforce-eager\n"
    )


def sglang_serve_script(host: LabHost, python: str, model: str) -> str:
    """The hand-written SGLang serve script of an SGLang lab host (adopted as generation 0 by the first apply)."""
    env = "".join(f"export {k}={v}\n" for k, v in sorted(SGLANG_ENV.items()))
    flags = " ".join(f"--{k}" if v is True else f"--{k} {v}" for k, v in SGLANG_HOST_ARGS.items())
    return (
        "#!/bin/bash\n"
        "# tiny-llama on SGLang (CPU) -- started by hand\n"
        f"{env}"
        f"exec {python} -m sglang.launch_server --model-path {model} --host {host.address} --port {SGLANG_PORT} \\\n"
        f"    {flags}\n"
    )


def sglang_serve_unit() -> str:
    return serve_unit("SGLang tiny-llama server", SGLANG_SCRIPT_PATH)


def vllm_serve_unit() -> str:
    return serve_unit("vLLM tiny-llama server", VLLM_SCRIPT_PATH)


def serve_unit(description: str = "SGLang DSv4 decode server", script: str = SCRIPT_PATH) -> str:
    return (
        "[Unit]\n"
        f"Description={description}\n"
        "After=network.target\n"
        "\n"
        "[Service]\n"
        f"ExecStart={script}\n"
        "Restart=always\n"
        "RestartSec=3\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def known_hosts_line(host: LabHost, host_pubkey: str) -> str:
    key_type, key = host_pubkey.split()[:2]
    return f"{host.address} {key_type} {key}\n"


def sim_flags(generated: dict[str, Any], overlay: dict[str, Any] | None = None) -> str:
    """``flags.json`` for the stand-in: every flag of the generated SGLang catalog (plus flags a patch adds,
    from the overlay: those with an ``origin``), with the fields an argparse parser needs. Overlay aliases
    of upstream flags are not added: ``--tp`` is argparse's prefix abbreviation of ``--tp-size`` in SGLang,
    not an option of its own. Deterministic: sorted, one flag a line."""
    knobs: dict[str, dict[str, Any]] = {n: k for n, k in generated["knobs"].items() if k.get("kind") == "flag"}
    for name, patch in ((overlay or {}).get("knobs") or {}).items():
        if patch and patch.get("kind") == "flag" and patch.get("origin") and name not in knobs:
            knobs[name] = patch
    model = generated.get("model") or {}
    head = {
        "engine": generated["engine"],
        "version": str(generated["version"]),
        "required": [model["flag"]] if model.get("style") == "flag" and model.get("flag") else [],
    }
    lines = [
        f"{json.dumps(name)}: {json.dumps({f: knobs[name][f] for f in SIM_FLAG_FIELDS if f in knobs[name]})}"
        for name in sorted(knobs)
    ]
    return json.dumps(head)[:-1] + ', "flags": {\n' + ",\n".join(lines) + "\n}}\n"


def sim_flags_from_catalogs(catalogs: Path | None = None, engine: str = "sglang") -> str:
    """``sim_flags`` of ``<catalogs>/generated/<engine>.yaml`` and its overlay ``<catalogs>/<engine>.overlay.yaml``
    (default: the project's catalogs)."""
    import yaml

    from knobfleet import paths

    base = catalogs or paths.catalogs_dir()
    generated = yaml.safe_load((base / "generated" / f"{engine}.yaml").read_text(encoding="utf-8"))
    overlay_path = base / f"{engine}.overlay.yaml"
    overlay = yaml.safe_load(overlay_path.read_text(encoding="utf-8")) if overlay_path.is_file() else None
    return sim_flags(generated, overlay)


def write_sim_flags(catalogs: Path | None = None) -> Path:
    """Regenerate the sim package's committed ``flags.json`` (after ``knobfleet catalog sync sglang``)."""
    dest = Path(__file__).resolve().parent / "sim" / SIM_FLAGS_FILE
    dest.write_text(sim_flags_from_catalogs(catalogs), encoding="utf-8")
    return dest

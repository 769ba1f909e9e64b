"""What runs the engine on a host: the runtime seam, like the transports' and the engines'. A host picks its runtime
with ``knob_serve_runtime`` (default ``systemd``); each runtime here says what a generation holds and what it
refuses before anything changes, and the same role renders and installs all of them.

===========  ===============================================  =================================================
runtime      a generation holds                               the engine is
===========  ===============================================  =================================================
systemd      the serve script (env exports, ``exec`` of the   the unit's main process; its workers the unit's
             launcher) and the unit (no profile data)          cgroup
docker       the same script, whose ``exec`` is a foreground  the container's process (``docker container
             ``docker run`` of the image by ID (the knobs     inspect``'s host PID), its environ and cmdline
             passed as ``--env NAME``), and the unit, which    read from ``/proc`` on the host, and its process
             removes a leftover container first and stops     tree
             the container itself on stop
podman       the same with ``podman run`` (Debian's 4.3:      the same (``podman container inspect``)
             no Quadlet)
===========  ===============================================  =================================================

The verbs (install, activate, ready, restore, observe) are the role's and the on-host modules', shared by all three:
the run line lives in the serve script, so a generation, its diff in ``plan``, ``drift`` and ``rollback`` carry the
image ID and the run line with no runtime-specific code; the on-host observer finds the engine through the runtime
(module_utils/knob_runtime.py). A new runtime is one entry here, its branch of the two templates, and its view in
knob_runtime; the contract test (tests/unit/test_runtimes.py) runs every entry of ``RUNTIMES``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from knobfleet.module_utils.knob_runtime import BINARIES, VALUED

IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")
# Run options knobfleet writes itself, or that would defeat what it verifies: refused in knob_serve_container_options.
OWN_OPTIONS = {
    "--name": "the container is named after knob_serve_service",
    "--rm": "knobfleet runs the container with --rm",
    "--env": "the knobs are the profile's and the host env's, passed by knobfleet",
    "-e": "the knobs are the profile's and the host env's, passed by knobfleet",
    "--env-file": "the knobs are the profile's and the host env's, passed by knobfleet",
    "--restart": "systemd restarts the engine (knob_serve_restart): a runtime's restart policy would fight it",
    "--detach": "the container runs in the foreground, under the unit",
    "-d": "the container runs in the foreground, under the unit",
    "--pull": "nothing is pulled during a restart: load or pull the image before the apply",
    "--stop-timeout": "the stop grace is knob_serve_timeout_stop_s (it must cover the router's drain)",
    "--entrypoint": "the engine's command comes from the profile and the host vars",
    "--network": "the engine listens on the host's address (--network=host)",
    "--net": "the engine listens on the host's address (--network=host)",
}


@dataclass(frozen=True)
class Runtime:
    """One way to run the engine on a host: ``binary``, the client the serve script execs (None: the engine itself)."""

    name: str
    binary: str | None
    description: str

    @property
    def container(self) -> bool:
        return self.binary is not None

    def problems(self, image: str, options: tuple[str, ...], cache: str = "") -> list[str]:
        """What this runtime refuses in a host's vars before anything changes, one line each (without the host).
        ``cache``: the service's compile-cache folder, which knobfleet mounts at its own path (``--volume``): an
        option mounting anything at, above or inside it is refused."""
        if not self.container:
            if image or options:
                var = "knob_serve_image" if image else "knob_serve_container_options"
                return [f"{var} is set but knob_serve_runtime is systemd: set knob_serve_runtime to docker or podman"]
            return []
        out = []
        if not IMAGE_ID.fullmatch(image):
            out.append(
                f"knob_serve_image must be the image's ID (sha256:<64 hex>), not {image!r}: a generation always runs "
                f"the same image, a tag can move; `{self.binary} image inspect --format '{{{{.Id}}}}' REF` prints it"
            )
        for opt in options:
            name = opt.partition("=")[0]
            if not opt.startswith("--") or ("=" not in opt and name in VALUED):
                out.append(
                    f"knob_serve_container_options: {opt!r}: write each option as one --name=value word "
                    "(a flag alone, such as --init, is one word too)"
                )
            elif name in OWN_OPTIONS:
                out.append(f"knob_serve_container_options: {name} is not yours to set: {OWN_OPTIONS[name]}")
            elif cache and any(_overlaps(cache, t) for t in mount_targets(opt)):
                out.append(
                    f"knob_serve_container_options: {opt!r} mounts over the compile cache {cache}, which knobfleet "
                    "mounts itself: mount elsewhere, or move the cache with knob_serve_compile_cache (false: off)"
                )
        return out


def mount_targets(option: str) -> list[str]:
    """The container paths a ``--volume``, ``--mount`` or ``--tmpfs`` option mounts at (none for other options)."""
    name, _, value = option.partition("=")
    if name == "--volume":
        parts = value.split(":")
        return [parts[1] if len(parts) > 1 else parts[0]]
    if name == "--tmpfs":
        return [value.split(":")[0]]
    if name == "--mount":
        fields = dict(f.partition("=")[::2] for f in value.split(","))
        return [v for k, v in fields.items() if k in ("target", "destination", "dst", "dest")]
    return []


def _overlaps(a: str, b: str) -> bool:
    """Whether one of two container paths is the other or inside it."""
    a, b = a.rstrip("/") or "/", b.rstrip("/") or "/"
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


RUNTIMES: dict[str, Runtime] = {
    "systemd": Runtime("systemd", None, "the serve script execs the engine, the unit's main process"),
    "docker": Runtime("docker", BINARIES["docker"], "the serve script execs a foreground `docker run` of the image"),
    "podman": Runtime("podman", BINARIES["podman"], "the serve script execs a foreground `podman run` of the image"),
}


def runtime(name: str) -> Runtime:
    """The runtime ``name`` (a host var's value, checked by the host vars' validator)."""
    return RUNTIMES[name]

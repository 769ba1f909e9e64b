"""Preflight on GPU hosts, before anything stops: the image's CUDA against what the loaded driver supports, the
loaded kernel module against nvidia-smi's user-space driver, and CDI specs left naming another driver (a stale
``nvidia-ctk cdi generate`` output after a driver upgrade: containers started from it fail). Pure functions, text
in and values out, plus ``preflight``, which turns them into one-line refusals naming the host, the file (or
``nvidia-smi``, or the image) and the fix. A host with neither /proc/driver/nvidia/version nor nvidia-smi output
is a CPU host: nothing is said. Standard library only (no PyYAML: versions are taken out of the YAML or JSON text
with anchored regexes); it runs on the hosts' python3 (3.8+), imported as ``ansible.module_utils.knob_gpu``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: ``typing`` would cost every probe ~5 ms
    from collections.abc import Sequence

    EnvLike = Mapping[str, str] | Sequence[str] | None

PROC_VERSION = "/proc/driver/nvidia/version"
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")  # the CDI spec directories, in the runtimes' order of precedence
CDI_SUFFIXES = (".yaml", ".yml", ".json")
MAX_READ = 4 * 1024 * 1024  # a generated spec is ~20 KiB; anything larger is read only this far
CUDA_LABEL = "com.nvidia.cuda.version"

# NVIDIA's minimum driver per CUDA major release under minor-version compatibility (an application built with any
# toolkit of that major family runs, with a limited feature set, on at least this driver). From the CUDA
# Compatibility guide, "Minor Version Compatibility", Table 1 "CUDA Toolkit 11.x, 12.x, and 13.x Driver Version
# Ranges" (docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html): CUDA 13.x >= 580; CUDA 12.x
# >= 525 (the release notes' table: >= 525.60.13); CUDA 11.x >= 450 (">= 450.80.02 (Linux)", the Tesla
# Recommended Driver from which minor-version compatibility covers the whole 11.x family). Used only when
# nvidia-smi gives no "CUDA Version": it then tells the major family the driver supports, not the minor release.
MVC_MIN_DRIVER = ((13, "580"), (12, "525.60.13"), (11, "450.80.02"))

_NUM = r"(\d{1,6})"
_VERSION = re.compile(r"^\d{1,6}(?:\.\d{1,6}){1,3}$")
_NVRM = re.compile(r"^NVRM version:(.*)$", re.M)
_SMI_CUDA = re.compile(r"CUDA Version\s*:\s*" + _NUM + r"\." + _NUM + r"(?![\d.])")
_SMI_DRIVER = re.compile(r"Driver Version\s*:\s*(\d{1,6}(?:\.\d{1,6}){1,3})(?![\d.])")
_SMI_MISMATCH = re.compile(r"Driver/library version mismatch")
_SMI_NVML = re.compile(r"NVML library version\s*:\s*(\d{1,6}(?:\.\d{1,6}){1,3})(?![\d.])")
_CUDA_PREFIX = re.compile(r"^\s*v?" + _NUM + r"\." + _NUM + r"(?:\.\d{1,6})*\s*$")
_REQUIRE_CUDA = re.compile(r"(?:^|\s)cuda>=" + _NUM + r"\." + _NUM + r"(?![\d.])")
_CDI_KIND = re.compile(r"""^\s*["']?kind["']?\s*:\s*["']?([A-Za-z0-9._/-]{1,253})""", re.M)
# Where a generated spec names the driver: the versioned driver libraries it bind-mounts (libcuda.so.V,
# libnvidia-ml.so.V, libGLX_nvidia.so.V, ...; never the sonames libcuda.so.1), the firmware directory
# /lib/firmware/nvidia/V/ and the enable-cuda-compat hook's --host-driver-version=V. A driver's branch has three
# digits (450 ... 590) or more, which keeps out libnvidia-egl-wayland.so.1.1.19 and its like (not driver-versioned).
_DRV = r"(\d{3,6}\.\d{1,6}(?:\.\d{1,6})?)(?![\w.])"
_CDI_DRIVER = re.compile(
    r"(?:/lib(?:cuda|cudadebugger|nvcuvid|nvoptix|nvidia-[A-Za-z0-9_-]{1,40}|[A-Za-z0-9]{1,20}_nvidia)\.so\."
    + _DRV
    + r"|/firmware/nvidia/"
    + _DRV
    + r"/|--host-driver-version=\s*"
    + _DRV
    + r")"
)


def version_key(version: str) -> tuple[int, ...]:
    """``"580.159.04"`` -> ``(580, 159, 4)``, the order drivers compare in."""
    return tuple(int(p) for p in version.split("."))


def one_line(text: object) -> str:
    """Whatever goes into a refusal, with line breaks and other control characters made visible as ``?``: a
    refusal is one line, even for a file or image name that carries a newline."""
    return "".join(c if c.isprintable() else "?" for c in str(text))


def driver_version(proc_version_text: str | None) -> str | None:
    """The loaded kernel module's version from /proc/driver/nvidia/version: the first dotted number after
    ``NVRM version:`` (``NVIDIA UNIX x86_64 Kernel Module  580.159.04  ...``, or the open module's ``NVIDIA UNIX
    Open Kernel Module for x86_64  580.65.06  Release Build ...``). None when there is none."""
    if not proc_version_text:
        return None
    m = _NVRM.search(proc_version_text)
    if m is None:
        return None
    for word in m.group(1).split():
        if _VERSION.match(word):
            return word
    return None


def smi_cuda_version(smi_text: str | None) -> tuple[int, int] | None:
    """The CUDA version the driver supports, as nvidia-smi's header says it (``CUDA Version: 13.0``; ``nvidia-smi
    -q``'s ``CUDA Version : 13.0`` too)."""
    m = _SMI_CUDA.search(smi_text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def smi_driver_version(smi_text: str | None) -> str | None:
    """The user-space driver nvidia-smi reports (``Driver Version: 580.159.04``)."""
    m = _SMI_DRIVER.search(smi_text or "")
    return m.group(1) if m else None


def smi_mismatch(smi_text: str | None) -> str | None:
    """When nvidia-smi failed with ``Failed to initialize NVML: Driver/library version mismatch``, the user-space
    library's version it names (``NVML library version: 580.159``), or ``""`` if it names none; else None."""
    text = smi_text or ""
    if not _SMI_MISMATCH.search(text):
        return None
    m = _SMI_NVML.search(text)
    return m.group(1) if m else ""


def cuda_version(text: str | None) -> tuple[int, int] | None:
    """``"12.4.1"`` (an image's CUDA_VERSION or its com.nvidia.cuda.version label) -> ``(12, 4)``."""
    m = _CUDA_PREFIX.match(text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def required_cuda(require_text: str | None) -> tuple[int, int] | None:
    """The ``cuda>=X.Y`` of an image's NVIDIA_REQUIRE_CUDA (``cuda>=12.4 brand=tesla,driver>=470,driver<471
    ...``): the brand/driver clauses are alternatives for forward-compatible hardware; ``cuda>=`` holds always."""
    found = [(int(a), int(b)) for a, b in _REQUIRE_CUDA.findall(require_text or "")]
    return max(found) if found else None


def env_map(image_env: EnvLike) -> dict[str, str]:
    """An image's environment as a dict, from a dict or from the ``["K=V", ...]`` list ``docker inspect`` gives."""
    if not image_env:
        return {}
    if isinstance(image_env, Mapping):
        return {str(k): str(v) for k, v in image_env.items()}
    out = {}
    for item in image_env:
        key, sep, value = str(item).partition("=")
        if sep:
            out[key] = value
    return out


def image_cuda(image_env: EnvLike, image_labels: Mapping[str, str] | None) -> tuple[tuple[int, int], str] | None:
    """The CUDA release the image needs and where that was read (``its CUDA_VERSION``, ``its NVIDIA_REQUIRE_CUDA``,
    ``its com.nvidia.cuda.version label``); the highest when they differ. None: the image says nothing of CUDA."""
    env = env_map(image_env)
    found = []
    for value, source in (
        (cuda_version(env.get("CUDA_VERSION")), "its CUDA_VERSION"),
        (required_cuda(env.get("NVIDIA_REQUIRE_CUDA")), "its NVIDIA_REQUIRE_CUDA"),
        (cuda_version((image_labels or {}).get(CUDA_LABEL)), "its %s label" % CUDA_LABEL),
    ):
        if value is not None:
            found.append((value, source))
    if not found:
        return None
    best = max(v for v, _ in found)
    return best, next(s for v, s in found if v == best)


def mvc_major(driver: str) -> int | None:
    """The highest CUDA major family the driver runs under minor-version compatibility (MVC_MIN_DRIVER)."""
    key = version_key(driver)
    for major, minimum in MVC_MIN_DRIVER:
        if key >= version_key(minimum):
            return major
    return None


def fmt_cuda(version: tuple[int, int]) -> str:
    return "%d.%d" % version


def cdi_kind(text: str) -> str | None:
    """The spec's top-level ``kind`` (``nvidia.com/gpu``), from YAML (``kind: nvidia.com/gpu``) or JSON
    (``"kind": "nvidia.com/gpu"``)."""
    m = _CDI_KIND.search(text) or re.search(r""""kind"\s*:\s*"([A-Za-z0-9._/-]{1,253})\"""", text)
    return m.group(1) if m else None


def cdi_driver_versions(text: str | None) -> list[str]:
    """The driver versions a CDI spec names (its versioned driver libraries, firmware directory and
    --host-driver-version), sorted and without repeats; ``[]`` for a spec that names none."""
    found: set[str] = set()
    for groups in _CDI_DRIVER.findall(text or ""):
        found.update(g for g in groups if g)
    return sorted(found, key=version_key)


def is_nvidia_spec(text: str) -> bool:
    """An NVIDIA spec: kind ``nvidia.com/gpu`` (or another ``*.nvidia.com/...`` class such as
    ``management.nvidia.com/gpu``); a spec without a kind counts when it names a driver library."""
    kind = cdi_kind(text)
    if kind is None:
        return bool(cdi_driver_versions(text))
    return kind.startswith("nvidia.com/") or ".nvidia.com/" in kind


def regenerate_command(path: str) -> str:
    fmt = " --format=json" if path.endswith(".json") else ""
    return "nvidia-ctk cdi generate%s --output=%s" % (fmt, path)


def stale_cdi(host: str, loaded: str, where: str, cdi_files: Mapping[str, str]) -> list[str]:
    """One refusal per NVIDIA CDI spec that names a driver other than the loaded one."""
    out = []
    for path in sorted(cdi_files):
        text = cdi_files[path] or ""
        if not is_nvidia_spec(text):
            continue
        other = [v for v in cdi_driver_versions(text) if version_key(v) != version_key(loaded)]
        if other:
            out.append(
                "%s: %s names driver %s but the loaded driver is %s (%s): containers started from it fail; "
                "regenerate it with %s; nothing was stopped"
                % (host, one_line(path), ", ".join(other), loaded, where, one_line(regenerate_command(path)))
            )
    return out


def cuda_refusal(
    host: str, image: str, need: tuple[tuple[int, int], str], loaded: str | None, where: str, smi_text: str | None
) -> str | None:
    """The image's CUDA against the driver's: nvidia-smi's ``CUDA Version`` when it gives one (an image for a
    later minor release is refused, as nvidia-container-cli's ``cuda>=`` check refuses it), else the major family
    MVC_MIN_DRIVER allows for the loaded driver. None when the image fits or nothing can be told."""
    (want, source), driver = need, ("the driver %s (%s)" % (loaded, where) if loaded else "the driver")
    have = smi_cuda_version(smi_text)
    if have is not None:
        if want <= have:
            return None
        supports, ceiling = "CUDA %s (nvidia-smi)" % fmt_cuda(have), fmt_cuda(have)
    else:
        major, oldest = (mvc_major(loaded) if loaded else None), MVC_MIN_DRIVER[-1][0]
        if loaded is None or want[0] <= (major or oldest - 1):
            return None  # fits the major family, or no CUDA Version and no driver: nothing to compare against
        supports = "CUDA %s (NVIDIA's minimum-driver table; nvidia-smi gave no CUDA Version)" % (
            "%d.x" % major if major else "older than %d.0" % oldest
        )
        ceiling = "%d.x" % (major or oldest - 1)
    return (
        "%s: image %s needs CUDA %s (%s) but %s supports %s; use an image built for CUDA <= %s, or upgrade the "
        "driver; nothing was stopped" % (host, one_line(image), fmt_cuda(want), source, driver, supports, ceiling)
    )


def preflight(
    host: str,
    proc_version_text: str | None,
    smi_text: str | None,
    image_env: EnvLike,
    image_labels: Mapping[str, str] | None,
    cdi_files: Mapping[str, str] | None,
    image: str = "",
) -> list[str]:
    """The refusals for one host, each one line naming the host, the file (or nvidia-smi, or the image) and the
    fix; ``[]`` when the engine may go ahead. ``proc_version_text`` is /proc/driver/nvidia/version (None or ""
    when absent), ``smi_text`` nvidia-smi's output (its stderr too: the version-mismatch message is there),
    ``cdi_files`` the specs under /etc/cdi and /var/run/cdi by path, ``image`` the image's reference for the
    message. No driver file and no nvidia-smi output: a CPU host, nothing is said."""
    host = one_line(host)
    if not (proc_version_text or "").strip() and not (smi_text or "").strip():
        return []
    out = []
    loaded, where = driver_version(proc_version_text), PROC_VERSION
    user = smi_driver_version(smi_text)
    mismatch = smi_mismatch(smi_text)
    if loaded and user and version_key(user) != version_key(loaded):
        mismatch = user
    if mismatch is not None:
        out.append(
            "%s: nvidia-smi reports Driver/library version mismatch: the loaded kernel module is %s (%s) but the "
            "user-space driver is %s (the driver was upgraded under a running module); reboot the host or reload "
            "the nvidia kernel modules; nothing was stopped"
            % (host, loaded or "unknown", where, mismatch or "of another version")
        )
    if loaded is None and user:
        loaded, where = user, "nvidia-smi"
    need = image_cuda(image_env, image_labels)
    if need is not None:
        refusal = cuda_refusal(host, image or "the image", need, loaded, where, smi_text)
        if refusal:
            out.append(refusal)
    if loaded and cdi_files:
        out.extend(stale_cdi(host, loaded, where, cdi_files))
    return out


def read_text(path: str, limit: int = MAX_READ) -> str | None:
    """A file's text, at most ``limit`` bytes (undecodable bytes replaced); None when it cannot be read."""
    try:
        with open(path, "rb") as fh:
            return fh.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def read_cdi_files(dirs: Sequence[str] = CDI_DIRS, limit: int = MAX_READ) -> dict[str, str]:
    """The CDI specs on this host (``*.yaml``, ``*.yml``, ``*.json`` directly under each directory), by path;
    anything but a regular file (a FIFO, a device) is passed over, a symlink to one too."""
    out = {}
    for base in dirs:
        try:
            names = sorted(os.listdir(base))
        except OSError:
            continue
        for name in names:
            path = os.path.join(base, name)
            if name.endswith(CDI_SUFFIXES) and os.path.isfile(path):
                text = read_text(path, limit)
                if text is not None:
                    out[path] = text
    return out

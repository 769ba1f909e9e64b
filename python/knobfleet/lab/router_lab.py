"""SGLang's router in front of the lab's engines (``knobfleet lab up --router``): loopback only, no egress.

The router (``router_install``: sglang-router, pinned, cached) runs on this machine, not in a lab host: it
listens on 127.0.0.1:ROUTER_PORT, its Prometheus metrics on 127.0.0.1:PROMETHEUS_PORT (the default lab's; the
other labs' move by their slot, ``labid``), and fronts
``http://127.0.<block>.N:<engine port>`` of every lab host. Its state lives next to the lab's::

    run/router.pid  run/router.log  router.json (url, metrics url, workers, model dir)

On registering a worker the router loads the tokenizer of the worker's model path. The lab's workers report
a local directory that holds one (the tiny vLLM model's), the router runs with HF_HUB_OFFLINE=1 and an empty
HF_HOME, and ``download_attempts`` finds any line of its log that shows it reaching for a hub anyway.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from knobfleet.errors import LabError

ROUTER_HOST = "127.0.0.1"
ROUTER_PORT = 30080
PROMETHEUS_PORT = 30081
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
# What a router log line shows when the router reaches for a model hub: its URLs, a download, a fetch of a
# remote tokenizer. Matched case-insensitively; ``download_attempts`` returns the matching lines.
DOWNLOAD_PATTERNS = (
    r"huggingface\.co",
    r"\bhf\.co\b",
    r"hf-mirror",
    r"modelscope",
    r"download",
    r"hf_hub",
    r"https?://(?!127\.|localhost)",
    r"from hub",
    r"remote tokenizer",
)
_DOWNLOAD_RE = re.compile("|".join(DOWNLOAD_PATTERNS), re.IGNORECASE)
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")


def download_attempts(log_text: str) -> list[str]:
    """Lines of a router log that show a download attempt (pure; ANSI colours removed)."""
    return [line.strip() for line in _ANSI_RE.sub("", log_text).splitlines() if _DOWNLOAD_RE.search(line)]


def is_loopback(url_or_host: str) -> bool:
    host = re.sub(r"^[a-z]+://", "", url_or_host).split("/")[0].rsplit(":", 1)[0]
    return host == "localhost" or bool(re.fullmatch(r"127\.\d{1,3}\.\d{1,3}\.\d{1,3}", host))


def router_argv(
    router: str, workers: list[str], port: int = ROUTER_PORT, prometheus_port: int = PROMETHEUS_PORT
) -> list[str]:
    """The router's command line (pure). Every address is loopback; LabError otherwise."""
    bad = [w for w in workers if not is_loopback(w)]
    if bad:
        raise LabError(f"lab router: workers {', '.join(bad)} are not loopback addresses; the lab never leaves 127/8")
    return [
        router,
        "launch",
        "--host",
        ROUTER_HOST,
        "--port",
        str(port),
        "--worker-urls",
        *workers,
        "--policy",
        "round_robin",
        "--prometheus-host",
        ROUTER_HOST,
        "--prometheus-port",
        str(prometheus_port),
        "--log-level",
        "info",
    ]


def router_env(base: dict[str, str], hf_home: Path) -> dict[str, str]:
    """The router's environment: offline hub switches on, an empty HF_HOME, no proxies (pure)."""
    env = {k: v for k, v in base.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HOME=str(hf_home),
        HF_HUB_DISABLE_TELEMETRY="1",
        NO_PROXY="*",
        no_proxy="*",
    )
    return env


@dataclass(frozen=True)
class RouterInfo:
    url: str
    metrics_url: str
    workers: tuple[str, ...]
    pid: int | None
    log: Path


class LabRouter:
    """Start, wait for, stop the lab's router. State under ``<lab state>/run`` and ``router.json``."""

    def __init__(self, lab_dir: Path, port: int | None = None, prometheus_port: int | None = None) -> None:
        """The router of the lab in ``lab_dir``, on that lab's ports (``labid``: ROUTER_PORT and PROMETHEUS_PORT
        for the default lab, moved by its slot for the others) unless given."""
        from knobfleet import labid

        ident = labid.of(lab_dir)
        self.dir = lab_dir
        self.port = port if port is not None else ident.port(ROUTER_PORT)
        self.prometheus_port = prometheus_port if prometheus_port is not None else ident.port(PROMETHEUS_PORT)
        self.pid_file = lab_dir / "run" / "router.pid"
        self.log = lab_dir / "run" / "router.log"
        self.info_file = lab_dir / "router.json"

    @property
    def url(self) -> str:
        return f"http://{ROUTER_HOST}:{self.port}"

    @property
    def metrics_address(self) -> str:
        """host:port of the router's own Prometheus metrics, as a scrape target."""
        return f"{ROUTER_HOST}:{self.prometheus_port}"

    def pid(self) -> int | None:
        """The router's PID if that process is alive and is the router we started (PID and start time match:
        the router renames itself ``sglang::router``, so its command line cannot tell)."""
        try:
            pid_text, started = self.pid_file.read_text().split()
            pid = int(pid_text)
        except (OSError, ValueError):
            return None
        return pid if _start_time(pid) == started else None

    def start(self, workers: list[str], kind: str = "sglang-router", timeout_s: float = START_TIMEOUT_S) -> RouterInfo:
        """Start the router of ``kind`` (``router_install.KINDS``) in front of ``workers`` (already running one:
        stopped first) and wait until it lists every worker healthy; LabError with the log's tail when it does not
        within ``timeout_s`` (real SGLang workers take 40-100 s to start)."""
        from knobfleet.lab import router_install

        inst = router_install.ensure(kind=kind)
        self.stop()
        argv = router_argv(str(inst.router), workers, self.port, self.prometheus_port)
        (self.dir / "run").mkdir(parents=True, exist_ok=True)
        hf_home = self.dir / "router-hf-home"
        hf_home.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=router_env(dict(os.environ), hf_home),
                start_new_session=True,
                close_fds=True,
                cwd=self.dir / "run",  # smg writes smg.pid into its working directory
            )
        self.pid_file.write_text(f"{proc.pid} {_start_time(proc.pid)}\n")
        self.wait_healthy(workers, proc, timeout_s)
        info = {"url": self.url, "metrics_url": f"http://{ROUTER_HOST}:{self.prometheus_port}/metrics",
                "workers": workers, "log": str(self.log), "kind": kind, "version": inst.version}  # fmt: skip
        self.info_file.write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
        return self.info()

    def wait_healthy(
        self, workers: list[str], proc: subprocess.Popen[bytes] | None = None, timeout_s: float = START_TIMEOUT_S
    ) -> None:
        from knobfleet.fleet.router import RouterError
        from knobfleet.fleet.router_kinds import SGLangRouter

        client = SGLangRouter(self.url, timeout=2.0)
        want = {w.rstrip("/") for w in workers}
        deadline = time.monotonic() + timeout_s
        seen = "not answering"
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise LabError(f"lab router: exited with status {proc.returncode}; last log lines:\n{self.tail()}")
            try:
                listed = {w.url: w.healthy for w in client.list_workers()}
                seen = f"healthy: {sorted(u for u, ok in listed.items() if ok)}"
                if all(listed.get(w) for w in want):
                    return
            except RouterError:
                pass
            time.sleep(0.25)
        raise LabError(
            f"lab router: not every worker healthy after {timeout_s:.0f}s ({seen}); see {self.log}\n{self.tail()}"
        )

    def info(self) -> RouterInfo:
        try:
            data = json.loads(self.info_file.read_text())
        except (OSError, ValueError):
            data = {}
        return RouterInfo(
            self.url,
            f"http://{ROUTER_HOST}:{self.prometheus_port}/metrics",
            tuple(data.get("workers") or ()),
            self.pid(),
            self.log,
        )

    def tail(self, n: int = 15) -> str:
        try:
            lines = _ANSI_RE.sub("", self.log.read_text(errors="replace")).splitlines()
        except OSError:
            return "(no router log)"
        return "\n".join(lines[-n:])

    def stop(self) -> bool:
        """Stop the router we started (by its PID file); True when one was running."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while self.pid() is not None and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.1)
        if self.pid() is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            _reap(pid)
        self.pid_file.unlink(missing_ok=True)
        return True


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks), or None when no such process (or a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else fields[19]


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def router_group_vars(model_dir: str, port: int = ROUTER_PORT) -> str:
    """Group vars of a lab behind the router (``group_vars/all/router.yml`` of the lab's inventory)."""
    return (
        "# Written by `knobfleet lab up --router`: SGLang's router fronts every host's engine on loopback.\n"
        "# The stand-ins report a local model dir that holds a tokenizer, so the router never reaches a hub.\n"
        f"knob_serve_model_path: {model_dir}\n"
        f"knob_router_url: http://{ROUTER_HOST}:{port}\n"
        "knob_router_kind: sglang\n"
        "knob_drain_timeout: 30\n"
        "knob_router_max_unavailable: 1\n"
    )

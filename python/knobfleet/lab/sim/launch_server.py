"""``python3 -m sglang_sim.launch_server --model-path … --port 30000 …``: the stand-in engine's launcher.

Like SGLang's: the flags are SGLang's own (``flags``: generated from the SGLang catalog, prefix
abbreviations such as ``--tp`` included), unknown flags exit 2 with a usage error; knobs are read from
the environment once at start and a bad value ends the process with a traceback-like message; ``--tp N``
starts N scheduler worker processes plus a detokenizer, all inheriting the environment, renaming
themselves like SGLang's (``sglang::scheduler_TP0``, see ``proctitle``) and stopped with the main process.

Stand-in settings (env): SGLANG_SIM_GPU (rtx-pro-6000 | h200 | … from gpus.json), SGLANG_SIM_STARTUP_S
(seconds of 503 before ready, default 3), SGLANG_SIM_TIME_SCALE (multiplies every decode step, default 1; the
lab's host env sets it), SGLANG_SIM_SLOWDOWN (a profile's knob in the lab's tests: multiplies every step too, 1..10,
so a profile can be a known few percent worse: profiles/slower5.yaml),
SGLANG_SIM_NOISE (drift sd, default 0.025; 0 = off), SGLANG_SIM_SEED, and SGLANG_SIM_FAIL for tests:
``start`` (exit 1 during start-up), ``never-ready`` (health stays 503), ``after:<s>`` (exit 3 that many
seconds after becoming ready), and SGLANG_SIM_HANG (a fraction 0..1 of streamed requests that stop sending tokens
after 0-2 of them, status 200, seeded by SGLANG_SIM_SEED; each held until the client leaves, a drain, or
SGLANG_SIM_HANG_MAX_S, default 300: ``hang``), and SGLANG_SIM_WARMUP=1 (slower after each start: ``model.Warmup``).

On SIGTERM it drains like SGLang: ``/health`` turns 503 and new requests get 503 at once, the requests in
flight run to their end, then the process exits; a watchdog (SGLANG_SIM_DRAIN_TIMEOUT_S, default 30) bounds
the wait, and SGLANG_FORCE_SHUTDOWN=1 skips it (SGLang's own switch).

Multi-node (``--nnodes N --node-rank r --dist-init-addr A:P``, see ``cluster``): rank 0 listens on A:P and its
API answers as usual, but ``/health`` and ``/health_generate`` stay 503 until every rank joined with the same
fingerprint (engine env and server args but the per-rank ones, and the engine version: the first line of
``VERSION`` next to the package, else ``__version__``). On a mismatch it hangs in init and logs the difference once,
or with SGLANG_ENABLE_RANK_CONSENSUS_CHECKER=1 exits 1 naming it. Its server info lists the ``ranks`` and whether
each joined. Once the group formed, a rank that leaves ends rank 0 (exit 3, an NCCL-watchdog-like line) unless it
is stopping; on SIGTERM rank 0 stops accepting ranks at once, then drains. A follower (r > 0) starts its workers,
joins rank 0 (retrying for ``--dist-timeout`` s, default 600), then serves only a dummy health endpoint
(``/health`` and ``/health_generate`` 200 whatever the engine does, 404 elsewhere, as SGLang's non-zero ranks);
when rank 0 goes away it exits 3, so systemd restarts it and it joins again; on SIGTERM it exits 0. A rank outside
0..N-1, or N > 1 without ``--dist-init-addr``, is a usage error (exit 2).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import math
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, NoReturn

from . import __version__, flags, hang, model
from .cluster import ConsensusError, Follower, Rendezvous, fingerprint
from .engine import Engine, EngineConfig
from .server import State, make_dummy_health_server, make_server

SECRET_ARGS = ("api_key", "admin_api_key", "ssl_keyfile_password")

KNOB_CHOICES = {
    "SGLANG_SM120_MMA_BLOCK_H": (16, 32, 64),
    "SGLANG_OPT_USE_MULTI_STREAM_OVERLAP": (0, 1),
    "SGLANG_EXPOSE_OWN_ENV_VARS": (0, 1),
}


def build_parser() -> argparse.ArgumentParser:
    """SGLang's launch flags (``flags.json``, generated from the SGLang catalog)."""
    return flags.build_parser()


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, tuple[str, int] | None]:
    """The flags, and the rendezvous address of a multi-node engine (None on one node). A rank outside
    0..nnodes-1, or several nodes without ``--dist-init-addr HOST:PORT``, is a usage error (exit 2)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    nnodes = 1 if args.nnodes is None else args.nnodes
    rank = 0 if args.node_rank is None else args.node_rank
    if nnodes < 1:
        parser.error(f"argument --nnodes: must be at least 1, got {nnodes}")
    if not 0 <= rank < nnodes:
        parser.error(f"argument --node-rank: {rank} is not in 0..{nnodes - 1} (--nnodes {nnodes})")
    if nnodes == 1:
        return args, None
    if not args.dist_init_addr:
        parser.error(f"--nnodes {nnodes} needs --dist-init-addr HOST:PORT (rank 0's rendezvous address)")
    host, sep, port = str(args.dist_init_addr).rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        parser.error(f"argument --dist-init-addr: expected HOST:PORT, got {args.dist_init_addr!r}")
    return args, (host, int(port))


def engine_version() -> str:
    """This engine's version: the first line of ``VERSION`` next to the package (the lab install writes it),
    else the package's ``__version__``. Ranks that run different versions disagree (``cluster.fingerprint``)."""
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "VERSION"), encoding="utf-8") as fh:
            line = fh.readline(128).strip()
    except (OSError, UnicodeDecodeError):
        line = ""
    return line or __version__


def log(msg: str) -> None:
    stamp = dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    print(f"[{stamp}] {msg}", flush=True)


def die(exc_type: str, message: str, where: str = "load_env_knobs") -> NoReturn:
    print("Traceback (most recent call last):", file=sys.stderr)
    print('  File "/sgl-workspace/sglang/python/sglang/launch_server.py", line 14, in <module>', file=sys.stderr)
    print(f'  File "/sgl-workspace/sglang/python/sglang/srt/server_args.py", line 812, in {where}', file=sys.stderr)
    print(f"{exc_type}: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def step_scale(env: dict[str, str]) -> float:
    """What every decode step is multiplied by: SGLANG_SIM_TIME_SCALE (the lab host's) times SGLANG_SIM_SLOWDOWN (a
    profile's); a slowdown that is not a number in 1..10 ends the start like a bad knob."""
    raw = env.get("SGLANG_SIM_SLOWDOWN", "1")
    try:
        slowdown = float(raw)
    except ValueError:
        slowdown = math.nan
    if not 1.0 <= slowdown <= 10.0:
        die("ValueError", f"SGLANG_SIM_SLOWDOWN={raw!r}: expected a factor in 1..10 (1.05 = every step 5% slower)")
    return float(env.get("SGLANG_SIM_TIME_SCALE", "1")) * slowdown


def read_knobs(env: dict[str, str]) -> tuple[model.KernelKnobs, bool, bool]:
    for name, allowed in KNOB_CHOICES.items():
        if name in env:
            try:
                value = int(env[name])
            except ValueError:
                die("ValueError", f"invalid literal for int() with base 10: {env[name]!r} (from {name})")
            if value not in allowed:
                die("ValueError", f"{name}={value} is not supported; expected one of {allowed}")
    try:
        knobs = model.KernelKnobs.from_env({k: v for k, v in env.items() if k in model.KNOB_DEFAULTS})
    except ValueError as exc:
        die("ValueError", str(exc))
    overlap = env.get("SGLANG_OPT_USE_MULTI_STREAM_OVERLAP", "1") == "1"
    expose = env.get("SGLANG_EXPOSE_OWN_ENV_VARS", "0") == "1"
    return knobs, overlap, expose


def spawn_workers(tp: int) -> list[subprocess.Popen[bytes]]:
    names = [f"sglang::scheduler_TP{n}" for n in range(tp)] + ["sglang::detokenizer"]
    # Each worker starts as a plain python process and renames itself (worker.main → set_proctitle), which
    # overwrites its argv and environ area the way SGLang's setproctitle does. The environment is inherited.
    top = sys.modules[str(__package__).split(".")[0]]
    root = os.path.dirname(os.path.dirname(os.path.abspath(str(top.__file__))))
    code = f"import sys; sys.path.insert(0, {root!r}); from {__package__}.worker import main; sys.exit(main())"
    parent = str(os.getpid())  # a worker whose launcher is already gone exits instead of waiting for it
    return [subprocess.Popen([sys.executable, "-c", code, parent, name], stdin=subprocess.DEVNULL) for name in names]


def stop_workers(workers: list[subprocess.Popen[bytes]]) -> None:
    for w in workers:
        if w.poll() is None:
            w.terminate()
    for w in workers:
        try:
            w.wait(timeout=5)
        except subprocess.TimeoutExpired:
            w.kill()


def run_follower(
    args: argparse.Namespace, host: str, port: int, tp: int, rendezvous: tuple[str, int], fp: dict[str, str]
) -> int:
    """A non-zero rank: join rank 0, serve only the dummy health endpoint, exit non-zero when rank 0 goes away
    (systemd restarts it and it joins again), exit 0 on SIGTERM."""
    rank, nnodes = args.node_rank, args.nnodes
    where = f"{rendezvous[0]}:{rendezvous[1]}"
    stopping = threading.Event()
    signalled: list[int] = []

    def shutdown(signum: int, _frame: Any) -> None:
        # A handler never prints: it may run in the middle of the main thread's own print (a reentrant write
        # raises and the process would exit 1). The main loop logs the signal.
        if not stopping.is_set():
            signalled.append(signum)
            stopping.set()

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    workers = spawn_workers(tp)
    follower = Follower(rendezvous[0], rendezvous[1], rank, fp)
    timeout_s = float(args.dist_timeout or 600)
    log(f"Init torch distributed begin. node_rank={rank} nnodes={nnodes} dist_init_addr={where}")
    if not follower.join(stopping, timeout_s):
        stop_workers(workers)
        if stopping.is_set():
            log(f"Received signal {signalled[0]}; shutting down.")
            return 0
        log(f"torch.distributed.DistStoreError: timed out after {timeout_s:g}s waiting for rank 0 at {where}")
        return 1
    if follower.accepted:
        log(f"Init torch distributed ends. Joined rank 0 at {where}.")
    else:  # settings differ (rank 0 logs which) or the rank is taken: hang in init, as the collective would
        log(f"init: rank 0 at {where} did not accept node_rank={rank}; waiting in the first collective.")
    try:
        httpd = make_dummy_health_server(host, port)
    except OSError as exc:
        follower.close()
        stop_workers(workers)
        die("OSError", f"[Errno {exc.errno}] {exc.strerror}: ({host!r}, {port})", "launch_dummy_health_check_server")
    threading.Thread(target=httpd.serve_forever, name="http", daemon=True).start()
    log(f"Dummy health check server running on http://{host}:{port} (node_rank={rank})")
    code = 0
    while not stopping.wait(0.2):
        if follower.lost.is_set() and not stopping.wait(0.3):
            log(
                f"[Rank {rank}] NCCL error: remote process exited or there was a network error "
                f"(rank 0 at {where} is gone); exiting."
            )
            code = 3
            break
        if any(w.poll() is not None for w in workers) and not stopping.wait(0.3):
            log("A scheduler process exited unexpectedly; shutting down.")
            code = 4
            break
    if signalled:
        log(f"Received signal {signalled[0]}; shutting down.")
    follower.close()
    httpd.shutdown()
    httpd.server_close()
    stop_workers(workers)
    return code


@dataclass(frozen=True)
class Setup:
    """What the launcher reads from its flags and environment before it starts anything (``read_setup``)."""

    knobs: model.KernelKnobs
    overlap: bool
    expose: bool
    gpus: dict[str, int]
    gpu: str
    startup: float
    scale: float
    noise: float
    seed: int | None
    fail: str
    host: str
    port: int
    tp: int
    version: str
    server_args: dict[str, Any]
    warmup: bool = False


def read_setup(args: argparse.Namespace, env: dict[str, str]) -> Setup:
    """The knobs (a bad one ends the start first, like SGLang's), the stand-in's settings in the order they are
    checked, and the server args as SGLang logs them (a key's digest, never the key)."""
    knobs, overlap, expose = read_knobs(env)
    gpus = model.load_gpus()
    gpu = env.get("SGLANG_SIM_GPU", "rtx-pro-6000")
    if gpu not in gpus:
        die("KeyError", f"SGLANG_SIM_GPU={gpu!r}; known: {', '.join(sorted(gpus))}", "sim_config")
    startup = float(env.get("SGLANG_SIM_STARTUP_S", "3"))
    scale = step_scale(env)
    noise = float(env.get("SGLANG_SIM_NOISE", str(model.DEFAULT_NOISE)))
    seed = int(env["SGLANG_SIM_SEED"]) if env.get("SGLANG_SIM_SEED") else None
    fail = env.get("SGLANG_SIM_FAIL", "")
    try:
        hang.from_env(env)
    except ValueError as exc:
        die("ValueError", str(exc), "sim_config")
    host, port = args.host or "127.0.0.1", args.port or 30000
    tp = args.tp_size or 1
    version = engine_version()
    server_args: dict[str, Any] = {k: v for k, v in vars(args).items()}
    server_args.update(host=host, port=port, tp_size=tp)
    for name in SECRET_ARGS:  # like SGLang: its server info and log show a digest of a key, never the key
        if server_args.get(name):
            server_args[name] = "sha256:" + hashlib.sha256(str(server_args[name]).encode()).hexdigest()[:12]
    warmup = env.get("SGLANG_SIM_WARMUP", "0").strip().lower() in ("1", "true", "on", "yes")
    return Setup(
        knobs,
        overlap,
        expose,
        gpus,
        gpu,
        startup,
        scale,
        noise,
        seed,
        fail,
        host,
        port,
        tp,
        version,
        server_args,
        warmup,
    )


def main(argv: list[str] | None = None) -> int:
    args, rendezvous = parse_args(argv)
    env = dict(os.environ)
    setup = read_setup(args, env)
    log(f"server_args=ServerArgs({', '.join(f'{k}={v!r}' for k, v in setup.server_args.items())})")
    fp = fingerprint(env, setup.server_args, setup.version)
    if rendezvous is not None and args.node_rank > 0:
        return run_follower(args, setup.host, setup.port, setup.tp, rendezvous, fp)
    return Leader(args, env, setup, rendezvous, fp).run()


class Leader:
    """Rank 0, or the only node: its workers, the engine and its HTTP server, the group it waits for (multi-node),
    its start-up (SGLANG_SIM_FAIL included) and how it ends: a drain on SIGTERM, or a rank or a worker gone."""

    def __init__(
        self,
        args: argparse.Namespace,
        env: dict[str, str],
        setup: Setup,
        rendezvous: tuple[str, int] | None,
        fp: dict[str, str],
    ) -> None:
        s = self.setup = setup
        self.args = args
        self.workers = spawn_workers(s.tp)
        calibration = model.engine_calibration(env)
        wave = "calibrated (" + calibration.fingerprint + ")" if calibration else "uncalibrated"
        log(f"wave model: {wave} for {s.gpu}")
        self.engine = Engine(
            EngineConfig(
                s.knobs,
                s.gpus[s.gpu],
                s.scale,
                s.noise,
                s.overlap,
                args.max_running_requests or 256,
                s.seed,
                calibration,
                s.warmup,
            )
        )
        env_vars = {k: v for k, v in env.items() if k.startswith(("SGLANG_", "SGL_"))}
        state = State(s.server_args, env_vars, self.engine, s.expose, args.served_model_name or args.model_path)
        state.never_ready = s.fail == "never-ready"
        state.worker_pids = [w.pid for w in self.workers]
        state.health_timeout_s = float(env.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
        state.version = s.version
        state.hang = hang.from_env(env)  # checked by read_setup, before anything started
        self.state = state
        try:
            self.httpd = make_server(s.host, s.port, state)
        except OSError as exc:
            for w in self.workers:
                w.terminate()
            die("OSError", f"[Errno {exc.errno}] {exc.strerror}: ({s.host!r}, {s.port})", "launch_server")
        self.group: Rendezvous | None = None
        if rendezvous is not None:
            consensus = env.get("SGLANG_ENABLE_RANK_CONSENSUS_CHECKER", "0") not in ("", "0", "false")
            try:
                self.group = Rendezvous(rendezvous[0], rendezvous[1], args.nnodes, fp, consensus)
            except OSError as exc:
                self.httpd.server_close()
                for w in self.workers:
                    w.terminate()
                die("OSError", f"[Errno {exc.errno}] {exc.strerror}: {rendezvous!r}", "init_distributed_environment")
            state.ranks = self.group.report
        self.exit_code = 0
        self.stopping = threading.Event()
        self.drain_s = float(env.get("SGLANG_SIM_DRAIN_TIMEOUT_S", "30"))
        self.force = env.get("SGLANG_FORCE_SHUTDOWN", "0") not in ("", "0", "false")

    def drain_then_stop(self, signum: int) -> None:
        state, engine, drain_s = self.state, self.engine, self.drain_s
        log(f"Received signal {signum}; draining {state.active} request(s) in flight, then shutting down.")
        deadline = time.monotonic() + drain_s
        while not self.force and state.ready.is_set() and (state.active or engine.num_running or engine.num_waiting):
            if time.monotonic() >= deadline:
                log(f"Graceful shutdown watchdog: {state.active} request(s) still running after {drain_s:g}s; exiting.")
                break
            time.sleep(0.05)
        else:
            log("Graceful shutdown: no request in flight.")
        self.httpd.shutdown()

    def shutdown(self, signum: int, _frame: Any) -> None:
        if self.stopping.is_set():
            return
        self.stopping.set()
        if self.group is not None:  # a rank restarted now must not join this process
            self.group.stop_accepting()
        self.state.draining.set()
        # No print here: the handler may interrupt the main thread's own print (a reentrant write raises).
        threading.Thread(target=self.drain_then_stop, args=(signum,), daemon=True).start()

    def watch_group(self, group: Rendezvous) -> None:
        # Once the group formed, a rank that leaves breaks every collective: NCCL's watchdog ends rank 0.
        while not self.stopping.wait(0.1):
            gone = [p for p in group.report() if not p["joined"]]
            if gone and not self.stopping.wait(0.3):
                who = ", ".join(f"rank {p['rank']} ({p['address']})" for p in gone)
                log(
                    "[PG ID 0 PG GUID 0(default_pg) Rank 0] Process group watchdog thread terminated with exception: "
                    f"NCCL error: remote process exited or there was a network error ({who} is gone)"
                )
                self.exit_code = 3
                self.httpd.shutdown()
                return

    def crash(self, delay: float) -> None:
        time.sleep(delay)
        log(f"Scheduler hit an exception: RuntimeError: NCCL watchdog timeout (SGLANG_SIM_FAIL={self.setup.fail})")
        self.exit_code = 3
        self.httpd.shutdown()

    def run(self) -> int:
        """Serve, start up, then wait for the end; the exit code (0 after a drain, 3 or 4 when something died)."""
        signal.signal(signal.SIGTERM, self.shutdown)
        signal.signal(signal.SIGINT, self.shutdown)
        threading.Thread(target=self.httpd.serve_forever, name="http", daemon=True).start()
        stopped = self.start_up()
        fail = self.setup.fail
        if fail.startswith("after:") and not stopped:
            threading.Thread(target=self.crash, args=(float(fail.split(":", 1)[1]),), daemon=True).start()
        workers = self.workers
        while True:
            time.sleep(0.2)
            # While draining, workers stopped by the same SIGTERM (systemd signals the whole cgroup) end nothing.
            dead = [w for w in workers if w.poll() is not None] if not self.stopping.is_set() else []
            if dead or not any(t.name == "http" for t in threading.enumerate()):
                if dead and self.exit_code == 0 and not self.stopping.wait(0.3):
                    log("A scheduler process exited unexpectedly; shutting down.")
                    self.exit_code = 4
                break
        self.engine.stop()
        self.httpd.server_close()
        if self.group is not None:  # the followers see rank 0 go and exit; systemd restarts them to join the next one
            self.group.close()
        stop_workers(workers)
        return self.exit_code

    def start_up(self) -> bool:
        """Wait for every rank (multi-node), then load and capture like SGLang, ``startup`` seconds in all; the
        engine ready at the end. True when a SIGTERM (or a rank gone) stopped it first."""
        args, s, group, stopping = self.args, self.setup, self.group, self.stopping
        stopped = False
        if group is not None:
            log(f"Init torch distributed begin. node_rank=0 nnodes={args.nnodes} dist_init_addr={args.dist_init_addr}")
            try:
                stopped = not group.wait_ready(stopping, log)
            except ConsensusError as exc:
                group.close()
                self.httpd.server_close()
                for w in self.workers:
                    w.terminate()
                die("RuntimeError", str(exc), "check_rank_consensus")
            if not stopped:
                log(f"Init torch distributed ends. All {args.nnodes} ranks joined.")
                threading.Thread(target=self.watch_group, args=(group,), name="group-watchdog", daemon=True).start()
        if not stopped:
            log(f"Load weight begin. gpu={s.gpu} sms={s.gpus[s.gpu]} tp={s.tp}")
            log(
                f"SM120 MMA decode: TARGET_CTAS={s.knobs.target_ctas} BLOCK_H={s.knobs.block_h} "
                f"NSPLIT_MAX={s.knobs.nsplit_max} MIN_CHUNK={s.knobs.min_chunk} multi_stream_overlap={int(s.overlap)}"
            )
            # SGLang 0.5.23's phases, as its model runner logs them: weights, then the KV pool, then graph capture
            stopped = stopping.wait(s.startup * 0.4)  # a SIGTERM during start-up ends the process at once
            if not stopped:
                log(f"Load weight end. elapsed={s.startup * 0.4:.2f} s, type=SimForCausalLM, mem usage=8.00 GB.")
                stopped = stopping.wait(s.startup * 0.1)
            if not stopped:
                log("Memory pool end. avail mem=10.00 GB")
        if s.fail == "start" and not stopped:
            for w in self.workers:
                w.terminate()
            die(
                "RuntimeError",
                "CUDA error: an illegal memory access was encountered (SGLANG_SIM_FAIL=start)",
                "init_cuda_graphs",
            )
        if not stopped:
            log(
                f"Capture decode CUDA graph begin. backend=triton, max_bs={args.cuda_graph_max_bs_decode}, "
                "avail mem=10.00 GB"
            )
            stopped = stopping.wait(s.startup / 2)
            if not stopped:
                log(f"Capture decode CUDA graph end. elapsed={s.startup / 2:.2f} s, mem usage=0.50 GB.")
        if not stopped and not self.exit_code:
            self.engine.start()
            self.state.ready.set()
            log(f"INFO:     Uvicorn running on http://{s.host}:{s.port} (Press CTRL+C to quit)")
            if not self.state.never_ready:
                log("The server is fired up and ready to roll!")
        return stopped


if __name__ == "__main__":
    sys.exit(main())

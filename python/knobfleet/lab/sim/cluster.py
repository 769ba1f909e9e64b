"""The stand-in as a multi-node engine, like SGLang with ``--nnodes N --node-rank r --dist-init-addr A:P``.

Rank 0 listens on the rendezvous address; each follower connects over real TCP (between lab hosts, on their
loopback addresses), says its rank and its knob fingerprint, and keeps the connection open for the engine's
life. Rank 0 becomes ready only when every rank has joined with the same fingerprint. When they disagree it
hangs in "init" (the real failure mode of a collective over mismatched settings), unless
``SGLANG_ENABLE_RANK_CONSENSUS_CHECKER=1`` asks it to exit with the difference. A follower whose rank 0 goes away
exits, as an NCCL rank does. Followers serve only a dummy health endpoint that always answers 200, as SGLang's
non-zero ranks do: their health proves nothing, rank 0's report of who joined does.

Standard library only (runs on the lab hosts' python3).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Settings that differ between ranks by design: never part of the fingerprint.
PER_RANK_ENV = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA", "CUDA_VISIBLE_DEVICES", "HOSTNAME")
PER_RANK_ARGS = ("node_rank", "host", "port")
HELLO_BYTES = 64 * 1024


class ConsensusError(RuntimeError):
    """The ranks' settings disagree and the consensus checker was asked to stop the engine."""


def fingerprint(env: Mapping[str, str], server_args: Mapping[str, Any], version: str | None = None) -> dict[str, str]:
    """What must agree across ranks: every engine env var and server arg but the per-rank ones, and the engine
    version when given (name -> value), kept whole so a mismatch can be named."""
    out = {
        f"env:{k}": v
        for k, v in env.items()
        if k.startswith(("SGLANG_", "SGL_", "QUANT", "NCCL_", "TORCH_")) and k not in PER_RANK_ENV
    }
    out.update({f"arg:{k}": json.dumps(v, sort_keys=True) for k, v in server_args.items() if k not in PER_RANK_ARGS})
    if version is not None:
        out["meta:engine_version"] = version
    return dict(sorted(out.items()))


def digest(fp: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]


def difference(a: Mapping[str, str], b: Mapping[str, str]) -> str:
    """The first setting on which two fingerprints differ, as ``name: a != b``."""
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            return f"{k.split(':', 1)[1]}: {a.get(k, '<unset>')!s} != {b.get(k, '<unset>')!s}"
    return ""


@dataclass
class Peer:
    rank: int
    address: str
    fingerprint: dict[str, str]
    conn: socket.socket
    connected: bool = True


class Rendezvous:
    """Rank 0's side: accept followers, compare fingerprints, say when the engine may serve."""

    def __init__(self, host: str, port: int, nnodes: int, own: dict[str, str], consensus_exit: bool = False) -> None:
        self.nnodes, self.own, self.consensus_exit = nnodes, own, consensus_exit
        self.peers: dict[int, Peer] = {}
        self.mismatch: str | None = None
        self._lock = threading.Condition()
        self._sock = socket.create_server((host, port), reuse_port=False)
        self._sock.settimeout(0.2)
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name="rendezvous", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, addr = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn, addr[0]), daemon=True).start()

    def _serve(self, conn: socket.socket, address: str) -> None:
        try:
            conn.settimeout(10)
            hello = json.loads(conn.makefile("rb").readline(HELLO_BYTES))
            rank, fp = int(hello["rank"]), {str(k): str(v) for k, v in hello["fingerprint"].items()}
        except (OSError, ValueError, KeyError, TypeError):
            conn.close()
            return
        diff = difference(self.own, fp)
        with self._lock:
            if not 0 < rank < self.nnodes or (rank in self.peers and self.peers[rank].connected):
                with contextlib.suppress(OSError):
                    conn.sendall(b'{"ok": false, "error": "rank taken or out of range"}\n')
                conn.close()
                return
            self.peers[rank] = Peer(rank, address, fp, conn)
            if diff and self.mismatch is None:
                self.mismatch = f"rank {rank} ({address}) {diff}"
            self._lock.notify_all()
        try:
            conn.sendall(json.dumps({"ok": not diff}).encode() + b"\n")
            conn.settimeout(None)
            while conn.recv(1):  # a follower never sends more; an empty read is its end
                pass
        except OSError:
            pass
        with self._lock:
            if self.peers.get(rank) is not None and self.peers[rank].conn is conn:
                self.peers[rank].connected = False
            self._lock.notify_all()

    def wait_ready(self, stop: threading.Event, log: Any = print) -> bool:
        """Block until every rank joined with this rank's fingerprint (True), or ``stop`` is set (False). On a
        mismatch: hang in init (log it once), or raise ConsensusError when the checker is on."""
        told = False
        while not stop.is_set():
            with self._lock:
                joined = sorted(r for r, p in self.peers.items() if p.connected)
                mismatch = self.mismatch
                if mismatch is None and len(joined) == self.nnodes - 1:
                    return True
                if mismatch is not None and self.consensus_exit:
                    raise ConsensusError(f"rank settings differ: {mismatch}")
                if mismatch is not None and not told:
                    log(f"init: waiting in the first collective: {mismatch} (ranks disagree; this hangs)")
                    told = True
                self._lock.wait(timeout=0.2)
        return False

    def report(self) -> list[dict[str, Any]]:
        with self._lock:
            return [
                {
                    "rank": r,
                    "joined": bool(self.peers.get(r) and self.peers[r].connected),
                    "address": self.peers[r].address if r in self.peers else None,
                    "fingerprint": digest(self.peers[r].fingerprint) if r in self.peers else None,
                }
                for r in range(1, self.nnodes)
            ]

    def stop_accepting(self) -> None:
        """Close the listening socket (a rank that starts now finds no one there); joined ranks stay connected."""
        self._closed.set()
        with contextlib.suppress(OSError):  # stops listening at once, even while the accept thread polls it
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    def close(self) -> None:
        self.stop_accepting()
        with self._lock:
            for p in self.peers.values():
                with contextlib.suppress(OSError):
                    p.conn.shutdown(socket.SHUT_RDWR)
                p.conn.close()


class Follower:
    """A non-zero rank: join rank 0 and stay joined; ``lost`` is set when rank 0 goes away."""

    def __init__(self, address: str, port: int, rank: int, fp: dict[str, str]) -> None:
        self.address, self.port, self.rank, self.fp = address, port, rank, fp
        self.lost = threading.Event()
        self.accepted: bool | None = None
        self._conn: socket.socket | None = None

    def join(self, stop: threading.Event, timeout_s: float = 600.0) -> bool:
        """Connect (retrying while rank 0 starts), say hello; True once rank 0 has the connection."""
        deadline = time.monotonic() + timeout_s
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                conn = socket.create_connection((self.address, self.port), timeout=2)
            except OSError:
                stop.wait(0.2)
                continue
            conn.sendall(json.dumps({"rank": self.rank, "fingerprint": self.fp}).encode() + b"\n")
            conn.settimeout(10)
            try:
                reply = json.loads(conn.makefile("rb").readline(HELLO_BYTES) or b"{}")
            except (OSError, ValueError):
                conn.close()
                stop.wait(0.2)
                continue
            self.accepted = bool(reply.get("ok"))
            conn.settimeout(None)
            self._conn = conn
            threading.Thread(target=self._watch, name="rank0-watch", daemon=True).start()
            return True
        return False

    def _watch(self) -> None:
        assert self._conn is not None
        try:
            while self._conn.recv(1):
                pass
        except OSError:
            pass
        self.lost.set()

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.shutdown(socket.SHUT_RDWR)
            self._conn.close()

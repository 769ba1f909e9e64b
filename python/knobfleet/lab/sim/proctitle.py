"""``set_proctitle``: rename this process the way the ``setproctitle`` library does on Linux (stdlib only).

SGLang names its scheduler processes with ``setproctitle.setproctitle("sglang::scheduler_TP0")``. On Linux
that library writes the title over the memory holding the process's argv strings and, unless
``SPT_NOENV`` is set, the environ strings that follow them, padding with NUL bytes. The kernel serves
``/proc/PID/cmdline`` and ``/proc/PID/environ`` from that memory, so afterwards cmdline shows just the
title and environ no longer shows the variables the process started with, although they are still in
effect: the library first moves the C ``environ`` strings to the heap (children and ``getenv`` keep
them) and Python's ``os.environ`` is a copy made at start. ``SPT_NOENV`` (any value) limits the title
to the argv area and leaves environ intact. ``/proc/PID/comm`` is set with ``prctl(PR_SET_NAME)``.

The addresses come from ``/proc/self/stat`` (arg_start, arg_end, env_start, env_end; Linux >= 3.5).
"""

from __future__ import annotations

import ctypes
import os

PR_SET_NAME = 15
COMM_LEN = 15


def memory_areas() -> tuple[int, int, int, int]:
    """(arg_start, arg_end, env_start, env_end) of this process, from ``/proc/self/stat``."""
    with open("/proc/self/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2 :].split()  # fields from 3 (state) on; comm may hold spaces
    arg_start, arg_end, env_start, env_end = (int(x) for x in fields[48 - 3 : 52 - 3])
    return arg_start, arg_end, env_start, env_end


def _move_environ_to_heap(libc: ctypes.CDLL, lo: int, hi: int) -> None:
    """Point every C ``environ`` entry that lies in [lo, hi) at a heap copy, as setproctitle does."""
    libc.strdup.restype = ctypes.c_void_p
    libc.strdup.argtypes = [ctypes.c_void_p]
    environ = ctypes.POINTER(ctypes.c_void_p).in_dll(libc, "environ")
    i = 0
    while environ[i]:
        p = environ[i]
        if p is not None and lo <= p < hi:
            copy = libc.strdup(p)
            if not copy:
                raise MemoryError("strdup")
            environ[i] = copy
        i += 1


def set_proctitle(title: str) -> None:
    """Rename this process (see the module doc). Linux only; a no-op where /proc or libc is missing."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        arg_start, arg_end, env_start, env_end = memory_areas()
    except (OSError, ValueError, IndexError):
        return
    keep_env = "SPT_NOENV" in os.environ
    end = arg_end
    if not keep_env and env_start == arg_end and env_end > env_start:
        _move_environ_to_heap(libc, env_start, env_end)
        end = env_end
    size = end - arg_start
    if size <= 1:
        return
    raw = title.encode("utf-8")[: size - 1]
    ctypes.memmove(arg_start, raw + b"\0" * (size - len(raw)), size)
    libc.prctl(PR_SET_NAME, ctypes.c_char_p(title.encode("utf-8")[:COMM_LEN]), 0, 0, 0)

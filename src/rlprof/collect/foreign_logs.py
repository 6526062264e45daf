"""Lines that libraries print into the user's terminal from C++ and that tell a profiler user nothing.

Kineto writes `USDT:... profiler_start` / `profiler_stop` (and `STAGE:...` at some log levels) to file descriptor 2
at every window, whatever KINETO_LOG_LEVEL says, in the middle of rlprof's own output. Only a filter on the
descriptor keeps them off the screen: while `foreign_log_filter()` is open, fd 2 is a pipe whose lines are copied to
the real stderr unless they are such a line. Nothing else is held back, and `RLPROF_VERBOSE=1` (or `rlprof train
--verbose`) turns the filter off. A fatal error (a crash in C code) is reported on the real stderr with every
thread's Python stack (faulthandler), never into the pipe, whose pump dies with the process.

torch's own C++ warnings (`[W1127 10:55:30.524585457 collection.cpp:664] Warning: ...`, c10's format, not glog's) pass,
but for one that names a range of rlprof's (`Warning: rlprof:mini_batch:0 (function operator())`): torch's profiler
says so of a range still open when a cycle stops. The torch backend closes its ranges at a cycle's edge
(`backends/torch_backend.py`), so this is only a range another thread held open there; the trace keeps it.
"""

from __future__ import annotations

import faulthandler
import functools
import os
import re
import sys
import threading
from contextlib import contextmanager

from .preemption import before_exit_by_signal, forget

# Kineto's glog-style lines ("USDT:2026-11-25 17:44:11 5938:5938 SyncActivityProfilerHandler.cpp:52] profiler_start"),
# and torch's warning naming a range of rlprof's (above)
DROPPED_LINE = re.compile(
    rb"^(?:(?:USDT|STAGE):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ [\w.]+\.cpp:\d+\] "
    rb"|\[W\d{4} [\d:.]+ (?:\d+ )?[\w.]+\.cpp:\d+\] Warning: rlprof:)"
)


def verbose_requested() -> bool:
    return os.environ.get("RLPROF_VERBOSE", "") not in ("", "0")


def _pump(read_fd: int, out_fd: int) -> None:
    """Copies the pipe to the real stderr line by line, dropping the lines above, until every writer has closed it."""
    pending = b""
    with os.fdopen(read_fd, "rb", buffering=0) as pipe:
        while chunk := pipe.read(65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            kept = b"".join(line + b"\n" for line in lines if not DROPPED_LINE.match(line))
            if kept:
                os.write(out_fd, kept)
    if pending and not DROPPED_LINE.match(pending):
        os.write(out_fd, pending)


@contextmanager
def foreign_log_filter(enabled: bool = True):
    """Keeps Kineto's C++ log lines off stderr inside the block. Never fails the block it wraps: where fd 2 cannot
    be redirected, the block runs unfiltered."""
    if not enabled or verbose_requested():
        yield
        return
    try:
        sys.stderr.flush()
        real_stderr = os.dup(2)
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 2)
        os.close(write_fd)
    except OSError:
        yield
        return
    pump = threading.Thread(target=_pump, args=(read_fd, real_stderr), name="rlprof-stderr-filter", daemon=True)
    pump.start()
    # a fatal error's report (a crash in C: the stacks of every thread) goes to the real stderr: written into the
    # pipe, it would die unread with the process that holds the pump
    said_before = faulthandler.is_enabled()
    faulthandler.enable(file=real_stderr, all_threads=True)

    def drain(timeout: float = 5) -> None:
        sys.stderr.flush()
        os.dup2(real_stderr, 2)  # the pipe's last writer in this process closes: the pump drains and ends
        pump.join(timeout=timeout)

    # a signal that ends the process (collect/preemption.py) first drains what is in the pipe to the real stderr
    before_exit = functools.partial(drain, 1)
    before_exit_by_signal(before_exit)
    try:
        yield
    finally:
        forget(before_exit)
        drain()
        if said_before:
            faulthandler.enable(file=sys.stderr, all_threads=True)
        else:
            faulthandler.disable()
        if not pump.is_alive():  # a child process still holding the pipe keeps the pump (and this fd) alive
            os.close(real_stderr)

"""A terminating signal while collecting: Slurm, Kubernetes and torchrun preempt a job with SIGTERM, a user stops
one with Ctrl-C (SIGINT). rlprof then finishes the windows in flight, within a grace time (`RLPROF_SIGNAL_GRACE_S`,
default 20 s: Kubernetes and Slurm send SIGKILL 30 s after SIGTERM by default), and lists those it could not finish
as partial; then the signal does what it would have done: the handler that was there before is called (Python's
KeyboardInterrupt for SIGINT, a host's own handler), or, where there was none, the signal is raised again with the
default action, so the process ends by it, with the same status.

Never replaces a host's handler: it chains it. Installed once per process, from its main thread only (Python runs
signal handlers there, and only there may they be set), and only over a handler Python can call (not over SIG_IGN,
nor over one installed from C). A host that installs its own handler after rlprof's replaces it: that is the host's
choice, and its own exit path (SystemExit) still closes the Profiler at exit.

A signal can land between any two bytecodes of the main thread, inside rlprof's own bookkeeping too (a manifest row
half appended under its file lock, a window half opened): those few places run `with HELD:`, and a signal that lands
inside one is taken as soon as it ends. A second signal while the first is being taken goes straight on (a second
Ctrl-C ends the process now).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
import weakref

from ..warn_once import warn_once

log = logging.getLogger("rlprof")

GRACE_ENV = "RLPROF_SIGNAL_GRACE_S"
DEFAULT_GRACE_S = 20.0
SIGNALS = (signal.SIGTERM, signal.SIGINT)

_owners: "weakref.WeakSet" = weakref.WeakSet()  # what finishes on a signal: Profilers, the verl plugin's samplers
_previous: dict[int, object] = {}  # signal -> the handler rlprof's chains
_pending: list[tuple[int, object]] = []  # signals that landed inside a held section
_depth = 0  # how many held sections the main thread is inside
_taking = False  # a signal is being taken now
_before_exit: list = []  # callables run just before the signal ends the process (stderr's filter drained)


def grace_seconds() -> float:
    try:
        return max(0.0, float(os.environ.get(GRACE_ENV, DEFAULT_GRACE_S)))
    except ValueError:
        return DEFAULT_GRACE_S


class _Held:
    """`with HELD:` a signal that lands inside is taken when the outermost held section ends (main thread only:
    Python runs signal handlers in the main thread, so only its sections can be interrupted by one)."""

    __slots__ = ()

    def __enter__(self):
        global _depth
        if threading.get_ident() == threading.main_thread().ident:
            _depth += 1
        return self

    def __exit__(self, *exc):
        global _depth
        if threading.get_ident() == threading.main_thread().ident:
            _depth -= 1
            if not _depth and _pending:
                signum, frame = _pending.pop(0)
                _pending.clear()
                _take(signum, frame)
        return False


HELD = _Held()


def finish_on_signal(owner) -> None:
    """`owner.finish_on_signal(deadline, why) -> str` is called on SIGTERM or SIGINT (what it did, for the one line
    said; "" for nothing); the handlers are installed here on first use. A fault installing them is one warning."""
    _owners.add(owner)
    if len(_previous) == len(SIGNALS) or threading.current_thread() is not threading.main_thread():
        return  # installed already; or not the main thread, where handlers cannot be set (collection goes on)
    for signum in SIGNALS:
        if signum in _previous:
            continue
        try:
            current = signal.getsignal(signum)
            if current is None or current is signal.SIG_IGN:
                _previous[signum] = None  # a handler from C, or the signal ignored: left as it is
                continue
            _previous[signum] = current
            signal.signal(signum, _handle)
        except (ValueError, OSError, RuntimeError) as exc:
            _previous[signum] = None
            warn_once(
                ("signal", signum),
                "rlprof: could not watch %s (%s: %s); on it, windows in flight are left to `rlprof analyze`, "
                "training goes on",
                signal.Signals(signum).name,
                type(exc).__name__,
                exc,
            )


def before_exit_by_signal(callback) -> None:
    """`callback()` runs just before a signal ends the process with its default action (not when a handler it
    chains to runs: the process may go on, and its own exit path runs). `forget` takes it back."""
    _before_exit.append(callback)


def forget(callback) -> None:
    if callback in _before_exit:
        _before_exit.remove(callback)


def _handle(signum, frame) -> None:
    if _depth > 0:
        _pending.append((signum, frame))  # inside rlprof's own bookkeeping: taken when it ends
        return
    _take(signum, frame)


def _take(signum, frame) -> None:
    global _taking
    if not _taking:
        _taking = True
        try:
            _finish(signal.Signals(signum).name)
        except Exception as exc:  # finishing is best effort: the signal goes on whatever happens here
            log.warning("rlprof: finishing the windows on a signal failed: %s: %s", type(exc).__name__, exc)
        finally:
            _taking = False
    _chain(signum, frame)


def _finish(name: str) -> None:
    grace = grace_seconds()
    deadline = time.monotonic() + grace
    said = []
    for owner in list(_owners):
        what = owner.finish_on_signal(deadline, f"cut short by {name}")
        if what:
            said.append(what)
    if said:
        log.warning("rlprof: %s: %s (grace %g s); the signal goes on", name, "; ".join(said), grace)


def _chain(signum, frame) -> None:
    """What the signal would have done without rlprof."""
    previous = _previous.get(signum)
    if callable(previous):
        previous(signum, frame)
        return
    for stream in (sys.stdout, sys.stderr):  # the process ends now: what it printed is not lost
        try:
            stream.flush()
        except Exception:
            pass
    for callback in list(_before_exit):
        try:
            callback()
        except Exception:
            pass
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


__all__ = ["HELD", "finish_on_signal", "before_exit_by_signal", "forget", "grace_seconds", "GRACE_ENV"]

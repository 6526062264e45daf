"""A collection window's life, the one copy both the Profiler and the verl plugin's sampler use: a backend started on
one spec, its ranges and schedule steps guarded, stopped once, each raw output finalized within the plan's byte
budget; and, for the Profiler, every window's manifest row and its analysis on collection (`WindowWriter`).

A fault in any phase is the window's owner's to say (`on_fault`); the window is then failed, its backend released and
its raw outputs dropped, and training goes on. A strict plan raises instead. A full disk, an I/O error or a vanished
directory is such a fault wherever it strikes (the export, the final trace, the manifest row): nothing is left under a
trace's name but a whole trace (analyze/inputs/salvage.py names the steps a window leaves on disk, which `rlprof analyze`
reads back after a crash). On a terminating signal (collect/preemption.py) the writer finishes what it can within the
grace time and lists the rest as partial.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Callable

from ..analyze.inputs.salvage import open_mark
from ..config.plan import RolePlan
from ..errors import CollectError
from ..analyze.inputs.host_stacks_file import stacks_path
from ..warn_once import warn_once
from .backends import Backend, Output, WindowSpec
from .cpu_wait import sample, since
from .device_record import accelerator, device_record, measure_cpu
from .host_stacks import HostSampler, cap_for, say_fault
from .manifest import append_row
from .preemption import HELD
from .scopes import NULL
from .tracefile import finalize_trace

log = logging.getLogger("rlprof")

CHROME_TRACE_TOOLS = ("torch", "markers")  # the tools whose windows are Chrome traces: the host's stacks go beside them

# on_fault(window, message, phase, exc, already_failed): the owner says it (a warning, a manifest row)
FaultHandler = Callable[["Window", str, str, BaseException, bool], None]


class Window:
    """One collection window: a backend instance plus what the manifest needs to know."""

    __slots__ = (
        "spec",
        "backend",
        "failed",
        "start_ns",
        "closed",
        "threads_at_start",
        "cpu",
        "trigger",
        "probe",
        "on_fault",
        "mark",
        "host",
    )

    def __init__(self, spec: WindowSpec, on_fault: FaultHandler, watch_load: bool = True, mark_open: bool = False):
        self.spec, self.on_fault = spec, on_fault
        # `.{window}.open` while it records (a run directory of rlprof's): a kill before its export is written
        # leaves the mark, and `rlprof analyze` names the window as lost rather than not at all
        self.mark = open_mark(spec.run_dir, spec.base_name(None)) if mark_open else None
        self.backend: Backend | None = None
        self.failed = False
        self.closed = False
        self.start_ns = time.time_ns()
        # the machine's load on this window: cpu_wait.since at its close
        self.threads_at_start = sample() if watch_load else None
        self.cpu: dict = {}
        self.trigger: dict | None = None  # why the trigger captured this window (the manifest row's `trigger`)
        self.probe = False  # keep: slow_only: kept only if its step turns out slow
        self.host: HostSampler | None = None  # the host's Python stacks while the window is open (host_stacks.py)

    @property
    def plan(self) -> RolePlan:
        return self.spec.plan

    def start(self, factory: Callable[[WindowSpec], Backend]) -> bool:
        """Build the backend and start it; False (the fault said) where either fails (a directory that cannot be
        made included: a full disk, a vanished parent)."""
        try:
            self.spec.run_dir.mkdir(parents=True, exist_ok=True)
            if self.mark is not None:
                try:
                    self.mark.touch()
                except OSError:
                    self.mark = None  # the window goes on; only its mark is missing
            self.backend = factory(self.spec)
            self.backend.start()
        except Exception as exc:
            self.fault("start", exc)
            return False
        if self.plan.host_stacks and self.plan.tool in CHROME_TRACE_TOOLS:
            self._start_host()
        return True

    def _start_host(self) -> None:
        """The host sampler beside the backend: a fault starting it is one warning, and the window goes on."""
        try:
            host = HostSampler(cap_bytes=cap_for(self.plan.max_bytes_per_window))
            host.start()
        except Exception as exc:
            say_fault(exc)
            return
        self.host = host

    def _stop_host(self) -> None:
        if self.host is not None:
            self.host.stop()

    def range(self, name: str):
        if self.failed:
            return NULL
        return _GuardedRange(self, name)

    def tick(self) -> None:
        if self.failed:
            return
        try:
            self.backend.step()
        except Exception as exc:
            self.fault("step", exc)

    def stop(self) -> list[Output] | None:
        """Close the window: what its backend wrote, or None where it failed (before, or in stopping)."""
        self.closed = True
        try:
            if self.failed:
                return None
            self._stop_host()  # before the backend's stop: its export is not the host's
            if self.threads_at_start is not None:
                self.cpu = since(self.threads_at_start)  # before the backend's export, which is rlprof's own time
            try:
                return self.backend.stop()
            except Exception as exc:
                self.fault("stop", exc, stopped=True)
                return None
        finally:
            self._unmark()  # its raw exports (named by the window) or its failed row account for it from here

    def _unmark(self) -> None:
        mark, self.mark = self.mark, None
        if mark is not None:
            try:
                mark.unlink(missing_ok=True)
            except OSError:
                pass

    def finalize(self, out: Output, dest: Path, meta: dict) -> bool:
        """A raw Chrome trace becomes its final file `dest`, `meta` inside, cut to the plan's byte budget (True:
        truncated); the raw file is removed once written, or on a fault (the window is then failed). Interrupted by
        the process's end (SystemExit, KeyboardInterrupt), the raw export stays for `rlprof analyze` to recover.
        The host's stacks of the output's span are written first, beside `dest`, and the trace gets what they leave
        of the budget."""
        budget = self.plan.max_bytes_per_window
        stacks = self._write_host(out, dest, meta)
        if stacks is not None:
            meta["host_stacks"] = stacks
            if budget is not None:
                budget = max(1, budget - stacks["bytes"])
        try:
            out.bytes, truncated = finalize_trace(out.path, dest, meta, budget)
        except Exception:
            out.path.unlink(missing_ok=True)
            raise
        out.path.unlink(missing_ok=True)
        out.path = dest
        out.host_stacks = stacks
        if truncated:
            out.status = "truncated"
        return truncated

    def _write_host(self, out: Output, dest: Path, meta: dict) -> dict | None:
        """The host's stacks of `out`'s span beside `dest`: what the manifest row says of them, or None (none
        sampled, or a fault writing them: one warning, and the trace is written without them)."""
        host = self.host
        if host is None or not host.samples:
            return None
        window = {k: meta.get(k) for k in ("step", "role", "stage", "rank")} | {"trace": dest.name}
        try:
            size = host.write(dest, out.start_ns, out.end_ns, window)
        except Exception as exc:
            if self.plan.strict:
                raise
            warn_once(  # said once, naming no window: the window's own fault, if any, is its one line
                ("host-stacks-write", type(exc).__name__, getattr(exc, "errno", None)),
                "rlprof: the host stacks could not be written (%s: %s); traces are written without them, training "
                "goes on",
                type(exc).__name__,
                getattr(exc, "strerror", None) or exc,
            )
            return None
        return {"path": stacks_path(dest).name, "bytes": size, "truncated": host.truncated}

    def fault(self, phase: str, exc: BaseException, stopped: bool = False) -> None:
        """A backend failure: strict plans raise; otherwise the owner says it, the window is failed and its backend
        released (so later windows can start), and training goes on."""
        subject = f"{self.plan.tool} backend" if phase in ("start", "step", "range", "stop") else "rlprof"
        message = f"{subject} failed to {phase} window {self.spec.base_name(None)}: {type(exc).__name__}: {exc}"
        if self.plan.strict:
            self.failed = True
            raise CollectError(message) from exc
        already = self.failed
        self.failed = True
        self._stop_host()
        self.on_fault(self, message, phase, exc, already)
        if not stopped and phase != "start" and self.backend is not None:
            try:
                discard(self.backend.stop())
            except Exception:
                pass


class _GuardedRange:
    """A backend range whose failures are profiler faults, never training errors."""

    __slots__ = ("window", "name", "inner")

    def __init__(self, window: Window, name: str):
        self.window, self.name, self.inner = window, name, None

    def __enter__(self):
        try:
            self.inner = self.window.backend.range(self.name)
            self.inner.__enter__()
        except Exception as exc:
            self.inner = None
            self.window.fault("range", exc)
        return self

    def __exit__(self, *exc):
        if self.inner is not None and not self.window.failed:
            try:
                self.inner.__exit__(*exc)
            except Exception as err:
                self.window.fault("range", err)
        return False


def discard(outputs) -> None:
    """Drop what a window wrote but will not keep (raw traces only: a tool's own directories are the tool's)."""
    for out in outputs or ():
        if out.finalize_to is not None and out.path is not None:
            out.path.unlink(missing_ok=True)


class WindowWriter:
    """The Profiler's finished windows on disk: each output finalized (in the background unless the plan is strict),
    its manifest row appended, its analysis on collection submitted. Nothing here raises into training but a strict
    plan's fault: a write that fails is the window's fault (`Window.fault`)."""

    def __init__(self, run_id: str, roles: tuple[str, ...], where: dict, measure: bool = False):
        self.run_id, self.roles, self.where = run_id, roles, where
        self.written = 0
        # `measure` (a process that collects): its CPU measured now, at collection start, once per process, where it
        # computes on no accelerator (collect/device_record.py); every row says the device
        self.measured_cpu = measure_cpu() if measure and accelerator() is None else None
        self._lock = threading.Lock()
        self._finalizer: ThreadPoolExecutor | None = None
        self._pending: list[tuple[Future, Window, Output, Path | None]] = []
        self._analysis = None
        self._cut = False  # a signal's grace time ran out: what is still being written is listed as partial
        # windows being written in the background now, and how many such writes have ended: a step they overlap
        # carries their cost (the watch flags it, collect/watching.py)
        self.in_flight = 0
        self.finished = 0

    def write(self, w: Window, outputs: list[Output]) -> None:
        for out in outputs:
            if w.plan.strict:
                with HELD:  # a row appended here, under its file lock, is never re-entered by a signal's closing
                    self._finish(w, out)
            else:
                if self._finalizer is None:
                    self._finalizer = ThreadPoolExecutor(1, thread_name_prefix="rlprof-finalize")
                with self._lock:
                    self.in_flight += 1
                future = self._finalizer.submit(self._finish_quietly, w, out)
                self._pending.append((future, w, out, out.path if out.finalize_to is not None else None))

    def failed_row(self, w: Window, message: str) -> str | None:
        """The window's row, marked failed; None once written, else why it could not be (a full disk)."""
        try:
            with HELD, self._lock:
                append_row(w.spec.run_dir, self.row(w, None, error=message))
        except OSError as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    def wait(self, deadline: float | None = None, why: str = "") -> int:
        """Block until every window written so far is on disk, with its manifest row; with a `deadline`
        (time.monotonic), at most until then: each window still being written is then listed as partial, its raw
        export kept (what `rlprof analyze` reads it from). Returns how many were listed as partial."""
        pending, self._pending = self._pending, []
        late = []
        for fut, w, out, raw in pending:
            try:
                fut.result(None if deadline is None else max(0.0, deadline - time.monotonic()))
            except FutureTimeout:
                late.append((w, out, raw))
        if not late:
            return 0
        self._cut = True  # the finalizer writes nothing it has not started
        for w, out, raw in late:
            row = self.row(w, out)
            kept = raw if raw is not None else out.path  # the raw export; a tool's own file or directory as written
            row.update(status="partial", path=kept.name if kept is not None else None, bytes=_size(raw))
            row["error"] = f"{why}: still being written when the grace time ran out"
            try:
                with self._lock:
                    append_row(w.spec.run_dir, row)
            except OSError:
                pass  # the raw export is in the directory: `rlprof analyze` recovers it without its row
        return len(late)

    def close(self, wait_analysis: bool) -> None:
        self.wait()
        if self._finalizer is not None:
            self._finalizer.shutdown(wait=True)
        if self._analysis is not None:
            self._analysis.close(timeout=600 if wait_analysis else 0)

    def abandon(self) -> None:
        """After `wait` with a deadline: leave what is still being written (the process is ending)."""
        if self._finalizer is not None:
            self._finalizer.shutdown(wait=False, cancel_futures=True)
        if self._analysis is not None:
            self._analysis.close(timeout=0)

    def _finish_quietly(self, w: Window, out: Output) -> None:
        try:
            if self._cut:
                return  # listed as partial: its raw export stays as it is
            self._finish(w, out)
        except _Unlisted as exc:
            w.fault("write the manifest row of", exc.__cause__, stopped=True)
        except Exception as exc:
            w.fault("export", exc, stopped=True)
        finally:
            with self._lock:
                self.in_flight -= 1
                self.finished += 1

    def writes_seen(self) -> tuple[int, int]:
        """(in flight, ended): compared at a step's start and end, whether a background write overlapped it."""
        return self.in_flight, self.finished

    def _finish(self, w: Window, out: Output) -> None:
        spec, rp = w.spec, w.plan
        if out.finalize_to is not None:
            meta = self.row(w, out)
            dest = spec.run_dir / out.finalize_to
            meta["path"] = dest.name
            if w.finalize(out, dest, meta):
                log.warning(
                    "rlprof: window %s passed its budget of %d bytes; cut to %d bytes and marked truncated",
                    dest.name,
                    rp.max_bytes_per_window,
                    out.bytes,
                )
        row = self.row(w, out)
        try:
            with self._lock:
                append_row(spec.run_dir, row)
                self.written += 1
        except OSError as exc:
            if rp.strict:
                raise
            raise _Unlisted() from exc  # the trace is whole on disk: `rlprof analyze` recovers it
        if rp.analysis and out.path is not None and out.finalize_to is not None:
            if self._analysis is None:
                from .analysis_hook import AnalysisHook

                self._analysis = AnalysisHook()
            from ..analyze.inputs.manifest import row_meta

            self._analysis.submit(str(out.path), str(spec.run_dir), row_meta(row))

    def row(self, w: Window, out: Output | None, error: str | None = None) -> dict:
        spec, rp = w.spec, w.plan
        row = {
            "run_id": self.run_id,
            "step": spec.steps[0],
            "steps": list(spec.steps),
            "role": spec.role,
            "stage": spec.stage or "e2e",
            "rank": spec.rank,
            "world_size": spec.world_size,
            "replica": spec.replica,
            "tool": rp.tool,
            "mode": rp.mode,
            "unit": rp.schedule.unit if rp.schedule else None,
            "window": (out.index or 0) if out else 0,
            "path": (out.path.name if out and out.path is not None else None),
            "bytes": out.bytes if out else 0,
            "start_ns": out.start_ns if out else w.start_ns,
            "end_ns": out.end_ns if out else time.time_ns(),
            "status": out.status if out else "failed",
            "roles": list(self.roles),
            **({"trigger": w.trigger} if w.trigger is not None else {}),
            **({"device_memory": out.device_memory} if out is not None and out.device_memory else {}),
            **({"device": device} if (device := device_record(self.measured_cpu)) is not None else {}),
            **({"host_stacks": out.host_stacks} if out is not None and out.host_stacks else {}),
            **w.cpu,
            **self.where,
        }
        if error:
            row["error"] = error
        return row


class _Unlisted(Exception):
    """A window written whole whose manifest row could not be appended."""


def _size(path: Path | None) -> int:
    try:
        return path.stat().st_size if path is not None else 0
    except OSError:
        return 0

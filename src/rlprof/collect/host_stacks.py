"""The host sampler: while a window is open, the Python stacks of every thread of the profiled process, looked at every
`INTERVAL_S` from a daemon thread with `sys._current_frames()`, and the garbage collections (`gc.callbacks`), kept
beside the window's trace (analyze/inputs/host_stacks_file.py says the layout). Off when no window is open: each
window starts its own sampler and stops it before its backend stops (so the export is not sampled).

Why this mechanism (docs/collect.md, bench/host_stacks_cost.py measured the others): one look at every thread's frames
under the GIL, a few microseconds a thread when its stack has not moved since the last look (the common case: a
thread waiting, or the stage thread inside one long operator), a walk up to the first frame seen before otherwise.
pyinstrument's sampler is a profile hook on the thread it watches (called on every Python call and return), so its
cost grows with the calls the stage makes and it sees one thread; py-spy reads another process's memory, which needs
ptrace rights a container or a Ray worker rarely grants, and is a separate binary on another clock.

No collection runs during a look. On CPython 3.11 before 3.11.9, a collection that an allocation inside
`sys._current_frames()` or a frame's `f_back` sets off (each makes frame objects) runs finalizers, which may hand the
GIL to the thread whose frame is being read; it pops that frame, and the frame object made for it points at freed
memory (CPython gh-106883 fixed the call itself in 3.11.9, by the same means; a walk up `f_back` stays exposed on
every 3.11). The collector is off for the look only, and left alone where the host had turned it off.

Frames are interned as a prefix tree (one node per (caller node, frame)): a sample is three numbers. The walk up a
thread's stack stops at the first frame of its previous look that is the same object at the same instruction (held
from that look to this one, so identity is never an address reused): a running frame's callers cannot change.

Memory and bytes stay within the window's budget: the sampler stops at `cap_bytes` (its share of
max_bytes_per_window, or `CAP_BYTES` without a budget) and the file says it was cut. A fault in the sampler is one
warning; the window and the training go on without stacks.
"""

from __future__ import annotations

import gc
import linecache
import logging
import os
import sys
import threading
import time
from array import array
from pathlib import Path

from ..analyze.inputs.host_stacks_file import VERSION, encode, stacks_path
from ..analyze.inputs.salvage import part_path
from ..warn_once import warn_once

log = logging.getLogger("rlprof")

INTERVAL_S = 0.002  # a look every 2 ms (while another thread runs Python, a look waits for the GIL: up to 5 ms)
BUDGET_SHARE = 0.25  # of a window's max_bytes_per_window: the rest is its trace's
CAP_BYTES = 64 << 20  # without a budget: what one window's sampler may hold (about an hour of 10 busy threads)
SAMPLE_BYTES = 12  # an estimate of what one sample costs in the file (three numbers)
NODE_BYTES = 8
FRAME_BYTES = 96  # and one frame, besides its names (its source line, the list around it)
THREAD_NAME = "rlprof-host-stacks"


class HostSampler:
    """One window's sampler: `start()`, `stop()`, then `write(trace, lo_ns, hi_ns, window)` for each trace the window
    wrote (the samples between its start and end)."""

    def __init__(self, stage_thread: int | None = None, cap_bytes: int = CAP_BYTES, interval_s: float = INTERVAL_S):
        self.stage_thread = threading.get_ident() if stage_thread is None else stage_thread
        self.cap_bytes, self.interval_s = cap_bytes, interval_s
        self.t_us = array("d")
        self.thread = array("i")
        self.stack = array("i")
        self.threads: list[dict] = []
        self._thread_index: dict[int, int] = {}
        self.frames: list[list] = []
        self._frame_index: dict = {}  # (code, line) -> frame
        self.nodes: list[tuple[int, int]] = []
        self._node_index: dict = {}  # (parent node, frame) -> node
        self._chains: dict = {}  # thread -> its last look: [(frame, instruction, node)] outermost first, by id
        self.gc: list[list] = []
        self._gc_open: dict[int, int] = {}
        self.bytes = 0
        self.truncated = False
        self.faults: list[str] = []
        self.cpu_ns = 0  # the sampler thread's own CPU time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- life ------------------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()
        gc.callbacks.append(self._on_gc)

    def stop(self) -> None:
        """Stop looking (idempotent); what was seen stays for `write`."""
        self._stop.set()
        try:
            gc.callbacks.remove(self._on_gc)
        except ValueError:
            pass
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)

    @property
    def samples(self) -> int:
        return len(self.t_us)

    def _run(self) -> None:
        own = threading.get_ident()
        frames_of, now, wait = sys._current_frames, time.time_ns, self._stop.wait
        cpu0 = time.thread_time_ns()
        try:
            while not wait(self.interval_s):
                frame = None
                t = now() / 1000
                collecting = gc.isenabled()
                if collecting:  # no collection inside a look (below): its finalizers would let threads move on
                    gc.disable()
                try:
                    current = frames_of()
                    for tid, frame in current.items():
                        if tid == own:
                            continue
                        node = self._node_of(tid, frame)
                        index = self._thread_index.get(tid)
                        if index is None:
                            index = self._new_thread(tid)
                        self.t_us.append(t)
                        self.thread.append(index)
                        self.stack.append(node)
                finally:
                    if collecting:
                        gc.enable()
                self.bytes += SAMPLE_BYTES * (len(current) - 1 or 1)
                for gone in self._chains.keys() - current.keys():  # a thread that ended: its frames let go
                    del self._chains[gone]
                del current, frame
                if self.bytes >= self.cap_bytes:
                    self.truncated = True
                    break
        except Exception as exc:  # never into training: the window goes on without its stacks from here
            self.faults.append(f"{type(exc).__name__}: {exc}")
            say_fault(exc)
        finally:
            self._chains.clear()  # the frames of the last look let go
            self.cpu_ns = time.thread_time_ns() - cpu0

    # ---- interning -------------------------------------------------------------------------------------------------
    def _node_of(self, tid: int, frame) -> int:
        """The prefix-tree node of `frame`'s stack. The thread's previous look is kept as its chain of (frame,
        instruction, node), outermost first, holding those frames until this look: a frame of it that is this
        very object at the same instruction has the same callers, so the walk up stops there and only the frames
        below it are interned."""
        chain, where = self._chains.get(tid, ((), {}))
        if chain and chain[-1][0] is frame and chain[-1][1] == frame.f_lasti:
            return chain[-1][2]  # not moved since the last look (waiting, or inside one long call)
        pending = []
        keep = 0
        f = frame
        while f is not None:
            k = where.get(id(f))
            if k is not None and chain[k][0] is f and chain[k][1] == f.f_lasti:
                keep = k + 1
                break
            pending.append(f)
            f = f.f_back
        parent = chain[keep - 1][2] if keep else -1
        new = list(chain[:keep])
        for f in reversed(pending):
            code = f.f_code
            spot = (code, f.f_lineno)
            index = self._frame_index.get(spot)
            if index is None:
                index = self._new_frame(spot, f)
            node_key = (parent, index)
            node = self._node_index.get(node_key)
            if node is None:
                node = self._node_index[node_key] = len(self.nodes)
                self.nodes.append(node_key)
                self.bytes += NODE_BYTES
            new.append((f, f.f_lasti, node))
            parent = node
        self._chains[tid] = (new, {id(entry[0]): k for k, entry in enumerate(new)})
        return parent

    def _new_frame(self, where: tuple, f) -> int:
        code, line = where
        index = self._frame_index[where] = len(self.frames)
        module = f.f_globals.get("__name__") or ""
        name = getattr(code, "co_qualname", code.co_name)
        self.frames.append([str(module), code.co_filename, line or 0, name])
        self.bytes += FRAME_BYTES + len(code.co_filename) + len(name) + len(str(module))
        return index

    def _new_thread(self, tid: int) -> int:
        index = self._thread_index[tid] = len(self.threads)
        thread = threading._active.get(tid)  # the Thread of a running ident (threading's own table)
        self.threads.append(
            {
                "ident": tid,
                "native_id": getattr(thread, "native_id", None),
                "name": thread.name if thread is not None else f"thread {tid}",
                "stage": tid == self.stage_thread,
            }
        )
        return index

    def _on_gc(self, phase: str, info: dict) -> None:
        try:
            tid = threading.get_ident()
            if phase == "start":
                self._gc_open[tid] = time.time_ns()
                return
            start = self._gc_open.pop(tid, None)
            if start is None:
                return
            index = self._thread_index.get(tid)
            if index is None:
                index = self._new_thread(tid)
            self.gc.append(
                [start / 1000, time.time_ns() / 1000, index, info.get("generation", -1), info.get("collected", 0)]
            )
        except Exception:  # a callback must not raise inside the collector
            pass

    # ---- the file ----------------------------------------------------------------------------------------------------
    def document(self, lo_ns: int | None = None, hi_ns: int | None = None, window: dict | None = None) -> dict:
        """What the file holds: the samples and collections between lo_ns and hi_ns (epoch ns; None: all)."""
        lo = -float("inf") if lo_ns is None else lo_ns / 1000
        hi = float("inf") if hi_ns is None else hi_ns / 1000
        keep = [i for i, t in enumerate(self.t_us) if lo <= t <= hi]
        return {
            "version": VERSION,
            "clock": "epoch_us",
            "interval_us": self.interval_s * 1e6,
            "threads": self.threads,
            "frames": [[*f, _source(f[1], f[2])] for f in self.frames],
            "stacks": self.nodes,
            "samples": {
                "t_us": [self.t_us[i] for i in keep],
                "thread": [self.thread[i] for i in keep],
                "stack": [self.stack[i] for i in keep],
            },
            "gc": [g for g in self.gc if g[1] >= lo and g[0] <= hi],
            "truncated": self.truncated,
            "faults": self.faults,
            "window": {**(window or {}), "sampler_cpu_ms": self.cpu_ns / 1e6},
        }

    def write(self, trace: Path, lo_ns: int | None, hi_ns: int | None, window: dict | None = None) -> int:
        """Write the stacks beside `trace` (as a whole file: a hidden .part renamed); their bytes on disk. Raises
        what the disk raises (the window's owner says it)."""
        dest = stacks_path(trace)
        part = part_path(dest)
        data = encode(self.document(lo_ns, hi_ns, window))
        try:
            with open(part, "wb") as f:
                f.write(data)
            os.replace(part, dest)
        except BaseException:
            part.unlink(missing_ok=True)
            raise
        return len(data)


def say_fault(exc: BaseException) -> None:
    """A sampler that failed to start or stopped on a fault: one warning per kind of fault, per process."""
    warn_once(
        ("host-stacks", type(exc).__name__),
        "rlprof: the host sampler stopped (%s: %s); the window goes on without host stacks, training goes on",
        type(exc).__name__,
        exc,
    )


def _source(path: str, line: int) -> str:
    """The frame's source line as the file holds it now (what `.item()` or `ray.get` a line calls), cut to 200."""
    try:
        return linecache.getline(path, line).strip()[:200]
    except Exception:
        return ""


def cap_for(budget: int | None) -> int:
    """The sampler's share of a window's byte budget."""
    return CAP_BYTES if budget is None else max(1 << 12, int(budget * BUDGET_SHARE))

"""The watch: every step of this process, each stage's wall time and the step's, from the Profiler's own
boundaries, appended as one fixed-width record per step to `<run_dir>/timeline/rank<R>.bin`
(analyze/inputs/timeline_file.py says the layout). Cheap enough to leave on: a stage boundary adds two perf_counter_ns
calls and a list update; a step end adds one 176-byte write and the machine-load sample the busy rule reads."""

from __future__ import annotations

import errno
import json
import math
import os
import socket
import threading
import time
from pathlib import Path

from ..analyze.inputs.busy_machine import machine_load
from ..analyze.inputs.timeline_file import COLUMNS_FILE, RECORD, columns, rank_file
from ..vocab import STAGES
from .cpu_wait import current_thread_times, sample, since

STAGE_INDEX = {name: i for i, name in enumerate(STAGES)}
LIVE_FILE = "rlprof_live.json"  # rank 0's heartbeat: `rlprof capture` knows a live job by it
REQUEST_FILE = "capture_request.json"  # what `rlprof capture` asks; rank 0 reads it at a step boundary
RESPONSE_DIR = "capture"  # <id>.json: what the job made of a request (armed, refused, captured)
STEP_WAIT_SHARE = 0.1  # a busy step: the busy rule, and the step's thread waited for a core 10% of the step
_perf_ns = time.perf_counter_ns


class StageTimer:
    """What `prof.stage(name)` returns while the watch is on: the stage's own scope (a window or the no-op),
    timed inside it: a window's start and stop (the profiler's cost, not the stage's) stay out of the stage's time;
    with the calling thread's time on a core and wait for one over the same span (one pread of its schedstat at each
    end: ~1 µs).
    A stage entered again in the same step (a DAPO refill) adds to its time."""

    __slots__ = ("watch", "scopes", "name", "index", "open")

    def __init__(self, watch: "Watch", scopes, name: str):
        self.watch, self.scopes, self.name, self.index = watch, scopes, name, STAGE_INDEX[name]
        self.open: list = []

    def __enter__(self):
        inner = self.scopes[self.name]  # looked up now: the step's selection decides it
        entered = inner.__enter__()
        w0 = self.watch.thread_sched_ns()
        clock = self.watch.clock
        t0 = _perf_ns()
        if self.watch.acc[self.index] < 0:  # first entry this step
            self.watch.first[self.index] = t0
        self.open.append((inner, t0, w0, clock.held_ns if clock is not None else 0))
        return entered

    def __exit__(self, *exc):
        inner, t0, w0, h0 = self.open.pop()
        self.watch.acc[self.index] += _perf_ns() - t0
        if self.watch.clock is not None:
            self.watch.held[self.index] += self.watch.clock.held_ns - h0
        if w0 is not None:
            w1 = self.watch.thread_sched_ns()
            if w1 is not None:
                self.watch.ran[self.index] += max(0, w1[0] - w0[0])
                self.watch.waited[self.index] += max(0, w1[1] - w0[1])
        return inner.__exit__(*exc)


class Timers(dict):
    """stage name -> StageTimer; a name that is no stage falls back to the Profiler's own lookup."""

    def __init__(self, watch: "Watch", scopes):
        super().__init__((name, StageTimer(watch, scopes, name)) for name in STAGES)
        self.scopes = scopes

    def __missing__(self, name):
        return self.scopes[name]


class Watch:
    """One process's watch: stage accumulators for the open step and the timeline file it appends to."""

    def __init__(self, run_dir: Path, rank: int):
        self.run_dir, self.rank = Path(run_dir), rank
        self.path = rank_file(run_dir, rank)
        self.acc = [-1] * len(STAGES)
        self.first = [0] * len(STAGES)
        self.waited = [0] * len(STAGES)  # each stage's wait for a core this step (ns)
        self.ran = [0] * len(STAGES)  # and its time on one (ns)
        self.held = [0] * len(STAGES)  # and the process's time held off its cores (ns), where `clock` runs
        self.clock = None  # a HeldOffClock, started where a straggler rule compares this rank with others
        self._schedstat: dict = {}  # thread -> an open fd of its /proc schedstat (None: not readable here)
        self.t0 = 0
        self.started_unix_s = math.nan  # the open step's start on the wall clock (the samples' and traces' clock)
        self.load_at_start = None
        self._file = None

    def begin(self, step: int) -> None:
        # -1: not entered. A stage that ran adds its ns on top (>= 0 after one perf_counter_ns tick); end() adds
        # the 1 back. One list, no per-stage flag to set on the boundary's path.
        self.acc = [-1] * len(STAGES)
        self.first = [0] * len(STAGES)
        self.waited = [0] * len(STAGES)
        self.ran = [0] * len(STAGES)
        self.held = [0] * len(STAGES)
        self.load_at_start = sample(current_thread_times)
        self.started_unix_s = time.time()
        self.t0 = _perf_ns()

    def thread_sched_ns(self) -> tuple[int, int] | None:
        """The calling thread's (time on a core, run-queue wait) so far in ns, from its schedstat kept open; None where
        not readable."""
        me = threading.get_ident()
        fd = self._schedstat.get(me, -2)
        if fd == -2:
            try:
                fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
            except OSError:
                fd = None
            self._schedstat[me] = fd
        if fd is None:
            return None
        try:
            ran, waited = os.pread(fd, 64, 0).split()[:2]
            return int(ran), int(waited)
        except (OSError, ValueError):
            return None

    def end(self) -> tuple[float, list[float], bool, tuple[float, float, float]]:
        """(step seconds, stage seconds (NaN: did not run) then each stage's first entry in seconds from the
        step's start, then each stage's wait for a core and its time on one in ms, busy, (the step thread's time on a core and its
        run-queue wait in ms, other processes' share of the host's CPUs)) of the open step, NaN where the kernel
        does not say. Busy: analyze/inputs/busy_machine.py's rule over the
        thread that ran the step (its run-queue wait, not the idle helper threads'), the host and the job."""
        step_s = (_perf_ns() - self.t0) / 1e9
        stages = [math.nan if ns < 0 else (ns + 1) / 1e9 for ns in self.acc]
        stages += [math.nan if ns < 0 else (t - self.t0) / 1e9 for ns, t in zip(self.acc, self.first)]
        stages += [math.nan if ns < 0 else w / 1e6 for ns, w in zip(self.acc, self.waited)]
        stages += [math.nan if ns < 0 else c / 1e6 for ns, c in zip(self.acc, self.ran)]
        rec = since(self.load_at_start, current_thread_times) if self.load_at_start is not None else {}
        load = machine_load(rec) if rec else None
        # material to this step: a thread that mostly sleeps or waits on a device (a GPU host's) has a large wait
        # share of a small CPU time; the machine explains a step only where the wait is a part of its wall time
        busy = bool(load and load["busy"] and rec["run_wait_ms"] >= STEP_WAIT_SHARE * step_s * 1e3)
        waited = (float(rec["cpu_ms"]), float(rec["run_wait_ms"]), load["external_share"]) if load else (math.nan,) * 3
        return step_s, stages, busy, waited

    def held_ms(self) -> list[float]:
        """Each stage's time held off the cores in the open step, ms; NaN where it did not run or no clock runs."""
        if self.clock is None:
            return [math.nan] * len(STAGES)
        return [math.nan if ns < 0 else h / 1e6 for ns, h in zip(self.acc, self.held)]

    def write(self, step: int, flags: int, step_s: float, stages: list[float], waited: tuple = (math.nan,) * 3) -> None:
        """The step's record: its times (`end`'s stages, starts, stage waits and stage times on a core), its start on
        the wall clock (the open step's) and `waited` (`end`'s time on a core, run-queue wait and others' share)."""
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            header = self.path.parent / COLUMNS_FILE
            if not header.exists():
                _write_atomic(header, json.dumps(columns()))
            self._file = open(self.path, "ab", buffering=0)  # one write() per step: readers see whole records
        n = len(STAGES)
        record = RECORD.pack(step, flags, step_s, *stages[: 2 * n], self.started_unix_s, *waited, *stages[2 * n :])
        end = self._file.tell()
        try:
            written = self._file.write(record)
        except OSError:
            written = -1
            raise
        finally:
            if written != len(record):  # a full disk cut it: taken back, so the records after it stay aligned
                try:
                    self._file.truncate(end)
                except OSError:
                    pass
        if written != len(record):
            raise OSError(errno.ENOSPC, f"only {written} of {len(record)} bytes of step {step}'s record were written")

    def close(self) -> None:
        if self.clock is not None:
            self.clock.stop()
            self.clock = None
        if self._file is not None:
            self._file.close()
            self._file = None
        for fd in self._schedstat.values():
            if fd is not None:
                os.close(fd)
        self._schedstat = {}


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk leaves no temporary behind
        raise


def write_live(run_dir: Path, trigger=None, **fields) -> None:
    """Rank 0's heartbeat: pid and host (a live process is checked by them on the same host), the step it is at,
    and when it wrote (elsewhere, a heartbeat older than a few steps means the job is gone). `trigger`: the job's
    Trigger, whose request switch and budget `rlprof capture` checks a request against."""
    if trigger is not None:
        fields = {
            "request": trigger.plan.request,
            "captures_left": trigger.budget_left(),
            "max_captures": trigger.plan.max_captures,
            **fields,
        }
    _write_atomic(
        Path(run_dir) / LIVE_FILE,
        json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "updated": time.time(), **fields}),
    )


def write_response(run_dir: Path, request_id: int, **fields) -> None:
    d = Path(run_dir) / RESPONSE_DIR
    d.mkdir(parents=True, exist_ok=True)
    _write_atomic(d / f"{request_id}.json", json.dumps({"id": request_id, **fields}))


def rank_note_path(run_dir: Path, request_id: int, rank: int) -> Path:
    return Path(run_dir) / RESPONSE_DIR / f"{request_id}.rank{rank}.json"


def write_rank_note(run_dir: Path, request_id: int, rank: int, **fields) -> None:
    """What one rank captured for a request (its windows, written at the captured step's end, before their rows):
    `rlprof capture` waits for each one's manifest row, and names those still being written when its wait ends."""
    path = rank_note_path(run_dir, request_id, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(path, json.dumps({"id": request_id, "rank": rank, **fields}))


def read_request(run_dir: Path, seen: set) -> dict | None:
    """The request file's contents when it holds a request not seen before; None otherwise."""
    p = Path(run_dir) / REQUEST_FILE
    try:
        req = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    rid = req.get("id") if isinstance(req, dict) else None
    if not isinstance(rid, int) or rid in seen:
        return None
    seen.add(rid)
    return req

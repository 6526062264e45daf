"""The collection runtime: one Profiler per process, driven by step/stage/tick/mark.

Hot-path rule: a stage boundary, tick or mark that nothing selected does one dict lookup and
returns a shared no-op context whose enter/exit are C builtins: no formatting, no allocation,
no environment lookups.
"""

from __future__ import annotations

import atexit
from collections import defaultdict
import msgspec
import functools
import importlib.util
import logging
import math
import os
import shutil
import subprocess
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from ..config.plan import ProfilePlan, RolePlan
from ..vocab import ROLE_STAGES, ROLES, STAGE_ROLE, STAGES, TOOLS, UNITS
from ..errors import CollectError, ConfigError
from .backends import Backend, Output, WindowSpec, backend_class
from .cpu_wait import sample, since
from .manifest import append_row, written_where
from .naming import shared_run_id, window_name
from .tracefile import finalize_trace
from .trigger import REQ_COLS, Exchange, Trigger, encode_request
from .watch import Timers, Watch, read_request, write_live, write_response
from ..analyze.timeline_file import BUSY, CAPTURED, WARMUP

log = logging.getLogger("rlprof")


class _NullContext:
    """Shared no-op context whose entering and leaving run no Python frame: `tuple` (a C type, no descriptor)
    returns the empty tuple as the `as` target; `"".format`, a C builtin taking any arguments, returns ""
    (falsy, so exceptions propagate). The cheapest C callables measured for the two slots (bench/overhead.py)."""

    __slots__ = ()
    __enter__ = tuple
    __exit__ = "".format


NULL = _NullContext()
_E2E = object()  # _stage_now value: mark this stage as a range inside the open end-to-end window
_current: "Profiler | None" = None
HEARTBEAT_S = 1.0  # rank 0 rewrites its heartbeat (rlprof_live.json) at most this often, and on every capture event


def current() -> "Profiler | None":
    """The Profiler most recently created in this process (used by the @stage decorator and mark())."""
    return _current


class Window:
    """One collection window: a backend instance plus what the manifest needs to know."""

    __slots__ = ("prof", "spec", "backend", "failed", "start_ns", "closed", "threads_at_start", "cpu", "trigger",
                 "probe")

    def __init__(self, prof: "Profiler", spec: WindowSpec):
        self.prof, self.spec = prof, spec
        self.backend: Backend | None = None
        self.failed = False
        self.closed = False
        self.start_ns = time.time_ns()
        self.threads_at_start = sample()  # the machine's load on this window: cpu_wait.since at its close
        self.cpu: dict = {}
        self.trigger: dict | None = None  # why the trigger captured this window (the manifest row's `trigger`)
        self.probe = False  # keep: slow_only: kept only if its step turns out slow

    @property
    def plan(self) -> RolePlan:
        return self.spec.plan

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
            self.prof._fault(self, "step", exc)


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
            self.window.prof._fault(self.window, "range", exc)
        return self

    def __exit__(self, *exc):
        if self.inner is not None and not self.window.failed:
            try:
                self.inner.__exit__(*exc)
            except Exception as err:
                self.window.prof._fault(self.window, "range", err)
        return False


class _StepScope:
    __slots__ = ("prof", "n")

    def __init__(self, prof: "Profiler", n: int):
        self.prof, self.n = prof, n

    def __enter__(self):
        self.prof._begin_step(self.n)
        return self.prof

    def __exit__(self, *exc):
        self.prof._end_step(self.n)
        return False


class _StageScope:
    __slots__ = ("prof", "name", "target", "window", "opened", "range")

    def __init__(self, prof: "Profiler", name: str, target):
        self.prof, self.name, self.target = prof, name, target
        self.window = self.range = None
        self.opened = False

    def __enter__(self):
        prof = self.prof
        prof._units = {}
        if prof._open:  # a window is already open: the stage is a range inside it
            self.window = prof._open[-1]
            if self.target is not _E2E:
                prof._note_once("nested", "rlprof: stage %s ran inside an open window; marked as a range there "
                                "instead of a window of its own", self.name)
        else:
            if self.target is _E2E:
                return self
            self.window = prof._open_window(self.target, self.name, (prof._step,))
            self.opened = True
            prof._stage_now[self.name] = None  # entered again this step (a DAPO refill): first one only
            prof._scopes[self.name] = NULL
        self.range = self.window.range("rlprof:stage:" + self.name)
        self.range.__enter__()
        return self

    def __exit__(self, *exc):
        if self.range is not None:
            self.range.__exit__(*exc)
        prof = self.prof
        prof.tick("stage")
        if self.opened:
            prof._close_window(self.window)
        return False


class _SelectedStage:
    """What `prof.stage(name)` returns for a stage selected this step: every entry opens a scope of its own
    (per thread, so that threads entering the same stage do not share one)."""

    __slots__ = ("prof", "name", "target", "_local")

    def __init__(self, prof: "Profiler", name: str, target):
        self.prof, self.name, self.target = prof, name, target
        self._local = threading.local()

    def __enter__(self):
        scope = _StageScope(self.prof, self.name, self.target)
        self._local.__dict__.setdefault("open", []).append(scope)
        return scope.__enter__()

    def __exit__(self, *exc):
        return self._local.open.pop().__exit__(*exc)


def _null() -> _NullContext:
    return NULL


def unit_range_name(unit: str, index: int, args: dict) -> str:
    """`rlprof:<unit>:<index>`, then `|key=value,...` for what the unit holds (sequences, tokens): the analysis
    reads them back from the range name, the one field every backend's ranges keep."""
    name = f"rlprof:{unit}:{index}"
    if args:
        name += "|" + ",".join(f"{k}={v}" for k, v in args.items())
    return name


class _UnitScope:
    __slots__ = ("prof", "unit", "range", "args")

    def __init__(self, prof: "Profiler", unit: str, args: dict):
        self.prof, self.unit, self.range, self.args = prof, unit, None, args

    def __enter__(self):
        prof = self.prof
        k = prof._units.get(self.unit, 0)
        prof._units[self.unit] = k + 1
        self.range = prof._open[-1].range(unit_range_name(self.unit, k, self.args))
        self.range.__enter__()
        return self

    def __exit__(self, *exc):
        self.range.__exit__(*exc)
        self.prof.tick(self.unit)
        return False


def _tool_available(tool: str) -> str | None:
    """Why this machine cannot collect with `tool`, or None."""
    if tool not in TOOLS:
        return f"tool {tool} has no rlprof backend (it is another framework's tool)"
    if tool == "npu" and importlib.util.find_spec("torch_npu") is None:
        return "tool npu needs torch_npu (Ascend), which is not installed on this machine"
    if tool in ("nsys", "torch_memory"):
        import torch

        if not torch.cuda.is_available():
            return f"tool {tool} needs CUDA, which this machine does not have"
    return None


class Profiler:
    """Selective profiling for one process.

    rank / world_size default to torchrun's RANK / WORLD_SIZE. `role` names the role(s) this process
    hosts (default: all, as in a colocated single-process trainer). In async rollout, a replica
    process passes role="rollout" and replica=<index>; rollout ranks are then replica indices.
    `backends` maps a tool name to a factory(spec) -> Backend (tests use it to substitute one). `tags` go into
    every manifest row this process writes (an inference engine's name, version and TP rank). With a trigger in
    the plan, every step is watched (collect/watch.py); `decides=False` is for a process that follows another's
    decisions (an async rollout replica: the driver arms it with `arm`).
    """

    def __init__(self, plan: ProfilePlan, *, rank: int | None = None, world_size: int | None = None,
                 role: str | tuple[str, ...] | None = None, replica: int | None = None, run_id: str | None = None,
                 backends: dict[str, Callable[[WindowSpec], Backend]] | None = None, tags: dict | None = None,
                 decides: bool = True):
        global _current
        self.plan = plan
        self.rank = int(os.environ.get("RANK", 0)) if rank is None else rank
        self.world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size
        self.replica = replica
        hosted = ROLES if role is None else ((role,) if isinstance(role, str) else tuple(role))
        for r in hosted:
            if r not in ROLES:
                raise ConfigError("role", r, ", ".join(ROLES))
        self.roles = hosted
        self._noted: set = set()
        self._collecting: dict[str, RolePlan] = {}
        for r in hosted:
            rp = plan.role(r)
            index = replica if (r == "rollout" and plan.async_rollout and replica is not None) else self.rank
            if rp.collects_on(index):
                self._collecting[r] = rp
        self._factories: dict[str, Callable[[WindowSpec], Backend]] = dict(backends or {})
        for r, rp in list(self._collecting.items()):
            if rp.tool in self._factories:
                continue
            problem = _tool_available(rp.tool)
            if problem and (rp.tool == "torch_memory" or rp.tool not in TOOLS):
                self._note_once(("unavailable", rp.tool), "rlprof: %s; role %s collects nothing here, training goes on",
                                problem, r)
                del self._collecting[r]
            elif problem:
                usable = [t for t in ("torch", "markers", "nsys", "torch_memory", "npu") if not _tool_available(t)]
                raise ConfigError(f"{r}.tool", rp.tool, "a tool this machine has: " + ", ".join(usable),
                                  problem=f"cannot collect here: {problem}")
            else:
                self._factories[rp.tool] = backend_class(rp.tool)
        # Roles a trigger may capture on this process whatever the rank (a straggler's slow and healthy ranks)
        self._capturable: dict[str, RolePlan] = {}
        if plan.trigger is not None:
            for r in hosted:
                rp = plan.role(r)
                if not (rp.enabled and rp.tool and rp.stages):
                    continue
                if rp.tool not in self._factories:
                    if _tool_available(rp.tool):
                        continue
                    self._factories[rp.tool] = backend_class(rp.tool)
                self._capturable[r] = rp
        watched = plan.trigger is not None
        self.run_id = (shared_run_id(run_id) if watched or any(r.enabled and r.steps for r in plan.roles)
                       else (run_id or ""))
        if plan.collects_nothing and self.rank == 0:  # said once per job, not once per rank
            from ..config.describe import nothing_collected_line

            log.warning("%s", nothing_collected_line(plan))
        self._step: int | None = None
        self._where = {**written_where(), **(tags or {})}  # every manifest row carries them
        self._stage_now: dict = {}
        # `with prof.stage("actor_update"):` marks a stage and opens its window when selected. `stage` is the C
        # lookup of a dict kept in step with _stage_now: an unselected stage costs one dict hit, no Python frame.
        self._scopes: defaultdict = defaultdict(_null)
        self.stage = self._scopes.__getitem__
        self._ticks: dict[str, list[Window]] = {}
        self._open: list[Window] = []
        self._e2e: Window | None = None
        self._units: dict[str, int] = {}
        self._finalizer: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []
        self._analysis = None
        self._lock = threading.Lock()
        self.windows_written = 0
        self._closed = False
        self._hook = self._finish_hook_here(plan, hosted)
        self._profiled_steps: set[int] = set()
        self._watch: Watch | None = None
        self._trigger: Trigger | None = None
        self._exchange: Exchange | None = None
        self._capture_rows: dict = {}  # stage (or "e2e") -> the trigger row of the capture open this step
        self._taken: list = []  # the captures taken this step
        self._held: list = []  # keep: slow_only: (window, outputs) waiting for their step's decision
        self._probing: set = set()
        self.probes = {"windows": 0, "kept": 0, "backend_ns": 0}
        self._requests_seen: set = set()
        self._beat_at = 0.0
        self._delegated: dict = {}
        if watched:
            self._start_watch(decides)
        _current = self
        atexit.register(_close_at_exit, weakref.ref(self))

    # ---- public API -------------------------------------------------------------------------
    @classmethod
    def from_config(cls, path=None, overrides=(), **kwargs) -> "Profiler":
        from ..config import load_plan

        return cls(load_plan(path, overrides), **kwargs)

    @property
    def recording(self) -> bool:
        """Whether a window is open in this process now (units marked now are recorded)."""
        return bool(self._open)

    def run_dir(self, role: str = "actor") -> Path:
        return Path(self.plan.role(role).save_path) / self.run_id

    def step(self, n: int) -> _StepScope:
        """`with prof.step(n):` marks global training step n (1-based)."""
        return _StepScope(self, n)

    def tick(self, unit: str) -> None:
        """A `unit` boundary (mini_batch, micro_batch, decode_step) has passed: drives schedules."""
        windows = self._ticks.get(unit)
        if windows:
            for w in tuple(windows):
                w.tick()

    def unit(self, unit: str, **args: int):
        """`with prof.unit("micro_batch", seqs=8, tokens=512):` marks one unit as a range and ticks at its end.
        `args` (integers) say what the unit holds: `seqs`, `tokens` computed, `real_tokens` (not padding),
        `active` sequences of a decode step; the analysis turns them into padding and rollout-tail measures."""
        if not self._open:  # schedules tick only inside open windows
            return NULL
        return _UnitScope(self, unit, args)

    def mark(self, name: str):
        """A named range for anything else, recorded in the open window (if any)."""
        if not self._open:
            return NULL
        return self._open[-1].range("rlprof:mark:" + name)

    def close(self, wait_analysis: bool = True) -> None:
        """Close windows left open (an exception, an early exit), flush files and the manifest."""
        global _current
        if self._closed:
            return
        self._closed = True
        while self._open:
            self._close_window(self._open[-1])
        self._e2e = None
        self._select({})
        self._stop_watch()
        self._wait_written()
        if self._hook is not None and self._profiled_steps:  # the run ended before the last listed step
            self._run_finish_hook()
        if self._finalizer is not None:
            self._finalizer.shutdown(wait=True)
        if self._analysis is not None:
            self._analysis.close(timeout=600 if wait_analysis else 0)
        if _current is self:
            _current = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # ---- steps and windows ------------------------------------------------------------------
    def _begin_step(self, n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError("step", n, "a positive integer (steps are 1-based)")
        self._step = n
        capture_e2e, capture_stages = self._watch_begin(n) if self._watch is not None else (None, {})
        if not self._collecting and capture_e2e is None and not capture_stages:
            return
        e2e = [rp for rp in self._collecting.values() if rp.mode == "e2e" and n in rp.steps]
        if e2e and self._e2e is None:
            primary = e2e[0]
            group = next(g for g in self.plan.step_groups(primary.steps) if n in g)
            self._e2e = self._open_window(primary, None, group)
        elif capture_e2e is not None and self._e2e is None:
            self._e2e = self._open_window(capture_e2e, None, (n,))
        stage_now: dict = dict.fromkeys(STAGES, _E2E) if self._e2e is not None else {}
        for rp in self._collecting.values():
            if rp.mode == "discrete" and n in rp.steps:
                for stage in rp.stages:
                    stage_now.setdefault(stage, rp)
        for stage, rp in capture_stages.items():
            stage_now.setdefault(stage, rp)
        self._select(stage_now)

    def _select(self, stage_now: dict) -> None:
        """The stages selected now, and what `stage` returns for each (in place: `stage` is bound to the dict)."""
        self._stage_now = stage_now
        self._scopes.clear()
        self._scopes.update((name, _SelectedStage(self, name, target)) for name, target in stage_now.items())

    def _end_step(self, n: int) -> None:
        self.tick("step")
        w = self._e2e
        if w is not None and n >= w.spec.steps[-1]:
            self._e2e = None
            self._close_window(w)
        self._select({})
        self._step = None
        if self._watch is not None:
            self._watch_end(n)
        if self._hook is not None:
            rp, last = self._hook
            if n in rp.steps:
                self._profiled_steps.add(n)
            if n >= last:
                self._run_finish_hook()

    def _wait_written(self) -> None:
        """Block until every window this process closed is on disk, with its manifest row."""
        for fut in self._pending:
            fut.result()
        self._pending.clear()

    # ---- verl's finish hook -----------------------------------------------------------------
    def _finish_hook_here(self, plan: ProfilePlan, hosted: tuple[str, ...]) -> tuple[RolePlan, int] | None:
        """The hook this process runs, as verl's worker does: the first hosted role's (a combined
        actor_rollout_ref worker uses the actor's profiler), when enabled and selected for this rank."""
        for r in hosted:
            rp = plan.role(r)
            if rp.enabled and rp.finish_hook is not None and rp.steps:
                index = self.replica if (r == "rollout" and plan.async_rollout and self.replica is not None) \
                    else self.rank
                if rp.finish_hook.runs_on(index, rp.collects_on(index)):
                    return rp, max(rp.steps)
                return None
        return None

    def _run_finish_hook(self) -> None:
        """Once, after the last profiled step, through the shell with verl's VERL_PROFILE_* environment.
        Waits for this process's traces to be written first. A failing command is a warning, never an error."""
        hook, self._hook = self._hook, None
        if hook is None:
            return
        rp = hook[0]
        self._wait_written()
        parts = [r for r in ("actor", "rollout", "ref") if r in self.roles]
        run_dir = self.run_dir(rp.role) if self.run_id else Path(rp.save_path)
        env = dict(os.environ, VERL_PROFILE_SAVE_PATH=str(run_dir), VERL_PROFILE_TOOL=rp.tool or "",
                   VERL_PROFILE_RANK=str(self.rank), VERL_PROFILE_PID=str(os.getpid()),
                   VERL_PROFILE_ROLE="_".join(parts or self.roles), RLPROF_SAVE_PATH=rp.save_path,
                   RLPROF_RUN_DIR=str(run_dir))
        cmd = rp.finish_hook.cmd
        print(f"[rlprof][finish_hook] rank {self.rank}: running: {cmd}", flush=True)
        try:
            proc = subprocess.run(["/bin/sh", "-c", cmd], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        except Exception as exc:
            log.warning("rlprof: finish hook could not start on rank %s: %s (training goes on)", self.rank, exc)
            return
        for line in proc.stdout.splitlines():
            print(f"[rlprof][finish_hook] rank {self.rank}: {line}", flush=True)
        if proc.returncode != 0:
            log.warning("rlprof: finish hook exited with %s on rank %s: %s (training goes on)",
                        proc.returncode, self.rank, cmd)

    def _run_dir_for(self, rp: RolePlan) -> Path:
        path = self.run_dir(rp.role)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _open_window(self, rp: RolePlan, stage: str | None, steps: tuple[int, ...]) -> Window:
        if rp.schedule is not None and rp.schedule_for(stage) is None:
            rp = msgspec.structs.replace(rp, schedule=None)  # a stage the schedule does not sample: in full
        role, rank = rp.role, self.rank
        spec = WindowSpec(run_dir=self._run_dir_for(rp), steps=steps, role=role, stage=stage, rank=rank,
                          world_size=self.world_size, replica=self.replica, plan=rp,
                          base_name=functools.partial(window_name, steps, role, stage, rank))
        w = Window(self, spec)
        w.trigger = self._capture_rows.get(stage or "e2e")
        w.probe = w.trigger is None and stage in self._probing and rp.mode == "discrete"
        self._open.append(w)
        t0 = time.perf_counter_ns()
        try:
            w.backend = self._factories[rp.tool](spec)
            w.backend.start()
            if w.probe:
                self.probes["windows"] += 1
                self.probes["backend_ns"] += time.perf_counter_ns() - t0
        except Exception as exc:
            self._fault(w, "start", exc)
            return w
        if rp.schedule is not None:
            self._ticks.setdefault(rp.schedule.unit, []).append(w)
        return w

    def _close_window(self, w: Window) -> None:
        if w.closed:
            return
        w.closed = True
        if w in self._open:
            self._open.remove(w)
        for unit, ws in list(self._ticks.items()):
            if w in ws:
                ws.remove(w)
                if not ws:
                    del self._ticks[unit]
        if w.failed:
            return
        w.cpu = since(w.threads_at_start)  # before the backend's export, which is rlprof's own time
        t0 = time.perf_counter_ns()
        try:
            outputs = w.backend.stop()
        except Exception as exc:
            self._fault(w, "stop", exc, stopped=True)
            return
        if w.probe:  # kept or dropped at the step's end, when the trigger has judged the step
            self.probes["backend_ns"] += time.perf_counter_ns() - t0
            self._held.append((w, outputs))
            return
        self._write_outputs(w, outputs)

    def _write_outputs(self, w: Window, outputs: list[Output]) -> None:
        for out in outputs:
            if w.plan.strict:
                self._finish(w, out)
            else:
                if self._finalizer is None:
                    self._finalizer = ThreadPoolExecutor(1, thread_name_prefix="rlprof-finalize")
                self._pending.append(self._finalizer.submit(self._finish_quietly, w, out))


    # ---- the watch and the trigger (catching the slow step) --------------------------------
    @property
    def watch_dir(self) -> Path:
        """Where the timeline, the heartbeat and capture requests live: the run directory of the plan's first
        enabled role (the same on every rank and replica)."""
        role = next((r.role for r in self.plan.roles if r.enabled and r.tool), "actor")
        return self.run_dir(role)

    def _start_watch(self, decides: bool) -> None:
        try:
            trigger = self.plan.trigger
            self._watch = Watch(self.watch_dir, self.rank if self.replica is None else self.replica)
            enabled = tuple(r.role for r in self.plan.roles if r.enabled and r.tool and r.stages)
            fixed = {n for r in self.plan.roles if r.enabled for n in r.steps}
            self._trigger = Trigger(trigger, enabled, fixed)
            self._exchange = Exchange(self.world_size) if decides else None
            self.stage = Timers(self._watch, self._scopes).__getitem__
            if self.rank == 0 and decides:
                self.watch_dir.mkdir(parents=True, exist_ok=True)
                self._heartbeat(step=0)
                print(f"rlprof: watching every step; run directory {self.watch_dir}"
                      + (f" (rlprof capture {self.watch_dir} --next)" if trigger.request else ""), flush=True)
        except Exception as exc:
            self._watch_fault("start", exc, disable=True)

    def _heartbeat(self, **fields) -> None:
        t = self._trigger
        write_live(self.watch_dir, run_id=self.run_id, world_size=self.world_size, request=t.plan.request,
                   captures_left=t.budget_left(), max_captures=t.plan.max_captures, **fields)

    def _stop_watch(self) -> None:
        watch, self._watch = self._watch, None
        if watch is None:
            return
        self.stage = self._scopes.__getitem__
        try:
            watch.close()
            if self.rank == 0 and self._exchange is not None:
                self._heartbeat(ended=True)
            if self.probes["windows"] and self.rank == 0:
                p = self.probes
                print(f"rlprof: keep: slow_only profiled {p['windows']} stage windows on rank 0 and kept "
                      f"{p['kept']}; starting and stopping them took {p['backend_ns'] / 1e9:.2f} s "
                      f"({p['backend_ns'] / 1e6 / p['windows']:.1f} ms per window, besides the profiler's cost "
                      "inside each stage)", flush=True)
        except Exception as exc:
            self._watch_fault("close", exc)

    def _watch_fault(self, phase: str, exc: BaseException, disable: bool = False) -> None:
        """A fault inside the watch or the trigger: one warning, training goes on (without the watch when the
        decision itself cannot be made)."""
        self._note_once(("watch", phase), "rlprof: the watch failed to %s: %s: %s (training goes on%s)", phase,
                        type(exc).__name__, exc, " without it" if disable else "")
        if disable:
            self._watch = self._trigger = self._exchange = None
            self.stage = self._scopes.__getitem__

    def arm(self, step: int, stage: str | None, trigger: dict) -> None:
        """Capture `stage` (None: the whole step) at `step` here, as another process decided (the driver of async
        rollout replicas). Needs a trigger in the plan."""
        if self._trigger is not None:
            from .trigger import Capture

            role = STAGE_ROLE[stage] if stage else None
            self._trigger.pending.append(Capture(at_step=step, stage=stage, role=role, trigger=trigger,
                                                 ranks=(self._watch.rank,)))

    def delegated(self, stage: str) -> dict | None:
        """The trigger row of a capture this step of `stage` that a process following this one takes (an async
        rollout replica), or None. Asked by the host between the step's start and the stage."""
        if self._watch is None:
            return None
        return self._delegated.get(stage)

    def _index(self, role: str) -> int:
        async_rollout = role == "rollout" and self.plan.async_rollout and self.replica is not None
        return self.replica if async_rollout else self.rank

    def _watch_begin(self, n: int) -> tuple:
        """The step starts: its stage clocks, and what the trigger armed for it on this process."""
        try:
            self._watch.begin(n)
            trig = self._trigger
            self._capture_rows, self._probing = {}, set()
            e2e, stages = None, {}
            self._taken = trig.due(n)
            self._delegated = {}
            for cap in self._taken:
                if cap.role is not None and cap.role in trig.enabled_roles and cap.role not in self._capturable:
                    # a role another process hosts (async rollout replicas, a vLLM engine): they follow through
                    # `delegated`, and this process opens nothing, so that its windows and theirs never overlap on a
                    # device they share. A whole-step capture stays here (the rollout is a range of this window).
                    self._delegated.setdefault(cap.stage or "step", cap.trigger)
                # a stage of a role the plan does not collect (the reward's, with only the actor enabled): the
                # whole step is captured with the roles the plan does collect
                whole = cap.role is not None and cap.role not in trig.enabled_roles
                for role, rp in self._capturable.items():
                    if cap.role is not None and role != cap.role and not whole:
                        continue
                    index = self._index(role)
                    here = (index in cap.ranks) if cap.ranks is not None else (rp.all_ranks or index in rp.ranks)
                    if not (here or index in cap.extra_ranks):
                        continue
                    if rp.mode == "e2e" or whole:
                        rp = msgspec.structs.replace(rp, mode="e2e") if whole else rp
                        e2e = e2e or rp
                        self._capture_rows.setdefault("e2e", cap.trigger)
                    else:
                        for stage in ((cap.stage,) if cap.stage else rp.stages):
                            stages.setdefault(stage, rp)
                            self._capture_rows.setdefault(stage, cap.trigger)
            plan = trig.plan
            if (plan.keep == "slow_only" and e2e is None and not stages and n > plan.warmup_steps
                    and trig.budget_left() > 0):
                for role, rp in self._capturable.items():
                    if rp.all_ranks or self._index(role) in rp.ranks:
                        probe = msgspec.structs.replace(rp, mode="discrete")
                        for stage in (plan.stages or rp.stages):
                            if stage in rp.stages:
                                stages.setdefault(stage, probe)
                                self._probing.add(stage)
            return e2e, stages
        except Exception as exc:
            self._watch_fault("begin a step", exc)
            return None, {}

    def _watch_end(self, n: int) -> None:
        """The step ended: its record, the decision every rank makes alike, the heartbeat and request answers."""
        watch, trig = self._watch, self._trigger
        try:
            step_s, stages, busy = watch.end()
        except Exception as exc:
            self._watch_fault("time the step", exc)
            step_s, stages, busy = math.nan, [math.nan] * 2 * len(STAGES), False
        if self._exchange is None:  # a follower: the host decides and keeps the timeline
            self._capture_rows, self._taken = {}, []
            return
        req = None
        if self.rank == 0 and trig.plan.request:
            try:
                req = read_request(self.watch_dir, self._requests_seen)
            except Exception as exc:
                self._watch_fault("read a capture request", exc)
        try:
            matrix = self._exchange.gather([step_s, *stages, float(busy), *encode_request(req)])
            ranks = self._exchange.relay(req.get("ranks") if req else None) if matrix[0, REQ_COLS + 4] else None
            decision = trig.decide(n, matrix, ranks)
        except Exception as exc:
            self._watch_fault("decide", exc, disable=True)
            return
        kept = self._settle_probes(decision.flagged) if self._held else False
        self._record(n, step_s, stages, busy, captured=bool(self._capture_rows) or kept)
        if self.rank == 0:
            try:
                self._answer(n, decision)
                now = time.monotonic()
                if now - self._beat_at >= HEARTBEAT_S or decision.armed or decision.refused or self._taken:
                    self._beat_at = now  # a rename per step costs ms on some disks: at most one a second
                    self._heartbeat(step=n, step_seconds=step_s)
            except Exception as exc:
                self._watch_fault("write the heartbeat", exc)
        self._capture_rows, self._taken = {}, []

    def _record(self, n: int, step_s: float, stages: list, busy: bool, captured: bool) -> None:
        flags = (BUSY if busy else 0) | (WARMUP if n <= self._trigger.plan.warmup_steps else 0) \
            | (CAPTURED if captured else 0)
        try:
            self._watch.write(n, flags, step_s, stages)
        except Exception as exc:
            self._watch_fault("write the timeline", exc)

    def _settle_probes(self, flagged: dict | None) -> bool:
        """keep: slow_only: the windows of this step's slow stage are written, the others dropped."""
        held, self._held = self._held, []
        keep = set()
        if flagged is not None:  # the trigger counted it on the budget
            keep = {w.spec.stage for w, _ in held} if flagged["stage"] == "step" else {flagged["stage"]}
        row = {k: v for k, v in (flagged or {}).items() if k != "ranks"}
        for w, outputs in held:
            if w.spec.stage in keep:
                w.trigger = row
                self.probes["kept"] += 1
                self._write_outputs(w, outputs)
                continue
            for out in outputs:
                if out.path is not None and out.path.is_dir():
                    shutil.rmtree(out.path, ignore_errors=True)
                elif out.path is not None:
                    out.path.unlink(missing_ok=True)
        return bool(keep)

    def _answer(self, n: int, decision) -> None:
        """Rank 0 tells `rlprof capture` what became of its request: armed, refused, captured."""
        for rid, why in decision.refused:
            write_response(self.watch_dir, rid, status="refused", reason=why, step=n)
        for cap in decision.armed:
            if cap.request_id is not None:
                write_response(self.watch_dir, cap.request_id, status="armed", at_step=cap.at_step, stage=cap.stage,
                               role=cap.role, ranks=self._capture_ranks(cap))
        for cap in self._taken:
            if cap.request_id is not None:
                write_response(self.watch_dir, cap.request_id, status="captured", at_step=n, stage=cap.stage,
                               role=cap.role, ranks=self._capture_ranks(cap))

    def _capture_ranks(self, cap) -> list[int]:
        """The ranks a capture is taken on, as the plan says (the same answer on every rank)."""
        if cap.ranks is not None:
            return sorted(set(cap.ranks) | set(cap.extra_ranks))
        roles = [r for r in self._trigger.enabled_roles if cap.role in (None, r)]
        if any(self.plan.role(r).all_ranks for r in roles):
            return list(range(self.world_size))
        return sorted({i for r in roles for i in self.plan.role(r).ranks} | set(cap.extra_ranks))

    # ---- outputs, manifest, faults ----------------------------------------------------------
    def _finish_quietly(self, w: Window, out: Output) -> None:
        try:
            self._finish(w, out)
        except Exception as exc:
            self._fault(w, "export", exc, stopped=True)

    def _finish(self, w: Window, out: Output) -> None:
        spec, rp = w.spec, w.plan
        meta = self._row(w, out)
        if out.finalize_to is not None:
            dest = spec.run_dir / out.finalize_to
            try:
                meta["path"] = dest.name
                out.bytes, truncated = finalize_trace(out.path, dest, meta, rp.max_bytes_per_window)
            finally:
                out.path.unlink(missing_ok=True)
            out.path = dest
            if truncated:
                out.status = "truncated"
                log.warning("rlprof: window %s passed its budget of %d bytes; cut to %d bytes and marked truncated",
                            dest.name, rp.max_bytes_per_window, out.bytes)
        row = self._row(w, out)
        with self._lock:
            append_row(spec.run_dir, row)
            self.windows_written += 1
        if rp.analysis and out.path is not None and out.finalize_to is not None:
            if self._analysis is None:
                from .analysis_hook import AnalysisHook

                self._analysis = AnalysisHook()
            from ..analyze.manifest import row_meta

            self._analysis.submit(str(out.path), str(spec.run_dir), row_meta(row))

    def _row(self, w: Window, out: Output | None, error: str | None = None) -> dict:
        spec, rp = w.spec, w.plan
        row = {
            "run_id": self.run_id, "step": spec.steps[0], "steps": list(spec.steps), "role": spec.role,
            "stage": spec.stage or "e2e", "rank": spec.rank, "world_size": spec.world_size,
            "replica": spec.replica, "tool": rp.tool, "mode": rp.mode,
            "unit": rp.schedule.unit if rp.schedule else None,
            "window": (out.index or 0) if out else 0,
            "path": (out.path.name if out and out.path is not None else None),
            "bytes": out.bytes if out else 0,
            "start_ns": out.start_ns if out else w.start_ns,
            "end_ns": out.end_ns if out else time.time_ns(),
            "status": out.status if out else "failed",
            "roles": list(self.roles),
            **({"trigger": w.trigger} if w.trigger is not None else {}),
            **w.cpu,
            **self._where,
        }
        if error:
            row["error"] = error
        return row

    def _fault(self, w: Window, phase: str, exc: BaseException, stopped: bool = False) -> None:
        """A backend failure: strict plans raise; otherwise log once, mark the window failed, go on."""
        name = w.spec.base_name(None)
        message = f"{w.plan.tool} backend failed to {phase} window {name}: {type(exc).__name__}: {exc}"
        if w.plan.strict:
            w.failed = True
            raise CollectError(message) from exc
        self._note_once(("fault", w.plan.tool, phase, type(exc).__name__),
                        "rlprof: %s (window marked failed; training goes on)", message)
        already = w.failed
        w.failed = True
        if not stopped and phase != "start" and w.backend is not None:
            try:  # release the profiler so later windows can start
                w.backend.stop()
            except Exception:
                pass
        if not already:
            with self._lock:
                append_row(w.spec.run_dir, self._row(w, None, error=message))

    def _note_once(self, key, fmt: str, *args) -> None:
        if key not in self._noted:
            self._noted.add(key)
            log.warning(fmt, *args)


def _close_at_exit(ref) -> None:
    prof = ref()
    if prof is not None:
        try:
            prof.close(wait_analysis=False)
        except Exception as exc:  # never turn interpreter exit into a traceback
            log.warning("rlprof: closing the profiler at exit failed: %s", exc)


class stage:
    """`@rlprof.stage("actor_update", role="actor")` on a worker method, or `with rlprof.stage(...)`.

    Uses the current process's Profiler; without one, it is a plain call.
    """

    __slots__ = ("name", "role", "_scope")

    def __init__(self, name: str, role: str | None = None):
        if name not in STAGES:
            raise ConfigError("stage", name, ", ".join(STAGES))
        if role is not None and role not in ROLES:
            raise ConfigError("role", role, ", ".join(ROLES))
        self.name, self.role, self._scope = name, role, None

    def __call__(self, fn):
        name = self.name  # the role is checked above; the stage alone decides the window (its role is fixed)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            prof = _current
            if prof is None or (name not in prof._stage_now and prof._watch is None):  # a plain call, no `with`
                return fn(*args, **kwargs)
            with prof.stage(name):
                return fn(*args, **kwargs)

        return wrapper

    def __enter__(self):
        prof = _current
        self._scope = NULL if prof is None else prof.stage(self.name)
        return self._scope.__enter__()

    def __exit__(self, *exc):
        scope, self._scope = self._scope, None
        return scope.__exit__(*exc)


def mark(name: str):
    """`with rlprof.mark("name"):` a named range in the current window, if one is open."""
    prof = _current
    return NULL if prof is None else prof.mark(name)


def tick(unit: str) -> None:
    prof = _current
    if prof is not None:
        prof.tick(unit)


__all__ = ["Profiler", "stage", "mark", "tick", "current", "NULL", "UNITS", "ROLE_STAGES", "STAGE_ROLE"]

"""The collection runtime: one Profiler per process, driven by step/stage/tick/mark.

Hot-path rule: a stage boundary, tick or mark that nothing selected does one dict lookup and
returns a shared no-op context whose enter/exit are C builtins: no formatting, no allocation,
no environment lookups (`scopes.py`). A window's life is `window.py`'s; catching the slow step is
`watching.py`'s (a mixin of the Profiler); verl's finish hook is `verl_finish_hook.py`'s.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import time
import weakref
from collections import defaultdict
from pathlib import Path
from typing import Callable

import msgspec

from ..config.plan import ProfilePlan, RolePlan
from ..errors import ConfigError
from ..vocab import ROLE_STAGES, ROLES, STAGE_ROLE, STAGES, TOOLS, UNITS
from ..warn_once import warn_once
from .backends import Backend, WindowSpec, backend_class, why_unavailable
from .manifest import written_where
from .lost import LostWindows
from .naming import shared_run_id, window_name
from .preemption import HELD, finish_on_signal
from .scopes import E2E, NULL, SelectedStage, StepScope, UnitScope, null
from .verl_finish_hook import FinishHook
from .watching import Watching
from .window import Window, WindowWriter

log = logging.getLogger("rlprof")

_current: "Profiler | None" = None


def current() -> "Profiler | None":
    """The Profiler most recently created in this process (used by the @stage decorator and mark())."""
    return _current


class Profiler(Watching):
    """Selective profiling for one process.

    rank / world_size default to torchrun's RANK / WORLD_SIZE. `role` names the role(s) this process
    hosts (default: all, as in a colocated single-process trainer). In async rollout, a replica
    process passes role="rollout" and replica=<index>; rollout ranks are then replica indices.
    `backends` maps a tool name to a factory(spec) -> Backend (tests use it to substitute one). `tags` go into
    every manifest row this process writes (an inference engine's name, version and TP rank). With a trigger in
    the plan, every step is watched (collect/watch.py); `decides=False` is for a process that follows another's
    decisions (an async rollout replica: the driver arms it with `arm`).
    """

    def __init__(
        self,
        plan: ProfilePlan,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        role: str | tuple[str, ...] | None = None,
        replica: int | None = None,
        run_id: str | None = None,
        backends: dict[str, Callable[[WindowSpec], Backend]] | None = None,
        tags: dict | None = None,
        decides: bool = True,
    ):
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
        self.said: set = set()  # the warnings this Profiler has given (each is given once)
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
            problem = why_unavailable(rp.tool)
            if problem and (rp.tool == "torch_memory" or rp.tool not in TOOLS):
                warn_once(
                    ("unavailable", rp.tool),
                    "rlprof: %s; role %s collects nothing here, training goes on",
                    problem,
                    r,
                    said=self.said,
                )
                del self._collecting[r]
            elif problem:
                usable = [t for t in ("torch", "markers", "nsys", "torch_memory", "npu") if not why_unavailable(t)]
                raise ConfigError(
                    f"{r}.tool",
                    rp.tool,
                    "a tool this machine has: " + ", ".join(usable),
                    problem=f"cannot collect here: {problem}",
                )
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
                    if why_unavailable(rp.tool):
                        continue
                    self._factories[rp.tool] = backend_class(rp.tool)
                self._capturable[r] = rp
        watched = plan.trigger is not None
        self.run_id = (
            shared_run_id(run_id) if watched or any(r.enabled and r.steps for r in plan.roles) else (run_id or "")
        )
        if plan.collects_nothing and self.rank == 0:  # said once per job, not once per rank
            from ..config.describe import nothing_collected_line

            log.warning("%s", nothing_collected_line(plan))
        self._step: int | None = None
        self._where = {**written_where(), **(tags or {})}  # every manifest row carries them
        self._stage_now: dict = {}
        # `with prof.stage("actor_update"):` marks a stage and opens its window when selected. `stage` is the C
        # lookup of a dict kept in step with _stage_now: an unselected stage costs one dict hit, no Python frame.
        self._scopes: defaultdict = defaultdict(null)
        self.stage = self._scopes.__getitem__
        self._ticks: dict[str, list[Window]] = {}
        self._open: list[Window] = []
        self._e2e: Window | None = None
        self._units: dict[str, int] = {}
        self._writer = WindowWriter(self.run_id, hosted, self._where, bool(self._collecting or self._capturable))
        self._lost = LostWindows(self.said)  # the windows lost to faults, said without flooding the log
        self._closed = False
        self._finish_hook = FinishHook.of_process(plan, hosted, self.rank, replica)
        self._init_watching(watched, decides)
        _current = self
        atexit.register(_close_at_exit, weakref.ref(self))
        if self._collecting or self._capturable:
            finish_on_signal(self)  # SIGTERM / SIGINT: the windows in flight finished, then the signal goes on

    # ---- public API -------------------------------------------------------------------------
    @classmethod
    def from_config(cls, path=None, overrides=(), **kwargs) -> "Profiler":
        from ..config import load_plan

        return cls(load_plan(path, overrides), **kwargs)

    @property
    def recording(self) -> bool:
        """Whether a window is open in this process now (units marked now are recorded)."""
        return bool(self._open)

    @property
    def windows_written(self) -> int:
        """Windows written to disk so far, with their manifest rows."""
        return self._writer.written

    def run_dir(self, role: str = "actor") -> Path:
        return Path(self.plan.role(role).save_path) / self.run_id

    def step(self, n: int) -> StepScope:
        """`with prof.step(n):` marks global training step n (1-based)."""
        return StepScope(self, n)

    def tick(self, unit: str) -> None:
        """A `unit` boundary (mini_batch, micro_batch, decode_step) has passed: drives schedules."""
        windows = self._ticks.get(unit)
        if windows:
            with HELD:  # a backend's schedule step is not interrupted by a signal's closing of the window
                for w in tuple(windows):
                    w.tick()

    def unit(self, unit: str, **args: int):
        """`with prof.unit("micro_batch", seqs=8, tokens=512):` marks one unit as a range and ticks at its end.
        `args` (integers) say what the unit holds: `seqs`, `tokens` computed, `real_tokens` (not padding),
        `active` sequences of a decode step; the analysis turns them into padding and rollout-tail measures."""
        if not self._open:  # schedules tick only inside open windows
            return NULL
        return UnitScope(self, unit, args)

    def mark(self, name: str):
        """A named range for anything else, recorded in the open window (if any)."""
        if not self._open:
            return NULL
        return self._open[-1].range("rlprof:mark:" + name)

    def close(self, wait_analysis: bool = True) -> None:
        """Close windows left open (an exception, an early exit), flush files and the manifest."""
        with HELD:  # a terminating signal that lands meanwhile is taken once this is done
            self._close(wait_analysis)

    def _close(self, wait_analysis: bool, deadline: float | None = None, why: str = "") -> int:
        """Close; by a `deadline` (a signal's grace time) without the finish hook: how many were listed partial."""
        global _current
        if self._closed:
            return 0
        self._closed = True
        while self._open:
            self._close_window(self._open[-1])
        self._e2e = None
        self._select({})
        late = self._writer.wait(deadline, why)
        self._stop_watch()  # after the windows' rows: a heartbeat that says the job ended says they are in
        if deadline is not None:
            self._writer.abandon()  # what is still being written is listed as partial; the process is ending
        else:
            if self._finish_hook is not None:
                self._finish_hook.closing(self)
            self._writer.close(wait_analysis)
        self._lost.say_total()
        if _current is self:
            _current = None
        return late

    def finish_on_signal(self, deadline: float, why: str) -> str:
        """A terminating signal (collect/preemption.py): the windows in flight finished by `deadline` or listed as
        partial, nothing collected after it. Returns what it did (for the one line said)."""
        opened = len(self._open)
        written = self._writer.written
        late = self._close(False, deadline, why)
        done = self._writer.written - written
        if not (opened or done or late):
            return ""
        return f"{opened} window(s) open, {done} written" + (f", {late} listed as partial" if late else "")

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
        if self._closed:  # closed (by a terminating signal the host's handler survived): nothing more is collected
            return
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
        stage_now: dict = dict.fromkeys(STAGES, E2E) if self._e2e is not None else {}
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
        self._scopes.update((name, SelectedStage(self, name, target)) for name, target in stage_now.items())

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
        if self._finish_hook is not None:
            self._finish_hook.step_ended(self, n)

    def wait_written(self) -> None:
        """Block until every window this process closed is on disk, with its manifest row."""
        self._writer.wait()

    def _open_window(self, rp: RolePlan, stage: str | None, steps: tuple[int, ...]) -> Window:
        with HELD:  # a terminating signal that lands while a window opens is taken once it is open
            return self._open_window_held(rp, stage, steps)

    def _open_window_held(self, rp: RolePlan, stage: str | None, steps: tuple[int, ...]) -> Window:
        if rp.schedule is not None and rp.schedule_for(stage) is None:
            rp = msgspec.structs.replace(rp, schedule=None)  # a stage the schedule does not sample: in full
        role, rank = rp.role, self.rank
        spec = WindowSpec(
            run_dir=self.run_dir(rp.role),  # made by the window's start: a fault there is the window's
            steps=steps,
            role=role,
            stage=stage,
            rank=rank,
            world_size=self.world_size,
            replica=self.replica,
            plan=rp,
            base_name=functools.partial(window_name, steps, role, stage, rank),
        )
        w = Window(spec, self._fault, mark_open=True)
        w.trigger = self._capture_rows.get(stage or "e2e")
        w.probe = w.trigger is None and stage in self._probing and rp.mode == "discrete"
        self._open.append(w)
        t0 = time.perf_counter_ns()
        if not w.start(self._factories[rp.tool]):
            return w
        if w.probe:
            self.probes["windows"] += 1
            self.probes["backend_ns"] += time.perf_counter_ns() - t0
        if rp.schedule is not None:
            self._ticks.setdefault(rp.schedule.unit, []).append(w)
        return w

    def _close_window(self, w: Window) -> None:
        with HELD:
            self._close_window_held(w)

    def _close_window_held(self, w: Window) -> None:
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
        t0 = time.perf_counter_ns()
        outputs = w.stop()
        if w.trigger is not None and w.trigger.get("request_id") is not None:
            self._note_captured(w, outputs)  # what `rlprof capture` waits for from this rank
        if outputs is None:
            return
        if w.probe:  # kept or dropped at the step's end, when the trigger has judged the step
            self.probes["backend_ns"] += time.perf_counter_ns() - t0
            self._held.append((w, outputs))
            return
        self._writer.write(w, outputs)

    def _fault(self, w: Window, message: str, phase: str, exc: BaseException, already: bool) -> None:
        """A window's backend or its writing failed (window.py): the window's row marked failed, and the window said
        lost (collect/lost.py: the first of each kind in full, the next ones counted)."""
        with HELD:
            unwritten = None if already else self._writer.failed_row(w, message)
            if phase == "write the manifest row of":
                outcome = "its trace is kept: `rlprof analyze` recovers it from the run directory"
            else:
                outcome = "window marked failed"
            if unwritten is not None:
                outcome += f"; its manifest row could not be written either ({unwritten})"
            reason = f"{phase} {type(exc).__name__}: {getattr(exc, 'strerror', None) or exc}"
            kind = ("fault", w.plan.tool, phase, type(exc).__name__, getattr(exc, "errno", None))
            self._lost.lost(kind, w.spec.base_name(None), f"rlprof: {message} ({outcome}; training goes on)", reason)


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

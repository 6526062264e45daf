"""The verl plugin's sampler: verl's DistProfiler backend when its config asks for micro-batches. Imported by the
loader only then; it reads the config with `config`'s verl dialect and samples with `collect`'s backends, each stage
call one window of collect/window.py's lifecycle, the file named and placed as verl's own profiler names its traces.

Over 400 lines because it is one backend: verl's interface, each stage call's window and the micro-batch schedule
inside it, and what a fault or a terminating signal does to those windows, all on the sampler's one state.
"""

from __future__ import annotations

import functools
import os
import time
import weakref
from pathlib import Path

from ...collect.backends import WindowSpec, backend_class
from ...collect.device_record import accelerator, device_record, measure_cpu
from ...collect.preemption import HELD, finish_on_signal
from ...collect.lost import LostWindows
from ...collect.scopes import unit_range_name
from ...collect.window import Window, discard
from ...config import resolve_plan
from ...config.describe import verl_alone
from ...errors import ConfigError
from ...frameworks import verl as facts
from ...vocab import STAGE_ROLE
from ...warn_once import warn_once
from .config_keys import field
from .layouts import CURRENT, known_layout, verl_release


def take_over(prof) -> None:
    """A DistProfiler whose schedule has rlprof's unit: its backend becomes a MicroBatchSampler where it collects on
    this rank and the plugin can sample; otherwise one warning, and verl's own profiler stays."""
    try:
        if not (prof.check_enable() and prof.check_this_rank()):
            return  # nothing is collected on this rank; verl's profiler stays as it is
        sampler = MicroBatchSampler.build(prof)  # a unit that is no unit at all: rlprof's ConfigError
    except Exception as exc:
        what = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
        warn_once(
            ("build", what),
            f"rlprof: the verl plugin does not sample micro-batches: {what}; verl goes on, {_instead(prof)}",
        )
        return
    if sampler is not None:
        prof._impl = sampler


def _instead(prof) -> str:
    """What verl's own profiler collects when the plugin does not take over (said in the warning)."""
    tool = getattr(prof, "_tool", None)
    discrete = bool(field(getattr(prof, "tool_config", None), "discrete", False))
    if tool == "torch":
        return (
            "its own torch profiler collects each stage in full, the update's mini-batches by the schedule's "
            "counts" + (" (one trace per stage)" if discrete else " (one trace per step)")
        )
    return f"its own {tool} profiler collects each stage in full"


def _plan(prof):
    """The role's plan, read from verl's config as this worker holds it, with verl's meaning (rlprof's dialect)."""
    config, tool_config = prof.config, prof.tool_config
    tool = getattr(prof, "_tool", None) or field(config, "tool")
    block_keys = {"torch": ("contents", "discrete"), "npu": ("contents", "discrete", "level", "analysis")}
    block = {
        k: _plain(field(tool_config, k))
        for k in block_keys.get(tool, ("discrete",))
        if field(tool_config, k) is not None
    }
    schedule = field(tool_config, "schedule")
    block["schedule"] = {
        k: _plain(field(schedule, k))
        for k in ("unit", "skip_first", "wait", "warmup", "active", "repeat")
        if field(schedule, k) is not None
    }
    role = _worker_role(prof)
    profiler = {
        "enable": True,
        "all_ranks": bool(field(config, "all_ranks", False)),
        "ranks": _plain(field(config, "ranks")) or [],
        "tool_config": {tool: block},
    }
    save_path = field(config, "save_path")
    data = {"global_profiler": {"tool": tool, "steps": [1], **({"save_path": str(save_path)} if save_path else {})}}
    path = facts.ROLE_BLOCKS["critic" if role == "critic" else "actor"].split(".")
    node = data
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = profiler
    return resolve_plan(data).role("critic" if role == "critic" else "actor")


def _plain(value):
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
        return [_plain(v) for v in value]
    return value


def _worker_role(prof) -> str:
    prefix = getattr(prof, "save_file_prefix", None)
    return facts.WORKER_ROLES.get(facts.STEM_PART.sub("-", str(prefix)).strip("-"), "actor") if prefix else "actor"


class MicroBatchSampler:
    """verl's DistProfiler backend (its `_impl`) for a role whose schedule samples micro-batches.

    verl calls start(profile_step=N) / stop() on each profiled step of the selected ranks, and annotate(role=stage)
    around each stage it marks. A stage that runs micro-batches is a window of its own; other stages go to verl's
    own backend in discrete mode and are not recorded in e2e mode (its whole-step trace would hold the sampled
    stages in full)."""

    def __init__(self, prof, plan, layout: str):
        self.inner = prof._impl  # verl's own backend, for the stages not sampled (discrete mode)
        self.rank = int(getattr(prof, "rank", 0) or 0)
        self.prefix = getattr(prof, "save_file_prefix", None)
        self.role = _worker_role(prof)
        self.plan, self.layout = plan, layout
        self.step_n: int | None = None
        self.windows: weakref.WeakSet = weakref.WeakSet()
        self.lost = LostWindows()  # the stage windows lost to faults, said without flooding verl's log
        self.cpu = measure_cpu() if accelerator() is None else None  # the device a CPU worker has, measured once
        finish_on_signal(self)  # SIGTERM / SIGINT in verl's worker: its open windows finished, verl's handler chained

    @classmethod
    def build(cls, prof) -> "MicroBatchSampler | None":
        plan = _plan(prof)  # a bad value: rlprof's ConfigError (key, value, what is allowed)
        if plan.schedule is None or plan.schedule.unit != facts.PLUGIN_UNIT:
            unit = plan.schedule.unit if plan.schedule else None
            warn_once(
                ("unit", unit),
                f"rlprof: unit {unit} is not sampled inside verl's workers (the verl plugin "
                f"samples {facts.PLUGIN_UNIT}); verl goes on, {_instead(prof)}",
            )
            return None
        if plan.tool not in ("torch", "npu"):
            warn_once(
                ("tool", plan.tool),
                f"rlprof: tool {plan.tool} cannot sample micro-batches (torch and npu "
                f"can); verl goes on, {_instead(prof)}",
            )
            return None
        release = verl_release()
        layout = known_layout(release, verl_alone(plan, release).split(": ", 1)[-1])
        return None if layout is None else cls(prof, plan, layout)

    # verl's backend interface -------------------------------------------------------------------------------
    def start(self, **kwargs):
        self.step_n = kwargs.get("profile_step", kwargs.get("global_step"))
        if self.plan.mode == "discrete":
            return getattr(self.inner, "start", lambda **_: None)(**kwargs)

    def stop(self, *args, **kwargs):
        for window in list(self.windows):  # a stage left open by an error: closed and kept
            window.close()
        self.lost.say_total()
        if self.plan.mode == "discrete":
            return getattr(self.inner, "stop", lambda *a, **k: None)(*args, **kwargs)

    def step(self):
        """verl's per-mini-batch step(): the unit here is the micro-batch, counted by the loop itself."""

    def annotate(self, message=None, role=None, **kwargs):
        name = role or message
        stage = facts.stage_of_annotation(name) if name else None
        if name == facts.TRAIN_BATCH:  # a TrainingWorker's own update mini-batch (the critic's in verl 0.9.x)
            stage = facts.UPDATE_STAGE_OF_ROLE.get(self.role)
        if stage not in facts.MICRO_BATCH_STAGES:
            if self.plan.mode == "discrete" and hasattr(self.inner, "annotate"):
                return self.inner.annotate(message=message, role=role, **kwargs)
            return _unchanged

        def decorator(func):
            @functools.wraps(func)
            def wrapper(*args, **kw):
                window = self.open(stage)
                if window is None:
                    return func(*args, **kw)
                token = CURRENT.set(window)
                started = time.perf_counter()
                try:
                    return func(*args, **kw)
                finally:
                    window.call_ms = (time.perf_counter() - started) * 1e3  # the call, not its window's export
                    CURRENT.reset(token)
                    window.close()

            return wrapper

        return decorator

    def fault(self, kind: tuple, stage: str, message: str) -> None:
        """A stage window lost: the first of each kind in full, the next ones counted (collect/lost.py)."""
        self.lost.lost(kind, f"{stage} of step {self.step_n}", message, f"{kind[0]}: {kind[1]}")

    def finish_on_signal(self, deadline: float, why: str) -> str:
        """A terminating signal (collect/preemption.py): each open stage window closed and written while the grace
        time lasts; past it, its raw export is kept for `rlprof analyze` and named."""
        open_windows = list(self.windows)
        for window in open_windows:
            window.close(deadline=deadline, why=why)
        return f"{len(open_windows)} verl stage window(s) closed" if open_windows else ""

    def open(self, stage: str) -> "SampledStage | None":
        window = SampledStage(self, stage)
        if window.window.failed:
            return None
        self.windows.add(window)
        return window


def _unchanged(func):
    return func


class SampledStage:
    """One stage call: a backend window whose schedule advances one micro-batch at a time (lazily: the step that ends
    unit k is taken at the head of unit k+1, so nothing after a stage's last micro-batch opens a new cycle)."""

    def __init__(self, sampler: MicroBatchSampler, stage: str):
        self.sampler, self.stage = sampler, stage
        plan = sampler.plan
        self.schedule = plan.schedule
        self.k = -1  # the unit now running (0-based within the stage call)
        self.unit = self.stage_range = None
        self.kept: list[int] = []
        self.call_ms: float | None = None
        self.timed_ms, self.timed_calls = 0.0, []  # the calls inside it that verl's own timers wrap
        self.tally = CallTally()
        self.save_path = Path(plan.save_path)
        self.world_size = _world_size()
        spec = WindowSpec(
            run_dir=self.save_path,
            steps=(sampler.step_n,),
            role=STAGE_ROLE.get(stage, sampler.role),
            stage=stage,
            rank=sampler.rank,
            world_size=self.world_size or 1,
            replica=None,
            plan=plan,
            base_name=lambda index: stage,
        )
        self.window = Window(spec, self._fault, watch_load=False)
        try:
            self.save_path.mkdir(parents=True, exist_ok=True)
            self.stem = _stem(sampler, stage, self.world_size)
        except Exception as exc:
            self.window.fault("start", exc)
            return
        self.window.start(_torch_backend_class() if plan.tool == "torch" else backend_class(plan.tool))

    def _fault(self, window: Window, message: str, phase: str, exc: BaseException, already: bool) -> None:
        if phase == "start":
            self.sampler.fault(
                ("open", type(exc).__name__),
                self.stage,
                f"rlprof: could not open a window for {self.stage} "
                f"({type(exc).__name__}: {exc}); verl goes on unprofiled there",
            )
        else:
            self.sampler.fault(
                ("fault", type(exc).__name__),
                self.stage,
                f"rlprof: sampling {self.stage} failed ({type(exc).__name__}: "
                f"{exc}); the window is dropped and training goes on",
            )

    def unit_begins(self, describe, lengths=None) -> None:
        """Unit k+1 begins: `describe()` says what it holds (called for a kept unit only), `lengths()` where its rows'
        real lengths are, as `(kind, tensor)` (every unit: counted when the call's window has stopped, CallTally)."""
        with HELD:  # a signal's closing of the window waits for the schedule's step
            self._unit_begins(describe)
            if lengths is not None:
                self.tally.add(lengths)

    def _unit_begins(self, describe) -> None:
        if self.window.failed or self.window.closed:
            return
        try:
            if self.unit is not None:
                self._unit_ends()
            k = self.k + 1
            phase, _ = self.schedule.phase(k)
            held = describe() if phase == "active" else None  # before the step: its ops stay out of the window
            if self.k >= 0:
                self.window.backend.step()
            self.k = k
            if phase == "active":
                if self.stage_range is None:
                    self.stage_range = self._enter("rlprof:stage:" + self.stage)
                self.unit = self._enter(unit_range_name(facts.PLUGIN_UNIT, k, held))
                self.kept.append(k)
        except Exception as exc:
            self.window.fault("step", exc)

    def unit_ends(self) -> None:
        with HELD:
            self._unit_ends()

    def _unit_ends(self) -> None:
        if self.window.failed or self.window.closed:
            return
        try:
            if self.unit is not None:
                unit, self.unit = self.unit, None
                unit.__exit__(None, None, None)
            if self.stage_range is not None:
                now, cycle = self.schedule.phase(self.k)
                after, next_cycle = self.schedule.phase(self.k + 1)
                if not (after == "active" and next_cycle == cycle):  # this cycle's last kept unit: its file ends
                    stage_range, self.stage_range = self.stage_range, None
                    stage_range.__exit__(None, None, None)
        except Exception as exc:
            self.window.fault("step", exc)

    def _enter(self, name: str):
        rng = self.window.backend.range(name)
        rng.__enter__()
        return rng

    def close(self, deadline: float | None = None, why: str = "") -> None:
        """The stage call ended: the window stopped and written. With a `deadline` (a terminating signal's grace
        time, time.monotonic), a raw export not yet written by then stays as it is, named in a warning."""
        with HELD:
            self._close(deadline, why)

    def _close(self, deadline: float | None, why: str) -> None:
        if self.window.closed:
            return
        self.sampler.windows.discard(self)
        if self.window.failed:
            self.window.closed = True
            return
        try:
            self._end_ranges()
        except Exception as exc:
            self.window.fault("stop", exc)
        outputs = self.window.stop()
        if outputs is None:
            return
        if self.k < 0:  # no micro-batch went through a loop the plugin knows: nothing sampled
            discard(outputs)
            warn_once(
                ("no-units", self.stage),
                f"rlprof: {self.stage} ran no micro-batch through the loop the verl "
                f"plugin watches ({self.sampler.layout} layout; another engine or strategy?): nothing was "
                "sampled in it",
            )
            return
        for out in outputs:
            if deadline is not None and time.monotonic() >= deadline and out.finalize_to is not None:
                print(
                    f"[rlprof] rank {self.sampler.rank}: {self.stage} step {self.sampler.step_n}: {why}; its raw "
                    f"export {out.path} is kept (`rlprof analyze` reads it)",
                    flush=True,
                )
                continue
            try:
                self._finish(out)
            except Exception as exc:
                discard([out])
                self.sampler.fault(
                    ("export", type(exc).__name__),
                    self.stage,
                    f"rlprof: a {self.stage} window could not be written "
                    f"({type(exc).__name__}: {exc}); training goes on",
                )

    def _end_ranges(self) -> None:
        if self.unit is not None:
            unit, self.unit = self.unit, None
            unit.__exit__(None, None, None)
        if self.stage_range is not None:
            stage_range, self.stage_range = self.stage_range, None
            stage_range.__exit__(None, None, None)

    def _finish(self, out) -> None:
        if out.finalize_to is None:  # npu: torch_npu wrote its own directory under save_path/<stage>/
            return
        suffix = f"_part{out.index}" if out.index else ""
        dest = self.save_path / f"{self.stem}{suffix}.json.gz"
        plan, sampler = self.sampler.plan, self.sampler
        meta = {
            "step": sampler.step_n,
            "role": self.window.spec.role,
            "stage": self.stage,
            "rank": sampler.rank,
            "world_size": self.world_size,
            "tool": plan.tool,
            "mode": "discrete",
            "window": out.index or 0,
            "framework": "verl",
            "collected_by": facts.PLUGIN_MODULE,
            "sampled": {"unit": facts.PLUGIN_UNIT, "kept": self.kept, **self._call()},
            **({"device": device} if (device := device_record(sampler.cpu)) is not None else {}),
        }  # a window of units, not one unit
        truncated = self.window.finalize(out, dest, meta)
        print(
            f"[rlprof] rank {sampler.rank}: {self.stage} step {sampler.step_n}: micro-batch(es) "
            f"{', '.join(map(str, self.kept))} -> {dest}" + (" (truncated)" if truncated else ""),
            flush=True,
        )

    def timed(self, seconds: float, name: str) -> None:
        """A call verl's own timer wraps for its mfu ran inside this stage call (layouts.py)."""
        self.timed_ms += seconds * 1e3
        self.timed_calls.append(name)

    def _call(self) -> dict:
        """The whole stage call the kept units came from: its time as verl's own mfu takes it (the calls its timers
        wrap; the stage call whole where none ran) and every unit's real tokens and query-key pairs, so that its rate
        is the one verl's own mfu states."""
        if self.call_ms is None:
            return {}
        if self.timed_calls:
            names = sorted(set(self.timed_calls))
            wall, timed = self.timed_ms, f"{len(self.timed_calls)} x " + " + ".join(names)
        else:
            wall, timed = self.call_ms, "the stage call"
        return {"call": {"wall_ms": wall, "timed": timed, "units": self.k + 1, **self.tally.totals()}}


class CallTally:
    """Every micro-batch's real lengths over one stage call, held as verl holds them (its rows' offsets or attention
    mask, a reference and no operator) and counted once the call's window has stopped: no operator of rlprof's inside
    a kept window, no sync per micro-batch. A fault leaves the call's work unsaid; it never reaches the stage."""

    def __init__(self):
        self.held: list[tuple[str, object]] = []
        self.failed = False
        self._totals: dict | None = None

    def add(self, lengths) -> None:
        if self.failed:
            return
        try:
            self.held.append(lengths())
        except Exception:
            self.failed = True

    def totals(self) -> dict:
        if self._totals is None:
            self._totals = {} if self.failed or not self.held else self._count()
            self.held = []  # the batch's tensors let go
        return self._totals

    def _count(self) -> dict:
        tokens = pairs = 0
        try:
            for kind, tensor in self.held:
                n = (tensor.diff() if kind == "offsets" else tensor.sum(-1)).long()
                tokens += int(n.sum())
                pairs += int((n * n).sum())
        except Exception:
            return {}
        return {"real_tokens": tokens, "query_key_pairs": pairs, "tallied_units": len(self.held)}


def _world_size() -> int | None:
    try:
        import torch.distributed as dist

        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else None
    except Exception:
        return None


def _stem(sampler: MicroBatchSampler, stage: str, world_size: int | None) -> str:
    """verl's own trace stem for this stage (its build_trace_basename where it has one: verl 0.9.1 on)."""
    try:
        from verl.utils.profiler.torch_profile import build_trace_basename
    except ImportError:
        build_trace_basename = None
    if build_trace_basename is not None:
        return build_trace_basename(
            rank=sampler.rank, role=stage, save_file_prefix=sampler.prefix, profile_step=sampler.step_n
        )
    from datetime import datetime, timezone

    stamp = datetime.now(tz=timezone.utc).astimezone().strftime("%Y%m%d%H%M%S%f")[:-3]
    return facts.trace_stem(sampler.rank, stage, sampler.prefix, sampler.step_n, world_size, os.getpid(), stamp)


def _sampling_torch_backend():
    from ...collect.backends.torch_backend import TorchBackend

    class SamplingTorchBackend(TorchBackend):
        """rlprof's torch backend without torch's ProfilerStep# ranges (a step here is a micro-batch), and keeping
        a cycle the stage ended in the middle of (torch saves a cycle only once it reaches its last unit)."""

        record_steps = False

        def stop(self):
            prof = self._prof
            action = self._torch.profiler.ProfilerAction
            if (
                prof is not None
                and self.spec.schedule is not None
                and getattr(prof, "current_action", None) is action.RECORD
            ):
                prof.current_action = action.RECORD_AND_SAVE
            return super().stop()

    return SamplingTorchBackend


_torch_backend: list = []  # the class above, built on first use (importing torch is the backend's business)


def _torch_backend_class():
    if not _torch_backend:
        _torch_backend.append(_sampling_torch_backend())
    return _torch_backend[0]

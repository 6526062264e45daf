"""torch.profiler backend: CPU and CUDA activity, shapes, memory, stacks, modules; native schedule.

A range still open where a schedule cycle ends (the mini-batch around a sampled micro-batch, the stage around a
sampled decode step) is closed there and opened again where the next cycle starts recording (`SplitRange`): torch
keeps no end for a range open at its stop, borrows one, and prints a C++ warning naming it into the user's terminal;
a range opened before its cycle began recording would be missing from the trace altogether.
"""

from __future__ import annotations

import threading
import time
import warnings
from pathlib import Path


from .base import Backend, Output, export_raw
from ..device_memory import device_memory
from ..naming import TRACE_SUFFIX

# A schedule without warmup and one file per cycle are deliberate choices of the plan, not mistakes.
warnings.filterwarnings("ignore", message="Profiler won't be using warmup")
warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")


def _activities(torch, contents: tuple[str, ...]):
    acts = []
    if "cpu" in contents:
        acts.append(torch.profiler.ProfilerActivity.CPU)
    if "cuda" in contents and torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts or [torch.profiler.ProfilerActivity.CPU]


class SplitRange:
    """A record_function range its backend can close at a cycle's end and open again when the next cycle records.
    Only the thread that drives the schedule splits its own ranges (a range is entered and left on one thread)."""

    __slots__ = ("backend", "name", "thread", "handle")

    def __init__(self, backend: "TorchBackend", name: str):
        self.backend, self.name, self.thread, self.handle = backend, name, None, None

    def __enter__(self):
        self.thread = threading.get_ident()
        self.resume()
        self.backend._ranges.append(self)
        return self

    def __exit__(self, *exc):
        ranges = self.backend._ranges
        if self in ranges:
            ranges.remove(self)
        self.suspend()
        return False

    def suspend(self) -> None:
        if self.handle is not None:
            handle, self.handle = self.handle, None
            handle.__exit__(None, None, None)

    def resume(self) -> None:
        self.handle = self.backend._torch.profiler.record_function(self.name)
        self.handle.__enter__()


class TorchBackend(Backend):
    tool = "torch"
    record_steps = True  # torch's `ProfilerStep#<n>` range at each step() (n counts schedule units, not RL steps)

    def __init__(self, spec, device_api=None):
        super().__init__(spec)
        import torch
        from torch.profiler import ProfilerAction

        self._torch = torch
        self._prof = None
        self._raw: list[tuple[Path, int | None, int, int, dict | None]] = []  # exported raw traces to finalize
        self._cycle = 0
        self._cycle_start = 0
        self._ranges: list[SplitRange] = []  # open now, outermost first
        self._save, self._recording = (
            ProfilerAction.RECORD_AND_SAVE,
            (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE),
        )
        # the device's memory beside each trace, where the window records memory on an accelerator (torch.cuda's)
        self._device_memory = "memory" in spec.plan.contents and "cuda" in spec.plan.contents
        self._device_api = device_api

    def start(self) -> None:
        torch, plan = self._torch, self.spec.plan
        contents = plan.contents
        kwargs = dict(
            activities=_activities(torch, contents),
            record_shapes="shapes" in contents,
            profile_memory="memory" in contents,
            with_stack="stack" in contents,
            with_modules="module" in contents,
        )
        s = plan.schedule
        if s is not None:
            kwargs["schedule"] = torch.profiler.schedule(
                skip_first=s.skip_first, wait=s.wait, warmup=s.warmup, active=s.active, repeat=s.repeat
            )
            kwargs["on_trace_ready"] = self._on_ready
        self._prof = torch.profiler.profile(**kwargs)
        self._prof.record_steps = self.record_steps
        self._cycle_start = time.time_ns()
        self._prof.start()

    def _export(self, prof, index: int | None) -> None:
        raw = export_raw(self.spec.run_dir, self.spec.base_name(index), prof.export_chrome_trace)
        memory = device_memory("cuda", self._device_api) if self._device_memory else None
        self._raw.append((raw, index, self._cycle_start, time.time_ns(), memory))

    def _on_ready(self, prof) -> None:
        # Called by torch at the end of each active cycle; index = the cycle (the _w{K} of the name).
        self._export(prof, self._cycle if self.spec.multi_cycle else None)
        self._cycle += 1
        self._cycle_start = time.time_ns()

    def step(self) -> None:
        prof = self._prof
        if not self._ranges:
            prof.step()
            return
        now = prof.current_action
        edge = now == self._save or (now not in self._recording and prof.schedule(prof.step_num + 1) in self._recording)
        mine = [r for r in self._ranges if r.thread == threading.get_ident()] if edge else ()
        for r in reversed(mine):  # this step ends a cycle or begins one: close them, innermost first
            r.suspend()
        prof.step()
        if mine and prof.current_action in self._recording:
            for r in mine:
                r.resume()

    def range(self, name: str):
        return SplitRange(self, name)

    def stop(self) -> list[Output]:
        prof, self._prof = self._prof, None
        for r in reversed(self._ranges):  # still open at the window's end: closed in the trace, not left open
            if r.thread == threading.get_ident():
                r.suspend()
        try:
            prof.stop()
            if self.spec.schedule is None:
                self._export(prof, None)
        except Exception:
            for raw, *_ in self._raw:  # the cycles exported before the fault go with the failed window
                raw.unlink(missing_ok=True)
            raise
        return [
            Output(
                path=raw,
                index=index,
                start_ns=t0,
                end_ns=t1,
                finalize_to=self.spec.base_name(index) + TRACE_SUFFIX,
                device_memory=memory,
            )
            for raw, index, t0, t1, memory in self._raw
        ]

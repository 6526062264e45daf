"""torch.profiler backend: CPU and CUDA activity, shapes, memory, stacks, modules; native schedule."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

from .base import Backend, Output, export_raw
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


class TorchBackend(Backend):
    tool = "torch"
    record_steps = True  # torch's `ProfilerStep#<n>` range at each step() (n counts schedule units, not RL steps)

    def __init__(self, spec):
        super().__init__(spec)
        import torch

        self._torch = torch
        self._prof = None
        self._raw: list[tuple[Path, int | None, int, int]] = []  # exported raw traces awaiting finalize
        self._cycle = 0
        self._cycle_start = 0

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
        self._raw.append((raw, index, self._cycle_start, time.time_ns()))

    def _on_ready(self, prof) -> None:
        # Called by torch at the end of each active cycle; index = the cycle (the _w{K} of the name).
        self._export(prof, self._cycle if self.spec.multi_cycle else None)
        self._cycle += 1
        self._cycle_start = time.time_ns()

    def step(self) -> None:
        self._prof.step()

    def range(self, name: str):
        return self._torch.profiler.record_function(name)

    def stop(self) -> list[Output]:
        prof, self._prof = self._prof, None
        try:
            prof.stop()
            if self.spec.schedule is None:
                self._export(prof, None)
        except Exception:
            for raw, *_ in self._raw:  # the cycles exported before the fault go with the failed window
                raw.unlink(missing_ok=True)
            raise
        return [
            Output(path=raw, index=index, start_ns=t0, end_ns=t1, finalize_to=self.spec.base_name(index) + TRACE_SUFFIX)
            for raw, index, t0, t1 in self._raw
        ]

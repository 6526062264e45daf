"""CUDA caching-allocator history + snapshot (torch.cuda.memory). Needs CUDA.

A snapshot does not hold the device's capacity: each one's manifest row carries the device's memory at the dump
(`device_memory.py`), which the analysis's memory measure is computed against."""

from __future__ import annotations

import time
from contextlib import nullcontext

from .base import Backend, CycleTracker, Output
from ..device_memory import device_memory
from ..naming import MEMORY_SUFFIX


class TorchMemoryBackend(Backend):
    tool = "torch_memory"

    def __init__(self, spec, memory_api=None, device_api=None):
        super().__init__(spec)
        if memory_api is None or device_api is None:
            import torch

            memory_api = memory_api or torch.cuda.memory
            device_api = device_api or torch.cuda
        self._mem, self._device = memory_api, device_api
        self._cycles = CycleTracker(spec.schedule)
        self._recording_since: int | None = None
        self._outputs: list[Output] = []

    def _begin(self) -> None:
        opts = self.spec.plan.memory
        # torch keeps whole Python stacks; stack_depth 0 turns stack capture off entirely.
        self._mem._record_memory_history(
            enabled="all", context="all" if opts.stack_depth else None, stacks="python", max_entries=opts.max_entries
        )
        self._recording_since = time.time_ns()

    def _end(self, cycle: int) -> None:
        index = cycle if self.spec.multi_cycle else None
        path = self.spec.run_dir / (self.spec.base_name(index) + MEMORY_SUFFIX)
        self._mem._dump_snapshot(str(path))
        self._mem._record_memory_history(enabled=None)
        self._outputs.append(
            Output(
                path=path,
                index=index,
                start_ns=self._recording_since,
                end_ns=time.time_ns(),
                bytes=path.stat().st_size,
                device_memory=device_memory("cuda", self._device),
            )
        )
        self._recording_since = None

    def start(self) -> None:
        if self._cycles.phase()[0] == "active":
            self._begin()

    def step(self) -> None:
        ended, began = self._cycles.advance()
        if ended is not None:
            self._end(ended)
        if began:
            self._begin()

    def range(self, name: str):
        return nullcontext()

    def stop(self) -> list[Output]:
        if self._recording_since is not None:
            self._end(self._cycles.phase()[1])
        return self._outputs

"""Nsight Systems: NVTX ranges + cudaProfilerStart/Stop capture ranges for an outer
`nsys profile --capture-range=cudaProfilerApi`. rlprof writes no trace file itself."""

from __future__ import annotations

import time

from .base import Backend, CycleTracker, Output, PushPopRange


class CudaNvtxApi:
    """The real calls: torch.cuda.profiler for capture ranges, the `nvtx` package (else torch.cuda.nvtx)."""

    def __init__(self):
        import torch

        self._profiler = torch.cuda.profiler
        try:
            import nvtx

            self._domain = nvtx.get_domain("rlprof")
            self._nvtx = nvtx
        except ImportError:
            self._nvtx = None
            self._torch_nvtx = torch.cuda.nvtx

    def capture_start(self) -> None:
        self._profiler.start()

    def capture_stop(self) -> None:
        self._profiler.stop()

    def range_push(self, name: str):
        if self._nvtx is not None:
            return self._domain.start_range(self._domain.get_event_attributes(message=name))
        return self._torch_nvtx.range_push(name)

    def range_pop(self, handle) -> None:
        if self._nvtx is not None:
            self._domain.end_range(handle)
        else:
            self._torch_nvtx.range_pop()


def nvtx_range(api, name: str) -> PushPopRange:
    return PushPopRange(api.range_push, api.range_pop, name)


class NsysBackend(Backend):
    tool = "nsys"

    def __init__(self, spec, api=None):
        super().__init__(spec)
        self._api = api or CudaNvtxApi()
        self._cycles = CycleTracker(spec.schedule)
        self._since: int | None = None
        self._window_range = None
        self._outputs: list[Output] = []

    def _capture(self, on: bool, cycle: int = 0) -> None:
        if on:
            self._api.capture_start()
            self._since = time.time_ns()
        else:
            self._api.capture_stop()
            index = cycle if self.spec.multi_cycle else None
            self._outputs.append(Output(path=None, index=index, start_ns=self._since, end_ns=time.time_ns()))
            self._since = None

    def start(self) -> None:
        label = self.spec.base_name(None)
        self._window_range = nvtx_range(self._api, label).__enter__()
        if self._cycles.phase()[0] == "active":
            self._capture(True)

    def step(self) -> None:
        ended, began = self._cycles.advance()
        if ended is not None:
            self._capture(False, ended)
        if began:
            self._capture(True)

    def range(self, name: str):
        return nvtx_range(self._api, name)

    def stop(self) -> list[Output]:
        if self._since is not None:
            self._capture(False, self._cycles.phase()[1])
        self._window_range.__exit__(None, None, None)
        return self._outputs

"""Lightweight markers: named ranges only. NVTX on CUDA, mstx on NPU, and always rlprof's own
stage timeline (a small Chrome-trace file). Cheap enough to leave on for every step."""

from __future__ import annotations

import json
import os
import threading
import time

from .base import Backend, Output, export_raw
from ..naming import TIMELINE_SUFFIX

_now = time.perf_counter_ns


class TimelineRange:
    __slots__ = ("sink", "name", "t0")

    def __init__(self, sink: list, name: str):
        self.sink, self.name = sink, name

    def __enter__(self):
        self.t0 = _now()
        return self

    def __exit__(self, *exc):
        self.sink.append((self.name, self.t0, _now(), threading.get_ident()))
        return False


class TeeRange:
    """Timeline range plus the device marker range (NVTX/mstx) where one exists."""

    __slots__ = ("timeline", "device")

    def __init__(self, timeline, device):
        self.timeline, self.device = timeline, device

    def __enter__(self):
        self.device.__enter__()
        self.timeline.__enter__()
        return self

    def __exit__(self, *exc):
        self.timeline.__exit__(*exc)
        self.device.__exit__(*exc)
        return False


def _device_ranges():
    """A factory of device marker ranges, or None on a plain CPU machine."""
    try:
        import torch_npu

        from .npu import mstx_range

        return lambda name: mstx_range(torch_npu.npu.mstx, name)
    except ImportError:
        pass
    try:
        import torch

        if torch.cuda.is_available():
            from .nsys import CudaNvtxApi, nvtx_range

            api = CudaNvtxApi()
            return lambda name: nvtx_range(api, name)
    except ImportError:
        pass
    return None


class MarkersBackend(Backend):
    tool = "markers"

    def __init__(self, spec, device_ranges="auto"):
        super().__init__(spec)
        self._device = _device_ranges() if device_ranges == "auto" else device_ranges
        self._events: list[tuple[str, int, int, int]] = []
        self._wall0 = self._perf0 = 0

    def start(self) -> None:
        self._wall0, self._perf0 = time.time_ns(), _now()

    def range(self, name: str):
        timeline = TimelineRange(self._events, name)
        return timeline if self._device is None else TeeRange(timeline, self._device(name))

    def stop(self) -> list[Output]:
        end = time.time_ns()
        offset = self._wall0 - self._perf0  # perf_counter -> wall clock, so ranks line up
        pid = os.getpid()
        events = [
            {
                "ph": "M",
                "name": "process_name",
                "pid": pid,
                "tid": 0,
                "args": {"name": f"rlprof markers rank {self.spec.rank}"},
            }
        ]
        for name, t0, t1, tid in self._events:
            cat = name.split(":", 2)[1] if name.startswith("rlprof:") else "mark"
            events.append(
                {
                    "ph": "X",
                    "cat": cat,
                    "name": name,
                    "pid": pid,
                    "tid": tid,
                    "ts": (t0 + offset) / 1e3,
                    "dur": (t1 - t0) / 1e3,
                }
            )

        def write(path: str) -> None:
            with open(path, "w") as f:
                json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f, separators=(",", ":"))

        raw = export_raw(self.spec.run_dir, self.spec.base_name(None), write)
        return [
            Output(
                path=raw,
                index=None,
                start_ns=self._wall0,
                end_ns=end,
                finalize_to=self.spec.base_name(None) + TIMELINE_SUFFIX,
            )
        ]

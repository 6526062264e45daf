"""Ascend NPU backend: the plan mapped onto torch_npu.profiler, stage ranges as mstx ranges."""

from __future__ import annotations

import time

from .base import Backend, Output, PushPopRange
from ..device_memory import device_memory

LEVELS = {"level_none": "Level_none", "level0": "Level0", "level1": "Level1", "level2": "Level2"}
EXPORT_TYPES = {"text": "Text", "db": "Db"}


def mstx_range(mstx, name: str) -> PushPopRange:
    return PushPopRange(mstx.range_start, mstx.range_end, name)


def profiler_kwargs(tnp, plan, dir_name: str, worker_name: str) -> dict:
    """Exact keyword arguments of torch_npu.profiler.profile for a role plan."""
    contents = plan.contents
    activities = []
    if "cpu" in contents:
        activities.append(tnp.ProfilerActivity.CPU)
    if "npu" in contents:
        activities.append(tnp.ProfilerActivity.NPU)
    level = getattr(tnp.ProfilerLevel, LEVELS[plan.level or "level0"])
    export = getattr(tnp.ExportType, EXPORT_TYPES[plan.export_type or "text"])
    # mstx ranges need msprof_tx; torch_npu refuses it together with Db export at Level_none.
    msprof_tx = not (plan.export_type == "db" and plan.level == "level_none")
    experimental = tnp._ExperimentalConfig(
        export_type=export,
        profiler_level=level,
        msprof_tx=msprof_tx,
        aic_metrics=tnp.AiCMetrics.AiCoreNone,
        data_simplification=True,
    )
    kwargs = dict(
        activities=activities,
        record_shapes="shapes" in contents,
        profile_memory="memory" in contents,
        with_stack="stack" in contents,
        with_modules="module" in contents,
        experimental_config=experimental,
        on_trace_ready=tnp.tensorboard_trace_handler(dir_name, worker_name=worker_name, analyse_flag=plan.analysis),
    )
    s = plan.schedule
    if s is not None:
        kwargs["schedule"] = tnp.schedule(
            wait=s.wait, warmup=s.warmup, active=s.active, repeat=s.repeat, skip_first=s.skip_first
        )
    return kwargs


class NpuBackend(Backend):
    tool = "npu"

    def __init__(self, spec, torch_npu=None, device_api=None):
        super().__init__(spec)
        if torch_npu is None:
            import torch_npu
        self._tnp = torch_npu.profiler
        self._mstx = torch_npu.npu.mstx
        self._device_api = device_api  # torch.npu (torch_npu's, answering as torch.cuda does) where None
        self._dir = spec.run_dir / spec.base_name(None)
        self._prof = None
        self._t0 = 0

    def start(self) -> None:
        self._dir.mkdir(parents=True, exist_ok=True)
        self._prof = self._tnp.profile(
            **profiler_kwargs(self._tnp, self.spec.plan, str(self._dir), self.spec.base_name(None))
        )
        self._t0 = time.time_ns()
        self._prof.start()

    def step(self) -> None:
        self._prof.step()

    def range(self, name: str):
        return mstx_range(self._mstx, name)

    def stop(self) -> list[Output]:
        self._prof.stop()
        t1 = time.time_ns()
        # the device's memory beside a window that records memory: its capacity, for the analysis's memory measure
        memory = device_memory("npu", self._device_api) if "memory" in self.spec.plan.contents else None
        written = sorted(p for p in self._dir.iterdir() if p.is_dir() and p.name.endswith("_ascend_pt"))
        multi = self.spec.multi_cycle or len(written) > 1
        return [
            Output(
                path=p,
                index=i if multi else None,
                start_ns=self._t0,
                end_ns=t1,
                bytes=sum(f.stat().st_size for f in p.rglob("*") if f.is_file()),
                device_memory=memory,
            )
            for i, p in enumerate(written)
        ]

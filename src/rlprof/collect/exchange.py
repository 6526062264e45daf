"""The trigger's transport: every rank's step-end vector to every rank (collect/trigger.py decides on the matrix)."""

from __future__ import annotations

import sys
import time

import numpy as np


class Exchange:
    """Every rank's vector to every rank: one all_gather over the job's default process group (its own, gloo or
    NCCL), or the local row alone. `last_us` is the collective's cost, measured."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.dist = None
        self.resolved = False  # the group is looked for at the first step end: a host may start it after the Profiler
        self.last_us = 0.0
        self.total_us = 0.0
        self.calls = 0

    def _resolve(self) -> None:
        self.resolved = True
        dist = sys.modules.get("torch.distributed")  # a host that never imported torch.distributed has no group
        if (
            dist is not None
            and dist.is_available()
            and dist.is_initialized()
            and self.world_size > 1
            and dist.get_world_size() == self.world_size
        ):
            self.dist = dist

    def gather(self, vec: list[float]) -> np.ndarray:
        if not self.resolved:
            self._resolve()
        t0 = time.perf_counter_ns()
        if self.dist is None:
            out = np.asarray([vec], dtype=np.float64)
        else:
            import torch

            dist = self.dist
            device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
            mine = torch.tensor(vec, dtype=torch.float64, device=device)
            parts = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
            dist.all_gather(parts, mine)
            out = torch.stack(parts).cpu().numpy()
        self.last_us = (time.perf_counter_ns() - t0) / 1e3
        self.total_us += self.last_us
        self.calls += 1
        return out

    def relay(self, obj):
        """Rank 0's object on every rank (a request's rank list: only when one is asked for)."""
        if self.dist is None:
            return obj
        box = [obj]
        self.dist.broadcast_object_list(box, src=0)
        return box[0]

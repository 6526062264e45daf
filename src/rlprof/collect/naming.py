"""Run ids and window file names."""

from __future__ import annotations

import os
import secrets
import time

TRACE_SUFFIX = ".pt.trace.json.gz"
TIMELINE_SUFFIX = ".timeline.json.gz"
MEMORY_SUFFIX = ".memory_snapshot.pickle"
MANIFEST = "manifest.jsonl"


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def shared_run_id(explicit: str | None = None) -> str:
    """A run id every rank of one job agrees on, without a collective when the launcher gives one."""
    if explicit:
        return explicit
    for var in ("RLPROF_RUN_ID", "TORCHELASTIC_RUN_ID"):
        value = os.environ.get(var, "").strip()
        if value and value.lower() != "none":
            return value
    return _broadcast_run_id() or new_run_id()


def _broadcast_run_id() -> str | None:
    """Rank 0's id, when torch.distributed is already up (all ranks build their Profiler together)."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    box = [new_run_id() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def window_name(steps: tuple[int, ...], role: str, stage: str | None, rank: int, index: int | None = None) -> str:
    """step{S}_{role}_{stage|e2e}_rank{R}[_w{K}] (S is the first step of a continuous window)."""
    name = f"step{steps[0]}_{role}_{stage or 'e2e'}_rank{rank}"
    return name if index is None else f"{name}_w{index}"

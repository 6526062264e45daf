"""The one small interface every collection backend implements.

A backend instance serves one window: start() when it opens, step() on each schedule tick of the
window's unit, range() for stage / unit / mark ranges inside it, stop() when it closes. stop()
returns what was written, one Output per recorded schedule cycle.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import tempfile
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Callable

from ...analyze.inputs.salvage import RAW_CUT_SUFFIX, raw_prefix
from ...config.plan import RolePlan, Schedule


@dataclasses.dataclass
class Output:
    path: Path | None  # file or directory; None where the tool writes elsewhere (nsys)
    index: int | None  # schedule cycle (the _w{K} of the file name), None without a schedule
    start_ns: int
    end_ns: int
    status: str = "complete"
    bytes: int = 0
    error: str | None = None
    finalize_to: str | None = None  # raw Chrome-trace JSON: the final .json.gz name it becomes
    device_memory: dict | None = None  # the accelerator's capacity and allocator at the close (device_memory.py)
    host_stacks: dict | None = None  # the host's stacks written beside it: path, bytes, truncated (host_stacks.py)


@dataclasses.dataclass
class WindowSpec:
    """What a backend needs to know about the window it serves."""

    run_dir: Path
    steps: tuple[int, ...]
    role: str
    stage: str | None  # None for an end-to-end window
    rank: int
    world_size: int
    replica: int | None
    plan: RolePlan
    base_name: Callable[[int | None], str]  # schedule cycle index -> file stem

    @property
    def schedule(self) -> Schedule | None:
        return self.plan.schedule

    @property
    def multi_cycle(self) -> bool:
        return self.schedule is not None and self.schedule.repeat != 1


class Backend:
    tool = "base"

    def __init__(self, spec: WindowSpec):
        self.spec = spec

    def start(self) -> None:
        raise NotImplementedError

    def step(self) -> None:
        """One unit of the schedule's unit has elapsed."""

    def range(self, name: str) -> AbstractContextManager:
        raise NotImplementedError

    def stop(self) -> list[Output]:
        raise NotImplementedError


class CycleTracker:
    """rlprof's own schedule state machine, for backends that have none (nsys, torch_memory)."""

    def __init__(self, schedule: Schedule | None):
        self.schedule = schedule
        self.k = 0

    def phase(self) -> tuple[str, int]:
        if self.schedule is None:
            return "active", 0
        return self.schedule.phase(self.k)

    def advance(self) -> tuple[int | None, bool]:
        """Move to the next unit: (the active cycle that just ended or None, whether one begins)."""
        before, c0 = self.phase()
        self.k += 1
        after, c1 = self.phase()
        ended = c0 if before == "active" and (after != "active" or c1 != c0) else None
        began = after == "active" and (before != "active" or c1 != c0)
        return ended, began


class PushPopRange:
    """A context manager over a push(name) -> handle / pop(handle) marker API (NVTX, mstx)."""

    __slots__ = ("push", "pop", "name", "handle")

    def __init__(self, push, pop, name: str):
        self.push, self.pop, self.name, self.handle = push, pop, name, None

    def __enter__(self):
        self.handle = self.push(self.name)
        return self

    def __exit__(self, *exc):
        self.pop(self.handle)
        return False


def export_raw(run_dir: Path, window: str, export: Callable[[str], None]) -> Path:
    """A window's raw Chrome-trace export, `export(path)` writing it, as `.raw-{window}-{random}.json` in `run_dir`
    (analyze/inputs/salvage.py finds it by that name after a crash). A failed export leaves nothing: torch's exporter writes
    `{path}.tmp` and renames it, and on a full disk it says so only in its log and leaves the .tmp and an empty
    file, so a .tmp still there or an empty file is a failed export too."""
    fd, name = tempfile.mkstemp(prefix=raw_prefix(window), suffix=".json", dir=run_dir)
    os.close(fd)
    raw, cut = Path(name), Path(name[: -len(".json")] + RAW_CUT_SUFFIX)
    try:
        export(name)
        if cut.exists() or raw.stat().st_size == 0:
            free = shutil.disk_usage(run_dir).free
            raise OSError(
                errno.ENOSPC if free < (1 << 20) else errno.EIO,
                f"the trace export to {raw.name} did not complete ({free} bytes free on its disk)",
            )
    except BaseException:
        raw.unlink(missing_ok=True)
        cut.unlink(missing_ok=True)
        raise
    return raw

"""What both Ascend readers (text and db export) produce: one AscendTrace, its overlap lanes, its step rows, and
the plausibility rules every device time passes before it counts."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...tables.intervals import Coverage
from ...tables.table import KERNEL, EventTable

# As the Ascend tools name them; free is what a window leaves after the first and the third (OverlapBreakdown).
LANES = ("Computing", "Communication", "Communication(Not Overlapped)")
# No device task outlasts a day: HCCL's execution timeout (HCCL_EXEC_TIMEOUT) ends a stuck collective within
# hours, and a kernel of a day is no kernel. A longer duration is a damaged value (1e12 µs, 1e300).
MAX_TASK_US = 24 * 3600 * 1e6


@dataclass
class AscendTrace:
    path: Path
    table: EventTable
    overlap: dict[str, Coverage] = field(default_factory=dict)
    steps: list[dict] = field(default_factory=list)  # rows of step_trace_time.csv / analysis.db StepTraceTime
    warnings: list[str] = field(default_factory=list)
    partial: bool = False
    step_spans: list[tuple[int, float, float]] = field(default_factory=list)  # (step, start µs, end µs)
    rank: int | None = None
    export: str = "text"
    files: list[str] = field(default_factory=list)
    origin_us: float = 0.0  # the table's times are relative to this (epoch µs lose precision as float64)
    # First to last device task of any kind (the runtime's own too: the step's input copies, event waits), the
    # profiler's start/stop markers left out: the span msprof-analyze's db comparison takes for E2E.
    task_span: tuple[float, float] | None = None

    @property
    def has_device(self) -> bool:
        return True


def lanes_of(compute: Coverage, comm: Coverage) -> dict[str, Coverage]:
    """The Overlap Analysis lanes of a device timeline: computing, communication, and communication not
    overlapped by computing."""
    return {"Computing": compute, "Communication": comm, "Communication(Not Overlapped)": comm.minus(compute)}


def step_row(step, compute_us: float, comm_alone_us: float, overlap_us: float, free_us: float) -> dict:
    """One step of the Ascend tools' own step trace (µs in), as rlprof buckets (ms out)."""
    return {
        "step": int(step) if str(step).lstrip("-").isdigit() else step,
        "compute_ms": compute_us / 1e3,
        "comm_ms": comm_alone_us / 1e3,
        "overlap_ms": overlap_us / 1e3,
        "memcpy_ms": 0.0,
        "idle_ms": free_us / 1e3,
        "wall_ms": (compute_us + comm_alone_us + free_us) / 1e3,
    }


def whole_us(ts) -> int:
    return int(str(ts).strip().partition(".")[0] or 0)


def relative_us(ts, origin: int) -> float:
    """An epoch-µs timestamp relative to `origin`, exactly: the Ascend text export writes them as decimal
    strings ("1704161511422904.204") that float64 would round to a quarter µs. Raises ValueError on a value
    that is not a finite number."""
    whole, _, frac = str(ts).strip().partition(".")
    if not whole.lstrip("-").isdigit() or (frac and not frac.isdigit()):
        value = float(ts)  # "1.7e15", "NaN", "inf", "abc": a float or a ValueError
        if not math.isfinite(value):
            raise ValueError(f"not a finite time: {ts!r}")
        return value - origin
    return (int(whole) - origin) + (float("0." + frac) if frac else 0.0)


class Dropped:
    """Values that cannot be device times, counted by why, for one warning per file."""

    def __init__(self):
        self.counts: dict[str, int] = {}

    def add(self, why: str, n: int = 1) -> None:
        if n:
            self.counts[why] = self.counts.get(why, 0) + n

    def warning(self, path: Path, what: str = "rows") -> list[str]:
        if not self.counts:
            return []
        reasons = ", ".join(f"{n} {why}" for why, n in self.counts.items())
        return [f"{path}: {sum(self.counts.values())} {what} dropped ({reasons}); the others were read"]


def duration_us(raw) -> float:
    """A duration as written (number or decimal string). ValueError naming why it cannot be one: not a finite
    number, negative, or longer than MAX_TASK_US."""
    try:
        value = float(raw.strip()) if isinstance(raw, str) else float(raw)
    except (TypeError, ValueError):
        raise ValueError("that is not a number") from None
    if not math.isfinite(value):
        raise ValueError("that is not finite")
    if value < 0:
        raise ValueError("that is negative")
    if value > MAX_TASK_US:
        raise ValueError("longer than a day")
    return value


def launches_by_start(t: EventTable, task_start: np.ndarray, task_launch: np.ndarray) -> np.ndarray | None:
    """Each device event's host launch (NaN: not linked), from the linked tasks' start times: the same task in
    trace_view.json and kernel_details.csv starts at the same written time. Columnar: sorted + searchsorted."""
    if not len(task_start) or not len(t):
        return None
    order = np.argsort(task_start, kind="stable")
    starts, launch = task_start[order], task_launch[order]
    dev = np.flatnonzero(t.kind == KERNEL)
    pos = np.clip(np.searchsorted(starts, t.start[dev]), 0, len(starts) - 1)
    hit = np.abs(starts[pos] - t.start[dev]) < 1e-3
    out = np.full(len(t), np.nan)
    out[dev[hit]] = launch[pos[hit]]
    return out if hit.any() else None

"""Ascend (torch_npu) profiler output: ASCEND_PROFILER_OUTPUT/{trace_view.json, kernel_details.csv,
step_trace_time.csv}, in a `*_ascend_pt` directory or given directly.

trace_view.json is a bare array with string timestamps; its processes are named by metadata events:
"Ascend Hardware" (device tasks), "HCCL" (communication tasks), "CANN", "Python" (CPU ops) and
"Overlap Analysis", whose threads Computing / Communication / Communication(Not Overlapped) / Free are
the device-side buckets the Ascend tools compute themselves; rlprof uses them as they are.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np

from ..intervals import Coverage
from ..table import CPU_OP, KERNEL, OTHER, RUNTIME, ColumnBuilder, EventTable
from .kineto import Event, NotATrace, _num

OVERLAP_THREADS = ("Computing", "Communication", "Communication(Not Overlapped)", "Free")
PROCESS_KIND = {"Ascend Hardware": KERNEL, "HCCL": KERNEL, "CANN": RUNTIME, "Python": CPU_OP}


@dataclass
class AscendTrace:
    path: Path
    table: EventTable
    overlap: dict[str, Coverage] = field(default_factory=dict)
    steps: list[dict] = field(default_factory=list)  # rows of step_trace_time.csv
    warnings: list[str] = field(default_factory=list)
    partial: bool = False
    kernel_table: EventTable | None = None  # from kernel_details.csv where it sits beside trace_view.json

    @property
    def has_device(self) -> bool:
        return True


class OverlapBreakdown:
    """Buckets straight from the Overlap Analysis lanes."""

    def __init__(self, lanes: dict[str, Coverage]):
        self.lanes = lanes

    def window(self, lo: float, hi: float) -> dict[str, float]:
        get = lambda k: self.lanes[k].within(lo, hi) if k in self.lanes else 0.0  # noqa: E731
        compute, comm_all, comm_alone, free = (get(k) for k in OVERLAP_THREADS)
        return {"wall_ms": (hi - lo) / 1e3, "compute_ms": compute / 1e3, "comm_ms": comm_alone / 1e3,
                "overlap_ms": max(0.0, comm_all - comm_alone) / 1e3, "memcpy_ms": 0.0, "idle_ms": free / 1e3}


def find_ascend_files(path: Path) -> dict[str, Path]:
    """trace_view.json / kernel_details.csv / step_trace_time.csv under an Ascend output directory."""
    if path.is_file():
        path = path.parent
    found = {}
    for name in ("trace_view.json", "kernel_details.csv", "step_trace_time.csv"):
        hits = sorted(path.rglob(name))
        if hits:
            found[name] = hits[0]
    return found


def is_ascend(path: Path) -> bool:
    if path.is_file():
        return path.name in ("trace_view.json", "kernel_details.csv", "step_trace_time.csv")
    return path.name.endswith("_ascend_pt") or path.name == "ASCEND_PROFILER_OUTPUT" or bool(
        find_ascend_files(path)) and not any(path.glob("*.pt.trace.json*"))


def read_ascend(path: Path) -> AscendTrace:
    files = find_ascend_files(Path(path))
    if not files:
        raise NotATrace(f"{path}: no trace_view.json, kernel_details.csv or step_trace_time.csv found")
    cols = ColumnBuilder()
    lanes: dict[str, Coverage] = {}
    warnings: list[str] = []
    if "trace_view.json" in files:
        lanes = _trace_view(files["trace_view.json"], cols)
    elif "kernel_details.csv" in files:
        _kernel_details(files["kernel_details.csv"], cols)
    steps = _step_trace(files["step_trace_time.csv"]) if "step_trace_time.csv" in files else []
    kernels = None
    if "kernel_details.csv" in files and "trace_view.json" in files:
        kcols = ColumnBuilder()
        _kernel_details(files["kernel_details.csv"], kcols)
        kernels = kcols.build()
    table = cols.build()
    return AscendTrace(Path(path), table, lanes, steps, warnings, kernel_table=kernels)


def _trace_view(path: Path, cols: ColumnBuilder) -> dict[str, Coverage]:
    try:
        events = msgspec.json.decode(path.read_bytes(), type=list[Event])
    except msgspec.DecodeError as exc:
        raise NotATrace(f"{path}: not an Ascend trace_view.json ({exc})") from None
    process = {str(e.pid): e.decoded_args().name for e in events if e.ph == "M" and e.name == "process_name"}
    thread = {(str(e.pid), str(e.tid)): e.decoded_args().name for e in events
              if e.ph == "M" and e.name == "thread_name"}
    lanes: dict[str, list[tuple[float, float]]] = {k: [] for k in OVERLAP_THREADS}
    start, end, kind, name, tid = [], [], [], [], []
    for e in events:
        if e.ph != "X":
            continue
        pname = process.get(str(e.pid), "")
        t0 = _num(e.ts)
        t1 = t0 + _num(e.dur)
        if pname == "Overlap Analysis":
            lane = thread.get((str(e.pid), str(e.tid)), e.name)
            if lane in lanes:
                lanes[lane].append((t0, t1))
            continue
        start.append(t0)
        end.append(t1)
        kind.append(PROCESS_KIND.get(pname, CPU_OP if e.cat == "cpu_op" else OTHER))
        name.append(cols.names(e.name))
        tid.append(cols.threads(f"{e.pid}/{e.tid}"))
    cols.add(start, end, kind, name, tid)
    return {k: Coverage(np.array([a for a, _ in v]), np.array([b for _, b in v])) for k, v in lanes.items() if v}


def _kernel_details(path: Path, cols: ColumnBuilder) -> None:
    start, end, kind, name, tid = [], [], [], [], []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            try:
                t0 = float(row["Start Time(us)"])
                dur = float(row["Duration(us)"])
            except (KeyError, ValueError):
                continue
            label = row.get("Type") or row.get("Name") or "?"
            if row.get("Accelerator Core") == "HCCL" and not label.startswith("hcom_"):
                label = "hcom_" + label
            start.append(t0)
            end.append(t0 + dur)
            kind.append(KERNEL)
            name.append(cols.names(label))
            tid.append(cols.threads(f"stream/{row.get('Stream ID', '?')}"))
    cols.add(start, end, kind, name, tid)


def _step_trace(path: Path) -> list[dict]:
    """step_trace_time.csv: one row per step, times in µs."""
    rows = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            def us(key):
                try:
                    return float(row.get(key, "") or 0)
                except ValueError:
                    return 0.0

            step = row.get("Step") or row.get("Step ID")
            compute, comm_alone, overlap = us("Computing"), us("Communication(Not Overlapped)"), us("Overlapped")
            free = us("Free")
            rows.append({"step": int(step) if str(step).isdigit() else step, "compute_ms": compute / 1e3,
                         "comm_ms": comm_alone / 1e3, "overlap_ms": overlap / 1e3, "memcpy_ms": 0.0,
                         "idle_ms": free / 1e3, "wall_ms": (compute + comm_alone + free) / 1e3})
    return rows

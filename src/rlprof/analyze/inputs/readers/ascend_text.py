"""torch_npu's text export: ASCEND_PROFILER_OUTPUT/{trace_view.json, kernel_details.csv, step_trace_time.csv}.

trace_view.json is a bare array with decimal-string timestamps; its processes are named by metadata events:
"Ascend Hardware" (every device task, one thread per stream), "HCCL" (threads "Group N Communication": the
collectives; "Plane N": their tasks), "Python" (host ops), CANN's API events, and "Overlap Analysis" (the
exporter's own drawing of the step-trace lanes, skipped: rlprof computes them from the tasks).
kernel_details.csv is CANN's op summary: one row per operator task (the db's COMPUTE_TASK_INFO) and per HCCL
collective (COMMUNICATION_OP), with its op type and step.

The lanes follow torch_npu's step trace: computing is the union of the operator tasks (kernel_details' rows,
else the device tasks whose task type is an operator's), communication the union of the collectives; the
communication streams' own tasks (Notify Wait, SDMA, Write Value) and the runtime's (EVENT_WAIT, MEMCPY_ASYNC)
are neither. So the text and db exports of one run give the same rows.
"""

from __future__ import annotations

import csv
from pathlib import Path

import msgspec
import numpy as np

from ....frameworks import mindspeed
from ...tables.intervals import Coverage
from ...tables.table import CPU_OP, KERNEL, KIND_OF_CATEGORY, OTHER, RUNTIME, USER_ANNOTATION, ColumnBuilder
from .ascend_trace import (
    AscendTrace,
    Dropped,
    duration_us,
    lanes_of,
    launches_by_start,
    relative_us,
    step_row,
    whole_us,
)
from .kineto import Event, NotATrace, salvage_events

PROFILER_STEP = "ProfilerStep#"
# torch_npu's task queue (enqueue/dequeue of each op onto the device thread) is neither an op nor Python.
_HOST_KIND = dict(KIND_OF_CATEGORY, enqueue=OTHER, dequeue=OTHER)


class _Lanes:
    """Operator and collective intervals as they are read, for the overlap lanes."""

    def __init__(self):
        self.compute: tuple[list[float], list[float]] = ([], [])
        self.comm: tuple[list[float], list[float]] = ([], [])
        self.tasks: tuple[list[float], list[float]] = ([], [])  # every device task but the profiler's markers

    def task_span(self) -> tuple[float, float] | None:
        starts, ends = (self.tasks[0] + self.compute[0] + self.comm[0], self.tasks[1] + self.compute[1] + self.comm[1])
        return (min(starts), max(ends)) if starts else None

    def coverage(self, which: str) -> Coverage:
        starts, ends = getattr(self, which)
        return Coverage(np.asarray(starts, np.float64), np.asarray(ends, np.float64))


def read_text(path: Path, files: dict[str, Path]) -> AscendTrace:
    cols, lanes, warnings = ColumnBuilder(), _Lanes(), []
    view, details = files.get("trace_view.json"), files.get("kernel_details.csv")
    events, partial = _load_view(view, warnings) if view else ([], False)
    origin = next((whole_us(e.ts) for e in events if e.ph == "X" and _is_time(e.ts)), None)
    ops = _OpSummary(details, origin, warnings) if details else None
    if ops is not None:
        partial |= ops.partial
        origin = ops.origin if origin is None else origin
    if ops is not None and events and not ops.same_run(events, origin):
        warnings.append(
            f"{details}: its operators run outside trace_view.json's time span (another run?); "
            "the device tasks of trace_view.json are used"
        )
        ops = None
    spans, has_comm, lost, linked = _add_view(
        events, origin or 0, cols, lanes, warnings, view, operators_from_view=ops is None
    )
    partial |= lost
    if ops is not None:
        ops.add(cols, lanes, with_collectives=not has_comm)
        if not events:
            spans = ops.step_extents()
    steps = _step_trace(files["step_trace_time.csv"], warnings) if "step_trace_time.csv" in files else []
    used = [str(p) for k, p in files.items() if k in mindspeed.TEXT_FILES]
    table = cols.build()
    table.launch = launches_by_start(table, *linked)
    return AscendTrace(
        Path(path),
        table,
        lanes_of(lanes.coverage("compute"), lanes.coverage("comm")),
        steps,
        warnings,
        partial,
        step_spans=spans,
        export="text",
        files=used,
        origin_us=float(origin or 0),
        task_span=lanes.task_span(),
    )


def _is_time(ts) -> bool:
    try:
        relative_us(ts, 0)
        return True
    except (ValueError, TypeError):
        return False


# ---- trace_view.json ------------------------------------------------------------------------------
def _load_view(path: Path, warnings: list[str]) -> tuple[list[Event], bool]:
    data = path.read_bytes()
    try:
        return msgspec.json.decode(data, type=list[Event]), False
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:  # odd values, a cut, damage
        got = salvage_events(data, data.find(b"[")) if data.lstrip().startswith(b"[") else None
        if got is None or not got.events:
            raise NotATrace(f"{path}: not an Ascend trace_view.json ({exc})") from None
        if got.dropped:
            warnings.append(
                f"{path}: {sum(got.dropped.values())} events dropped ("
                + ", ".join(f"{n} with {why}" for why, n in got.dropped.items())
                + "); the others were read"
            )
        warnings.extend(got.warnings(path, exc))
        return got.events, not got.whole


class _TaskArgs(msgspec.Struct):
    task_type: str = msgspec.field(default="", name="Task Type")


_decode_task = msgspec.json.Decoder(_TaskArgs).decode


def _task_type(e: Event) -> str:
    try:
        return _decode_task(e.args).task_type if len(e.args) else ""
    except msgspec.DecodeError:
        return ""


def _add_view(
    events: list[Event],
    origin: int,
    cols: ColumnBuilder,
    lanes: _Lanes,
    warnings: list[str],
    path: Path | None,
    operators_from_view: bool,
) -> tuple[list[tuple[int, float, float]], bool, bool]:
    """trace_view's complete events into the table; its operator tasks (when kernel_details.csv does not give
    them) and its collectives into the lanes. Returns the ProfilerStep spans, whether it had collectives,
    whether events were dropped for values that are no time, and (task start, host launch) of the device tasks
    the launch flows link (mindspeed.LAUNCH_FLOWS: a flow ends at its task's start)."""
    process, thread = {}, {}
    for e in events:
        if e.ph == "M" and e.name in ("process_name", "thread_name"):
            (process if e.name == "process_name" else thread)[
                (str(e.pid),) if e.name == "process_name" else (str(e.pid), str(e.tid))
            ] = e.decoded_args().name
    spans: list[tuple[int, float, float]] = []
    start, end, kind, name, tid = [], [], [], [], []
    dropped, has_comm = Dropped(), False
    flow_from: dict[tuple, float] = {}
    flow_to: list[tuple] = []
    for e in events:
        if e.ph in ("s", "f") and e.cat in mindspeed.LAUNCH_FLOWS:
            try:
                at = relative_us(e.ts, origin)
            except (ValueError, TypeError):
                continue
            if e.ph == "s":
                flow_from[(e.cat, str(e.id))] = at
            else:
                flow_to.append((mindspeed.LAUNCH_FLOWS.index(e.cat), at, (e.cat, str(e.id))))
            continue
        if e.ph != "X":
            continue
        pname = process.get((str(e.pid),), "")
        if pname == mindspeed.OVERLAP_PROCESS:
            continue
        try:
            t0 = relative_us(e.ts, origin)
        except (ValueError, TypeError):
            dropped.add("with a ts that is not a time")
            continue
        if t0 + origin <= 0:  # epoch µs: a time at or before 1970 is a damaged value
            dropped.add("with a ts at or before 1970")
            continue
        try:
            t1 = t0 + duration_us(e.dur)
        except ValueError as exc:
            dropped.add(f"with a dur {exc}")
            continue
        label = e.name
        if pname == mindspeed.DEVICE_PROCESS:
            if e.name not in mindspeed.PROFILER_MARKER_TASKS:
                lanes.tasks[0].append(t0)
                lanes.tasks[1].append(t1)
            operator = mindspeed.is_operator_task(_task_type(e), e.name)
            what = KERNEL if operator and operators_from_view else OTHER
            if operator and operators_from_view:
                lanes.compute[0].append(t0)
                lanes.compute[1].append(t1)
            elif operator:  # kernel_details.csv gives these, with their op type
                continue
        elif pname == mindspeed.HCCL_PROCESS:
            collective = bool(mindspeed.COMMUNICATION_THREAD.search(thread.get((str(e.pid), str(e.tid)), "")))
            what = KERNEL if collective else OTHER  # a plane's tasks belong to their collective
            if collective:
                has_comm = True
                label = mindspeed.collective_type(label)
                label = label if label.startswith("hcom_") else "hcom_" + label
                lanes.comm[0].append(t0)
                lanes.comm[1].append(t1)
        elif mindspeed.stage_of_range(e.name) is not None:  # mstx ranges: MindSpeed-RL's stage functions
            what = USER_ANNOTATION
        elif mindspeed.CANN_API.match(e.name) or pname == "CANN":
            what = RUNTIME
        else:
            what = _HOST_KIND.get(e.cat, CPU_OP if pname == mindspeed.HOST_PROCESS else OTHER)
            if e.name.startswith(PROFILER_STEP) and e.name[len(PROFILER_STEP) :].isdigit():
                spans.append((int(e.name[len(PROFILER_STEP) :]), t0, t1))
        start.append(t0)
        end.append(t1)
        kind.append(what)
        name.append(cols.names(label))
        tid.append(cols.threads(f"{e.pid}/{e.tid}"))
    cols.add(start, end, kind, name, tid)
    warnings.extend(dropped.warning(path, "events") if path else [])
    linked: dict[float, float] = {}
    for _, at, key in sorted(flow_to, reverse=True):  # the preferred flow last: it wins
        if key in flow_from:
            linked[at] = flow_from[key]
    return (
        sorted(spans, key=lambda s: s[1]),
        has_comm,
        bool(dropped.counts),
        (np.fromiter(linked, np.float64, len(linked)), np.fromiter(linked.values(), np.float64, len(linked))),
    )


# ---- kernel_details.csv ---------------------------------------------------------------------------
class _OpSummary:
    """kernel_details.csv: operator tasks and HCCL collectives, each with its step and op type."""

    def __init__(self, path: Path, origin: int | None, warnings: list[str]):
        self.path, self.partial = path, False
        with open(path, newline="", encoding="utf-8", errors="replace") as f:
            text = f.read()
        rows = list(csv.reader(text.splitlines()))
        header = rows[0] if rows else []
        col = {h.strip(): i for i, h in enumerate(header)}
        missing = [c for c in ("Start Time(us)", "Duration(us)") if c not in col]
        if missing:
            raise NotATrace(
                f"{path}: no {' or '.join(missing)} column; kernel_details.csv has Step Id, Name, "
                "Type, Accelerator Core, Start Time(us), Duration(us)"
            )
        body = rows[1:]
        if body and not text.endswith(("\n", "\r")):  # torch_npu's csv writer ends every row: this one was cut
            if len(body[-1]) < len(header):
                body.pop()
            self.partial = True
            warnings.append(
                f"{path}: cut in its last row (the file ends mid-row); the {len(body)} rows up to the cut were read"
            )
        get = lambda row, key: row[col[key]].strip() if key in col and col[key] < len(row) else ""  # noqa: E731
        first = next((r for r in body if _is_time(get(r, "Start Time(us)"))), None)
        self.origin = whole_us(get(first, "Start Time(us)")) if first else 0
        origin = self.origin if origin is None else origin
        self.start, self.end, self.name, self.stream, self.step, self.hccl = [], [], [], [], [], []
        dropped = Dropped()
        for row in body:
            if len(row) < len(header):
                dropped.add("short rows")
                continue
            try:
                t0 = relative_us(get(row, "Start Time(us)"), origin)
            except (ValueError, TypeError):
                dropped.add("with a Start Time that is not a time")
                continue
            if t0 + origin <= 0:
                dropped.add("with a Start Time at or before 1970")
                continue
            try:
                dur = duration_us(get(row, "Duration(us)"))
            except ValueError as exc:
                dropped.add(f"with a Duration {exc}")
                continue
            label, core = _op_label(get(row, "Type"), get(row, "Name")), get(row, "Accelerator Core")
            hccl = core == mindspeed.HCCL_CORE or label.startswith("hcom_")
            if hccl:
                label = mindspeed.collective_type(label if label.startswith("hcom_") else "hcom_" + label)
            step = get(row, "Step Id")
            self.start.append(t0)
            self.end.append(t0 + dur)
            self.name.append(label)
            self.stream.append(get(row, "Stream ID") or "?")
            self.step.append(int(step) if step.isdigit() else None)
            self.hccl.append(hccl)
        warnings.extend(dropped.warning(path))
        self.partial |= bool(dropped.counts)  # a lower bound of the whole: those rows' time is not counted

    def same_run(self, events: list[Event], origin: int) -> bool:
        """Whether these operators run inside trace_view's span (a real export's two files always do)."""
        if not self.start:
            return True
        times = []
        for e in events:
            if e.ph == "X":
                try:
                    times.append(relative_us(e.ts, origin))
                except (ValueError, TypeError):
                    continue
        return bool(times) and min(times) - 1e6 <= min(self.start) and max(self.start) <= max(times) + 1e6

    def add(self, cols: ColumnBuilder, lanes: _Lanes, with_collectives: bool) -> None:
        keep = [i for i, h in enumerate(self.hccl) if with_collectives or not h]
        for i in keep:
            lane = lanes.comm if self.hccl[i] else lanes.compute
            lane[0].append(self.start[i])
            lane[1].append(self.end[i])
        cols.add(
            [self.start[i] for i in keep],
            [self.end[i] for i in keep],
            [KERNEL] * len(keep),
            [cols.names(self.name[i]) for i in keep],
            [cols.threads("hccl" if self.hccl[i] else f"stream/{self.stream[i]}") for i in keep],
        )

    def step_extents(self) -> list[tuple[int, float, float]]:
        """Each Step Id's device extent (the csv has no host step times)."""
        extent: dict[int, tuple[float, float]] = {}
        for step, t0, t1 in zip(self.step, self.start, self.end):
            if step is not None:
                lo, hi = extent.get(step, (t0, t1))
                extent[step] = (min(lo, t0), max(hi, t1))
        return [(step, lo, hi) for step, (lo, hi) in sorted(extent.items())]


def _op_label(op_type: str, name: str) -> str:
    """An operator's type, or its task name where the profiler level records no type (level0: "N/A")."""
    for label in (op_type, name):
        if label and label != mindspeed.NOT_RECORDED:
            return label
    return "?"


# ---- step_trace_time.csv --------------------------------------------------------------------------
def _step_trace(path: Path, warnings: list[str]) -> list[dict]:
    """step_trace_time.csv: torch_npu's own step trace, one row per step (and device), times in µs."""
    rows, dropped = [], Dropped()
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        for row in csv.DictReader(f):
            try:
                times = [
                    duration_us(row.get(key) or 0)
                    for key in ("Computing", "Communication(Not Overlapped)", "Overlapped", "Free")
                ]
            except ValueError as exc:
                dropped.add(f"with a time {exc}")
                continue
            rows.append(step_row(row.get("Step") or row.get("Step ID"), *times))
    warnings.extend(dropped.warning(path))
    return rows

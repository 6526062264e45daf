"""Ascend (torch_npu) profiler output, text or db export, in a `*_ascend_pt` directory or given directly.

Text: ASCEND_PROFILER_OUTPUT/{trace_view.json, kernel_details.csv, step_trace_time.csv}. trace_view.json is
a bare array with decimal-string timestamps; its processes are named by metadata events: "Ascend Hardware"
(device tasks), "HCCL" (communication tasks), "CANN", "Python" (CPU ops) and "Overlap Analysis" (the
exporter's own drawing of the buckets, skipped: rlprof computes them from the tasks).
Db: ascend_pytorch_profiler[_{rank}].db (+ analysis.db) or msprof_*.db, read by readers/ascend_db.py.
Both exports become one AscendTrace whose lanes (computing, communication, communication not overlapped,
free) are computed from the device tasks the way torch_npu's step trace and msprof-analyze compute them,
so the two exports of one run give the same rows.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np

from ...frameworks import mindspeed
from ..classify import buckets
from ..intervals import Coverage
from ..table import CPU_OP, KERNEL, OTHER, RUNTIME, USER_ANNOTATION, ColumnBuilder, EventTable
from .kineto import Event, NotATrace, _num, salvage_events

# As the Ascend tools name them; free is what a window leaves after the first and the third (OverlapBreakdown).
LANES = ("Computing", "Communication", "Communication(Not Overlapped)")
PROCESS_KIND = {"Ascend Hardware": KERNEL, "HCCL": KERNEL, "CANN": RUNTIME, "Python": CPU_OP}
PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")


@dataclass
class AscendTrace:
    path: Path
    table: EventTable
    overlap: dict[str, Coverage] = field(default_factory=dict)
    steps: list[dict] = field(default_factory=list)  # rows of step_trace_time.csv / analysis.db StepTraceTime
    warnings: list[str] = field(default_factory=list)
    partial: bool = False
    kernel_table: EventTable | None = None  # from kernel_details.csv where it sits beside trace_view.json
    step_spans: list[tuple[int, float, float]] = field(default_factory=list)  # (step, start µs, end µs)
    rank: int | None = None
    export: str = "text"
    files: list[str] = field(default_factory=list)
    origin_us: float = 0.0  # the table's times are relative to this (epoch µs lose precision as float64)

    @property
    def has_device(self) -> bool:
        return True


class OverlapBreakdown:
    """Buckets from the overlap lanes. Free is what the span leaves after computing and exposed communication
    (the Ascend tools' own definition), so the buckets add up to wall."""

    def __init__(self, lanes: dict[str, Coverage]):
        self.lanes = lanes

    def window(self, lo: float, hi: float) -> dict[str, float]:
        get = lambda k: self.lanes[k].within(lo, hi) if k in self.lanes else 0.0  # noqa: E731
        compute, comm_all, comm_alone = (get(k) for k in LANES)
        return {"wall_ms": (hi - lo) / 1e3, "compute_ms": compute / 1e3, "comm_ms": comm_alone / 1e3,
                "overlap_ms": max(0.0, comm_all - comm_alone) / 1e3, "memcpy_ms": 0.0,
                "idle_ms": max(0.0, hi - lo - compute - comm_alone) / 1e3}

    def extent(self, step, lo: float, hi: float) -> tuple[object, float, float]:
        """A step's span narrowed to its device activity (first to last computing or communication)."""
        starts, ends = [], []
        for c in (self.lanes.get(k) for k in LANES[:2]):
            if c is None:
                continue
            i, j = np.searchsorted(c.e, lo, side="right"), np.searchsorted(c.s, hi, side="left")
            if i < j:  # runs overlapping [lo, hi]
                starts.append(float(c.s[i]))
                ends.append(float(c.e[j - 1]))
        if not starts:
            return step, lo, lo
        return step, max(lo, min(starts)), min(hi, max(ends))

    @property
    def span(self) -> tuple[float, float] | None:
        lanes = [c for c in self.lanes.values() if len(c.s)]
        if not lanes:
            return None
        return min(float(c.s[0]) for c in lanes), max(float(c.e[-1]) for c in lanes)


def lanes_of(compute: Coverage, comm: Coverage) -> dict[str, Coverage]:
    """The Overlap Analysis lanes of a device timeline: computing, communication, and communication not
    overlapped by computing."""
    return {"Computing": compute, "Communication": comm, "Communication(Not Overlapped)": comm.minus(compute)}


# ---- where the files are --------------------------------------------------------------------------
def find_ascend_files(path: Path) -> dict[str, Path]:
    """trace_view.json / kernel_details.csv / step_trace_time.csv and the db files under an Ascend output
    directory (keys: the text names, "db" for the profiler db, "analysis.db")."""
    if path.is_file():
        path = path.parent
    found = {}
    for name in mindspeed.TEXT_FILES + (mindspeed.ANALYSIS_DB,):
        hits = sorted(path.rglob(name))
        if hits:
            found[name] = hits[0]
    dbs = sorted(p for p in path.rglob("*.db") if mindspeed.PYTORCH_DB.match(p.name)) or \
        sorted(p for p in path.rglob("*.db") if mindspeed.MSPROF_DB.match(p.name))
    if dbs:
        found["db"] = dbs[0]
    return found


def is_ascend_file(name: str) -> bool:
    return name in mindspeed.TEXT_FILES or bool(mindspeed.PYTORCH_DB.match(name) or mindspeed.MSPROF_DB.match(name))


def is_ascend(path: Path) -> bool:
    if path.is_file():
        return is_ascend_file(path.name)
    return path.name.endswith(mindspeed.ASCEND_DIR_SUFFIX) or path.name == mindspeed.OUTPUT_DIR or bool(
        find_ascend_files(path)) and not any(path.glob("*.pt.trace.json*"))


def is_unparsed(path: Path) -> bool:
    """A torch_npu collection not parsed yet (profile_analysis: false): raw PROF_* / FRAMEWORK data only."""
    if not path.is_dir() or find_ascend_files(path):
        return False
    return any(p.is_dir() and (p.name in mindspeed.RAW_DIRS or p.name.startswith(mindspeed.RAW_DIR_PREFIX))
               for p in path.iterdir())


def rank_of(path: Path, files: dict[str, Path]) -> int | None:
    """torch_npu's rank: in the db name (ascend_pytorch_profiler_{rank}.db) or profiler_info_{rank}.json."""
    db = files.get("db")
    m = mindspeed.PYTORCH_DB.match(db.name) if db is not None else None
    if m and m.group("rank") is not None:
        return int(m.group("rank"))
    root = path if path.is_dir() else path.parent
    for base in (root, *root.parents[:2]):
        for info in sorted(base.glob("profiler_info*.json")):
            m = mindspeed.PROFILER_INFO.match(info.name)
            if m and m.group("rank") is not None:
                return int(m.group("rank"))
            try:
                rank = json.loads(info.read_text()).get("rank_id")
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(rank, int) and rank >= 0:
                return rank
    return None


def read_ascend(path: Path, export: str | None = None) -> AscendTrace:
    """One Ascend output directory (or file). Both exports present: the db, unless export="text"."""
    path = Path(path)
    if is_unparsed(path):
        raise NotATrace(f"{path} is a torch_npu collection that was not parsed (profile_analysis: false); parse "
                        f"it with: {mindspeed.offline_parse_command(str(path))}")
    files = find_ascend_files(path)
    if path.is_file():  # one named file: that export only
        files = {k: v for k, v in files.items() if v == path or (k == "analysis.db" and path.suffix == ".db")}
    has_text = any(k in files for k in mindspeed.TEXT_FILES)
    if "db" in files and (export == "db" or not (has_text and export == "text")):
        from .ascend_db import read_ascend_db

        trace = read_ascend_db(files["db"], files.get("analysis.db"))
    elif has_text and export != "db":
        trace = _read_text(path, files)
    else:
        raise NotATrace(f"{path}: no Ascend output found; allowed: trace_view.json, kernel_details.csv, "
                        "step_trace_time.csv, ascend_pytorch_profiler*.db or msprof_*.db")
    trace.rank = rank_of(path, files)
    return trace


def _read_text(path: Path, files: dict[str, Path]) -> AscendTrace:
    cols = ColumnBuilder()
    spans: list[tuple[int, float, float]] = []
    origin, partial, warnings = 0, False, []
    if "trace_view.json" in files:
        spans, origin, partial = _trace_view(files["trace_view.json"], cols, warnings)
    elif "kernel_details.csv" in files:
        spans, origin = _kernel_details(files["kernel_details.csv"], cols)
    steps = _step_trace(files["step_trace_time.csv"]) if "step_trace_time.csv" in files else []
    kernels = None
    if "kernel_details.csv" in files and "trace_view.json" in files:
        kcols = ColumnBuilder()
        _kernel_details(files["kernel_details.csv"], kcols)
        kernels = kcols.build()
    table = cols.build()
    flags = buckets(table, True)
    lanes = lanes_of(*(Coverage(table.start[flags[k]], table.end[flags[k]]) for k in ("compute", "comm")))
    used = [str(p) for k, p in files.items() if k in mindspeed.TEXT_FILES]
    return AscendTrace(Path(path), table, lanes, steps, warnings, partial, kernel_table=kernels, step_spans=spans,
                       export="text", files=used, origin_us=float(origin))


def _trace_view(path: Path, cols: ColumnBuilder, warnings: list[str]
                ) -> tuple[list[tuple[int, float, float]], int, bool]:
    data = path.read_bytes()
    partial = False
    try:
        events = msgspec.json.decode(data, type=list[Event])
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # cut or damaged: the events before it
        events, offset = salvage_events(data, data.find(b"[")) if data.lstrip().startswith(b"[") else ([], 0)
        if not events:
            raise NotATrace(f"{path}: not an Ascend trace_view.json ({exc})") from None
        partial = True
        warnings.append(f"{path}: damaged event near byte {offset} ({exc}); the {len(events)} events before it "
                        "were kept")
    process = {str(e.pid): e.decoded_args().name for e in events if e.ph == "M" and e.name == "process_name"}
    spans: list[tuple[int, float, float]] = []
    start, end, kind, name, tid = [], [], [], [], []
    origin = next((whole_us(e.ts) for e in events if e.ph == "X"), 0)
    for e in events:
        if e.ph != "X":
            continue
        pname = process.get(str(e.pid), "")
        if pname == "Overlap Analysis":
            continue
        t0 = relative_us(e.ts, origin)
        t1 = t0 + _num(e.dur)
        step = PROFILER_STEP.match(e.name)
        if step:
            spans.append((int(step.group(1)), t0, t1))
        start.append(t0)
        end.append(t1)
        # mstx ranges (MindSpeed-RL's stage functions) are annotations wherever the exporter put them
        marked = pname not in ("Ascend Hardware", "HCCL") and mindspeed.stage_of_range(e.name) is not None
        kind.append(USER_ANNOTATION if marked else PROCESS_KIND.get(pname, CPU_OP if e.cat == "cpu_op" else OTHER))
        name.append(cols.names(e.name))
        tid.append(cols.threads(f"{e.pid}/{e.tid}"))
    cols.add(start, end, kind, name, tid)
    return sorted(spans, key=lambda s: s[1]), origin, partial


def whole_us(ts) -> int:
    return int(str(ts).strip().partition(".")[0] or 0)


def relative_us(ts, origin: int) -> float:
    """An epoch-µs timestamp relative to `origin`, exactly: the Ascend text export writes them as decimal
    strings ("1704161511422904.204") that float64 would round to a quarter µs."""
    whole, _, frac = str(ts).strip().partition(".")
    return (int(whole) - origin) + (float("0." + frac) if frac else 0.0)


def _kernel_details(path: Path, cols: ColumnBuilder) -> tuple[list[tuple[int, float, float]], int]:
    """Device tasks; returns each Step Id's device extent (the csv has no host step times) and the origin."""
    start, end, kind, name, tid = [], [], [], [], []
    extent: dict[int, tuple[float, float]] = {}
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    origin = next((whole_us(r.get("Start Time(us)")) for r in rows if r.get("Start Time(us)")), 0)
    for row in rows:
        try:
            t0 = relative_us(row["Start Time(us)"], origin)
            dur = float(row["Duration(us)"])
        except (KeyError, ValueError, TypeError):  # a cut last row has missing fields
            continue
        label = row.get("Type") or row.get("Name") or "?"
        if row.get("Accelerator Core") == "HCCL" and not label.startswith("hcom_"):
            label = "hcom_" + label
        start.append(t0)
        end.append(t0 + dur)
        kind.append(KERNEL)
        name.append(cols.names(label))
        tid.append(cols.threads(f"stream/{row.get('Stream ID', '?')}"))
        step = row.get("Step Id", "")
        if step.isdigit():
            lo, hi = extent.get(int(step), (t0, t0 + dur))
            extent[int(step)] = (min(lo, t0), max(hi, t0 + dur))
    cols.add(start, end, kind, name, tid)
    return [(step, lo, hi) for step, (lo, hi) in sorted(extent.items())], origin


def step_row(step, compute_us: float, comm_alone_us: float, overlap_us: float, free_us: float) -> dict:
    """One step of the Ascend tools' own step trace (µs in), as rlprof buckets (ms out)."""
    return {"step": int(step) if str(step).lstrip("-").isdigit() else step, "compute_ms": compute_us / 1e3,
            "comm_ms": comm_alone_us / 1e3, "overlap_ms": overlap_us / 1e3, "memcpy_ms": 0.0,
            "idle_ms": free_us / 1e3, "wall_ms": (compute_us + comm_alone_us + free_us) / 1e3}


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
            rows.append(step_row(step, us("Computing"), us("Communication(Not Overlapped)"), us("Overlapped"),
                                 us("Free")))
    return rows

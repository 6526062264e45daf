"""Where the time went, per window: wall, compute, comm, overlap, memcpy, idle.

compute = covered by compute; comm = communication not overlapped with compute; overlap = both;
memcpy = copies/sets overlapped by neither; idle = the rest of the span. They add up to wall.

Over 400 lines because it is one job, the buckets: by time for a window and by launch for the device work a
row launched, over the same interval arithmetic.
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from functools import cache

import numpy as np

from ...vocab import STAGE_ROLE
from ..tables.classify import COLLECTIVE, RLPROF_RANGE, buckets, name_flags
from ..tables.intervals import Coverage, covered
from ..inputs.readers.ascend_trace import LANES
from ..tables.table import DEVICE_KINDS, KERNEL, USER_ANNOTATION, EventTable

BUCKETS = ("wall_ms", "compute_ms", "comm_ms", "overlap_ms", "memcpy_ms", "idle_ms")


def order_key(v):
    """Sort key for steps and ranks that may be None, numbers or (from odd inputs) strings."""
    if v is None:
        return (1, 0, 0)
    return (0, 0, v) if isinstance(v, (int, float)) else (0, 1, str(v))


class Breakdown:
    def __init__(self, table: EventTable, device: bool):
        m = buckets(table, device)
        s, e = table.start, table.end
        c, k, y = m["compute"], m["comm"], m["memcpy"]
        self.comm = Coverage(s[k], e[k])
        self.compute = Coverage(s[c], e[c]) if device else _host_compute(table, c, k)
        both = np.concatenate([self.compute.s, self.comm.s]), np.concatenate([self.compute.e, self.comm.e])
        self.compute_or_comm = Coverage(*both)
        self.busy = Coverage(np.concatenate([both[0], s[y]]), np.concatenate([both[1], e[y]]))

    def window(self, lo: float, hi: float) -> dict[str, float]:
        c, m = self.compute.within(lo, hi), self.comm.within(lo, hi)
        cm, busy = self.compute_or_comm.within(lo, hi), self.busy.within(lo, hi)
        span = hi - lo
        return {
            "wall_ms": span / 1e3,
            "compute_ms": c / 1e3,
            "comm_ms": (cm - c) / 1e3,
            "overlap_ms": (c + m - cm) / 1e3,
            "memcpy_ms": (busy - cm) / 1e3,
            "idle_ms": (span - busy) / 1e3,
        }


class LaunchedWork:
    """Device work by the host range that launched it (the host runs ahead of the device, so a range's kernels
    may run long after it closes). Each device event is placed at its launch on the host where the trace
    links it (Kineto's correlation or ac2g flow, torch_npu's host-to-device flows), else at its own start; a row
    holds the events placed inside its host range, and its buckets are measured over its device window (first
    start to last end of those events) from those events alone. Columnar: events sorted by placement once, a
    row's events one searchsorted slice."""

    def __init__(self, table: EventTable):
        idx = np.flatnonzero(table.mask(*DEVICE_KINDS))  # the device events alone: no full-length temporaries
        if len(table) < 2**31:
            idx = idx.astype(np.int32)
        when = table.placed_at(idx)
        order = np.argsort(when, kind="stable")
        idx = idx[order]
        self.when = when[order]
        del when, order
        self.s, self.e = table.start[idx], table.end[idx]
        self.linked = ~np.isnan(table.launch[idx]) if table.launch is not None else np.zeros(len(idx), bool)
        # as classify.buckets on a device trace: kernels compute unless collectives, copies and sets memcpy
        collective = name_flags(table.names, COLLECTIVE)[table.name[idx]] if len(idx) else np.zeros(0, bool)
        self.cls = np.where(table.kind[idx] == KERNEL, np.where(collective, 1, 0), 2).astype(np.int8)

    def window(self, lo: float, hi: float) -> dict:
        """The row of host range [lo, hi]: its buckets over its device window (they add up to that window's
        length, `wall_ms`, from `start_us`), its host window, and how its work was placed."""
        a, b = np.searchsorted(self.when, lo, "left"), np.searchsorted(self.when, hi, "right")
        host = {"host_start_us": lo, "host_wall_ms": (hi - lo) / 1e3}
        if a == b:  # launched nothing: its host window, the device idle for it
            return {
                "start_us": lo,
                "wall_ms": (hi - lo) / 1e3,
                "compute_ms": 0.0,
                "comm_ms": 0.0,
                "overlap_ms": 0.0,
                "memcpy_ms": 0.0,
                "idle_ms": (hi - lo) / 1e3,
                **host,
                "device_start_us": None,
                "attribution": "launch",
                "unlinked_events": 0,
            }
        s, e, c = self.s[a:b], self.e[a:b], self.cls[a:b]
        order = np.argsort(s, kind="stable")  # once: each class's events stay in this order (as its own sort)
        s, e, c = s[order], e[order], c[order]
        dlo, dhi = float(s[0]), float(e.max())
        compute, comm = covered(s[c == 0], e[c == 0]), covered(s[c == 1], e[c == 1])
        either, busy = covered(s[c < 2], e[c < 2]), covered(s, e)
        unlinked = int(b - a - np.count_nonzero(self.linked[a:b]))
        return {
            "start_us": dlo,
            "wall_ms": (dhi - dlo) / 1e3,
            "compute_ms": compute / 1e3,
            "comm_ms": (either - compute) / 1e3,
            "overlap_ms": (compute + comm - either) / 1e3,
            "memcpy_ms": (busy - either) / 1e3,
            "idle_ms": (dhi - dlo - busy) / 1e3,
            **host,
            "device_start_us": dlo,
            "attribution": "launch" if not unlinked else "launch+time",
            "unlinked_events": unlinked,
        }


def host_window(row: dict) -> tuple[float, float]:
    """The host range of a row (where its launches lie): its host window where attributed by launch, else the
    window its buckets were measured over."""
    if row.get("host_start_us") is not None:
        return row["host_start_us"], row["host_start_us"] + row["host_wall_ms"] * 1e3
    return row["start_us"], row["start_us"] + row["wall_ms"] * 1e3


def device_pipelining(rows: list[dict]) -> None:
    """`device_overlap_next_ms` on rows attributed by launch: how much of a row's device window the next row of
    its kind (the next stage, the next unit of the same stage) runs in, its work queued behind or beside this
    row's. The rows' walls then add up to more than the time they took together by that much."""
    kinds = defaultdict(list)
    for r in rows:
        if r.get("attribution"):
            kinds[(r.get("unit"), r.get("stage") if r.get("unit") else None)].append(r)
    for group in kinds.values():
        group.sort(key=lambda r: r["host_start_us"])
        for row, nxt in zip(group, group[1:] + [None]):
            end = row["start_us"] + row["wall_ms"] * 1e3
            row["device_overlap_next_ms"] = (
                0.0
                if nxt is None or row["device_start_us"] is None or nxt["device_start_us"] is None
                else max(0.0, end - max(row["start_us"], nxt["start_us"])) / 1e3
            )


def _host_compute(t: EventTable, compute: np.ndarray, comm: np.ndarray) -> Coverage:
    """CPU-only traces: a thread blocked in a collective is not computing, even inside an enclosing
    op (a backward node waiting on its all-gather), so each thread's collectives are cut out of its ops."""
    sel = np.flatnonzero(compute | comm)
    sel = sel[np.argsort(t.thread[sel], kind="stable")]
    cuts = np.flatnonzero(np.diff(t.thread[sel])) + 1
    runs_s, runs_e = [], []
    for idx in np.split(sel, cuts):  # one thread at a time
        c, k = idx[compute[idx]], idx[comm[idx]]
        own = Coverage(t.start[c], t.end[c]).minus(Coverage(t.start[k], t.end[k]))
        runs_s.append(own.s)
        runs_e.append(own.e)
    if not runs_s:
        return Coverage(np.zeros(0), np.zeros(0))
    return Coverage(np.concatenate(runs_s), np.concatenate(runs_e))


def marked_ranges(t: EventTable) -> list[tuple[str, str, float, float]]:
    """rlprof ranges in the trace: (kind, label, start, end), sorted by start."""
    if not len(t):
        return []
    ids = {i for i, n in enumerate(t.names) if n.startswith("rlprof:")}
    if not ids:
        return []
    sel = np.flatnonzero((t.kind == USER_ANNOTATION) & _named(t, ids))
    out = []
    for i in sel[np.argsort(t.start[sel], kind="stable")]:
        match = RLPROF_RANGE.match(t.names[t.name[i]])
        if match:
            out.append((match.group(1), match.group(2), float(t.start[i]), float(t.end[i])))
    return out


def framework_ranges(t: EventTable, meta: dict) -> list[tuple[str, str, float, float]]:
    """A framework's own ranges as (kind, label, start, end): verl's record_function stage annotations and
    `mini_batch{i}` units (where mini-batches run outside any stage range, as in a critic TrainingWorker, the
    update stage they form); on Ascend, mstx ranges named by MindSpeed-RL's stages or rlprof's."""
    if not len(t):
        return []
    if meta.get("kind") == "ascend":
        from ...frameworks import mindspeed

        return _annotations(
            t, lambda n: ("stage", mindspeed.stage_of_range(n)) if mindspeed.stage_of_range(n) else None
        )
    if meta.get("framework") != "verl":
        return engine_iterations(t)
    from ...frameworks import verl

    def verl_kind(n: str):
        stage, mb = verl.stage_of_annotation(n), verl.MINI_BATCH_RANGE.match(n)
        return ("stage", stage) if stage else ("mini_batch", mb.group(1)) if mb else None

    out = _annotations(t, verl_kind)
    stages = [r for r in out if r[0] == "stage"]
    loose = [r for r in out if r[0] == "mini_batch" and not any(s[2] <= r[2] and r[3] <= s[3] for s in stages)]
    update = verl.UPDATE_STAGE_OF_ROLE.get(meta.get("role") or "")
    if loose and update and meta.get("unit") is None:
        out.append(("stage", update, loose[0][2], max(r[3] for r in loose)))
        out.sort(key=lambda r: r[2])
    return out


PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def profiler_steps(t: EventTable) -> list[tuple[int, float, float]]:
    """torch.profiler's `ProfilerStep#N` host ranges as (N, start, end), by start."""
    return [
        (int(PROFILER_STEP.match(name).group(1)), lo, hi)
        for _, name, lo, hi in _annotations(t, lambda n: ("step", n) if PROFILER_STEP.match(n) else None)
    ]


def engine_iterations(t: EventTable) -> list[tuple[str, str, float, float]]:
    """vLLM's own profiler output: its per-iteration `execute_context_*_generation_*` annotations as decode-step
    units (what each held, from the counts in the name; `seqs`: the most rows any iteration of the file held),
    inside one rollout_generate stage from the first iteration to the end of the last."""
    from ...frameworks.engines import EXECUTE_ANNOTATION, execute_counts

    its = _annotations(t, lambda n: ("decode_step", n) if EXECUTE_ANNOTATION.match(n) else None)
    if not its:
        return []
    held = [execute_counts(name) for _, name, _, _ in its]
    seqs = max(h["active"] for h in held)
    units = [
        ("decode_step", f"{k}|" + ",".join(f"{key}={v}" for key, v in {**h, "seqs": seqs}.items()), lo, hi)
        for k, ((_, _, lo, hi), h) in enumerate(zip(its, held))
    ]
    return [("stage", "rollout_generate", its[0][2], max(u[3] for u in units)), *units]


def _named(t: EventTable, ids) -> np.ndarray:
    """Which events carry one of the name ids `ids`: a gather from a flag per name (np.isin sorts the column)."""
    flags = np.zeros(len(t.names), bool)
    flags[list(ids)] = True
    return flags[t.name]


def _annotations(t: EventTable, kind_of) -> list[tuple[str, str, float, float]]:
    """Annotation events whose name `kind_of` recognises, as (kind, label, start, end) sorted by start."""
    kinds = {i: k for i, n in enumerate(t.names) if (k := kind_of(n))}
    if not kinds:
        return []
    sel = np.flatnonzero((t.kind == USER_ANNOTATION) & _named(t, kinds))
    return [
        (*kinds[int(t.name[i])], float(t.start[i]), float(t.end[i]))
        for i in sel[np.argsort(t.start[sel], kind="stable")]
    ]


def window_rows(
    t: EventTable, device: bool, meta: dict, bd=None, span: tuple[float, float] | None = None
) -> list[dict]:
    """Rows for one trace: per stage range (and per unit inside it) when marked, else the whole trace. On a
    device trace that links its device work to launches, a stage or unit row holds the work its host range
    launched (LaunchedWork); the whole-trace row is the trace's own span, as before."""
    linked = device and t.launch is not None
    # each built where a row needs it: the whole trace's coverage (the whole-trace row, rows measured by time) and
    # LaunchedWork (its sort is per device event); a trace whose stages are attributed by launch never builds the first
    whole_trace = cache(lambda: bd or Breakdown(t, device))
    ranged = cache(lambda: LaunchedWork(t) if linked else whole_trace())
    base = {
        "step": meta.get("step"),
        "role": meta.get("role"),
        "stage": meta.get("stage"),
        "rank": meta.get("rank"),
        "replica": meta.get("replica"),
        "file": meta.get("file"),
    }
    steps = meta.get("steps") or ([meta["step"]] if meta.get("step") is not None else [None])
    ranges = marked_ranges(t) or framework_ranges(t, meta)
    stages = [r for r in ranges if r[0] == "stage"]
    rows = []
    if not stages or meta.get("unit") is not None:  # unmarked, or a file sampled by its stage's units
        stage = base["stage"] if base["stage"] not in (None, "e2e") else None
        sampled = [r for r in ranges if r[0] == meta.get("unit")] if meta.get("unit") else []
        for kind, label, ulo, uhi in sampled:  # the units the schedule kept, each a row with what it holds
            index, args = unit_label(label)
            rows.append(
                {
                    **base,
                    "stage": stage,
                    "unit": kind,
                    "index": index,
                    "start_us": ulo,
                    **ranged().window(ulo, uhi),
                    **args,
                }
            )
        if sampled:
            device_pipelining(rows)
            return rows
        lo, hi = span or t.span or ((float(t.start.min()), float(t.end.max())) if len(t) else (0.0, 0.0))
        whole = {
            **base,
            "stage": stage,
            "unit": meta.get("unit"),
            "index": meta.get("index"),
            "start_us": lo,
            **whole_trace().window(lo, hi),
        }
        rows.append(whole)
        steps_run = profiler_steps(t) if linked and meta.get("unit") is None else []
        if len(steps_run) > 1:
            whole_trace.cache_clear()  # done with: its runs go before LaunchedWork's columns are made
        for n, slo, shi in steps_run if len(steps_run) > 1 else ():  # each step: the work it launched
            rows.append(
                {
                    **whole,
                    "step": n if whole["step"] is None else whole["step"],
                    "unit": "profiler_step",
                    "index": n,
                    **ranged().window(slo, shi),
                }
            )
        device_pipelining(rows)
        return rows
    units = [r for r in ranges if r[0] not in ("stage", "mark")]
    mids = np.array([(r[2] + r[3]) / 2 for r in units])
    by_mid = np.argsort(mids, kind="stable")
    step_at = _StepAt(meta.get("step_spans"))
    seen: dict[str, int] = defaultdict(int)
    call = (meta.get("sampled") or {}).get("call") if len(stages) == 1 else None  # a stage call's kept units
    for _, stage, lo, hi in stages:
        k = seen[stage]
        seen[stage] += 1
        step = step_at(lo, steps[min(k, len(steps) - 1)])
        role = STAGE_ROLE.get(stage, base["role"])
        stage_row = {
            **base,
            "step": step,
            "role": role,
            "stage": stage,
            "unit": None,
            "index": None,
            "start_us": lo,
            **ranged().window(lo, hi),
        }
        rows.append(stage_row)
        inside = by_mid[np.searchsorted(mids[by_mid], lo, "left") : np.searchsorted(mids[by_mid], hi, "right")]
        for kind, label, ulo, uhi in (units[i] for i in np.sort(inside)):  # units centred in the stage
            index, args = unit_label(label)
            rows.append(
                {**stage_row, "unit": kind, "index": index, "start_us": ulo, **ranged().window(ulo, uhi), **args}
            )
        if call and stage == meta.get("stage"):  # the stage's row only, not its units'
            stage_row["call"] = dict(call)
    device_pipelining(rows)
    return rows


# What a unit range may say it holds (integers); the prefill pair: an inference engine's rows and tokens still in their
# prompt's prefill; `context_tokens` (the tokens the real rows attend to, summed: the KV cache a decode step reads) and
# `query_key_pairs` (tokens computed x tokens attended to, summed over the real rows): the work of its attention.
UNIT_ARGS = (
    "seqs",
    "tokens",
    "real_tokens",
    "active",
    "prefill_seqs",
    "prefill_tokens",
    "context_tokens",
    "query_key_pairs",
)


def unit_label(label: str) -> tuple[int | str, dict[str, int]]:
    """`3|seqs=8,tokens=160` -> (3, {"seqs": 8, "tokens": 160}); keys other than UNIT_ARGS and values that are
    not non-negative integers are left out (a range name is free text in other tools' traces)."""
    head, _, tail = label.partition("|")
    args = {}
    for part in tail.split(",") if tail else ():
        key, _, value = part.partition("=")
        if key in UNIT_ARGS and value.isdigit():
            args[key] = int(value)
    return (int(head) if head.isdigit() else head), args


class _StepAt:
    """The step whose recorded span (torch_npu's STEP_TIME / ProfilerStep#) holds time t."""

    def __init__(self, spans):
        self.spans = sorted(spans or (), key=lambda s: s[1])
        self.starts = [s[1] for s in self.spans]

    def __call__(self, t: float, default):
        i = bisect.bisect_right(self.starts, t) - 1
        return self.spans[i][0] if i >= 0 and t <= self.spans[i][2] else default


def stage_of_events(t: EventTable, rows: list[dict]) -> tuple[np.ndarray, list[dict]]:
    """Which stage window (row) each event belongs to, -1 outside all, and those windows' rows.

    Device kernels are placed by their launch on the host where the trace links them (Kineto's correlation and
    ac2g flows), so
    work queued at a stage's end belongs to that stage even when it runs in the next; without a flow, by their
    own start time.
    """
    stages = [r for r in rows if r["unit"] is None and r["start_us"] is not None]
    stages.sort(key=lambda r: host_window(r)[0])
    if not stages or not len(t):
        return np.full(len(t), -1, np.int32), stages
    lo, hi = (np.array(side) for side in zip(*map(host_window, stages)))
    # windows measured by time (the whole trace's span, a step narrowed to its device activity) hold what ran
    # in them, whenever launched
    when = t.placed_at() if any(r.get("attribution") for r in stages) else t.start
    i = np.searchsorted(lo, when, side="right") - 1
    inside = (i >= 0) & (when <= hi[np.clip(i, 0, None)])
    return np.where(inside, i, -1).astype(np.int32), stages


class OverlapBreakdown:
    """Buckets from the overlap lanes. Free is what the span leaves after computing and exposed communication
    (the Ascend tools' own definition), so the buckets add up to wall."""

    def __init__(self, lanes: dict[str, Coverage]):
        self.lanes = lanes

    def window(self, lo: float, hi: float) -> dict[str, float]:
        get = lambda k: self.lanes[k].within(lo, hi) if k in self.lanes else 0.0  # noqa: E731
        compute, comm_all, comm_alone = (get(k) for k in LANES)
        return {
            "wall_ms": (hi - lo) / 1e3,
            "compute_ms": compute / 1e3,
            "comm_ms": comm_alone / 1e3,
            "overlap_ms": max(0.0, comm_all - comm_alone) / 1e3,
            "memcpy_ms": 0.0,
            "idle_ms": max(0.0, hi - lo - compute - comm_alone) / 1e3,
        }

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

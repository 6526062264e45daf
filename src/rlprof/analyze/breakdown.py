"""Where the time went, per window: wall, compute, comm, overlap, memcpy, idle (SPEC §3).

compute = covered by compute; comm = communication not overlapped with compute; overlap = both;
memcpy = copies/sets overlapped by neither; idle = the rest of the span. They add up to wall.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..config.vocab import STAGE_ROLE
from .classify import RLPROF_RANGE, buckets
from .intervals import Coverage
from .table import USER_ANNOTATION, EventTable

BUCKETS = ("wall_ms", "compute_ms", "comm_ms", "overlap_ms", "memcpy_ms", "idle_ms")


class Breakdown:
    def __init__(self, table: EventTable, device: bool):
        m = buckets(table, device)
        s, e = table.start, table.end
        c, k, y = m["compute"], m["comm"], m["memcpy"]
        self.compute = Coverage(s[c], e[c])
        self.comm = Coverage(s[k], e[k])
        self.compute_or_comm = Coverage(s[c | k], e[c | k])
        self.busy = Coverage(s[c | k | y], e[c | k | y])

    def window(self, lo: float, hi: float) -> dict[str, float]:
        c, m = self.compute.within(lo, hi), self.comm.within(lo, hi)
        cm, busy = self.compute_or_comm.within(lo, hi), self.busy.within(lo, hi)
        span = hi - lo
        return {"wall_ms": span / 1e3, "compute_ms": c / 1e3, "comm_ms": (cm - c) / 1e3,
                "overlap_ms": (c + m - cm) / 1e3, "memcpy_ms": (busy - cm) / 1e3, "idle_ms": (span - busy) / 1e3}


def marked_ranges(t: EventTable) -> list[tuple[str, str, float, float]]:
    """rlprof ranges in the trace: (kind, label, start, end), sorted by start."""
    if not len(t):
        return []
    ids = {i for i, n in enumerate(t.names) if n.startswith("rlprof:")}
    if not ids:
        return []
    sel = np.flatnonzero((t.kind == USER_ANNOTATION) & np.isin(t.name, list(ids)))
    out = []
    for i in sel[np.argsort(t.start[sel], kind="stable")]:
        match = RLPROF_RANGE.match(t.names[t.name[i]])
        if match:
            out.append((match.group(1), match.group(2), float(t.start[i]), float(t.end[i])))
    return out


def window_rows(t: EventTable, device: bool, meta: dict, bd=None, span: tuple[float, float] | None = None
                ) -> list[dict]:
    """Rows for one trace: per stage range (and per unit inside it) when marked, else the whole trace."""
    bd = bd or Breakdown(t, device)
    base = {"step": meta.get("step"), "role": meta.get("role"), "stage": meta.get("stage"),
            "rank": meta.get("rank"), "replica": meta.get("replica"), "file": meta.get("file")}
    steps = meta.get("steps") or ([meta["step"]] if meta.get("step") is not None else [None])
    ranges = marked_ranges(t)
    stages = [r for r in ranges if r[0] == "stage"]
    rows = []
    if not stages:
        lo, hi = span or t.span or ((float(t.start.min()), float(t.end.max())) if len(t) else (0.0, 0.0))
        stage = base["stage"] if base["stage"] not in (None, "e2e") else None
        rows.append({**base, "stage": stage, "unit": None, "index": None, "start_us": lo, **bd.window(lo, hi)})
        return rows
    seen: dict[str, int] = defaultdict(int)
    for _, stage, lo, hi in stages:
        k = seen[stage]
        seen[stage] += 1
        step = steps[min(k, len(steps) - 1)]
        role = STAGE_ROLE.get(stage, base["role"])
        stage_row = {**base, "step": step, "role": role, "stage": stage, "unit": None, "index": None,
                     "start_us": lo, **bd.window(lo, hi)}
        rows.append(stage_row)
        for kind, label, ulo, uhi in ranges:
            if kind in ("stage", "mark") or not (lo <= (ulo + uhi) / 2 <= hi):
                continue
            index = int(label) if label.isdigit() else label
            rows.append({**stage_row, "unit": kind, "index": index, "start_us": ulo, **bd.window(ulo, uhi)})
    return rows

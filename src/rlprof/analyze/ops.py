"""Top operators and kernels, collectives, launch overhead and memory, from one event table."""

from __future__ import annotations

import numpy as np

from .classify import COLLECTIVE, LAUNCH, name_flags
from .table import CPU_OP, KERNEL, MEMCPY, MEMSET, RUNTIME, EventTable


def self_times(t: EventTable, sel: np.ndarray) -> np.ndarray:
    """Duration minus the time of directly nested events on the same thread, aligned with `sel`."""
    order = np.lexsort((-(t.end[sel] - t.start[sel]), t.start[sel], t.thread[sel]))
    idx = sel[order]
    self_t = t.end[idx] - t.start[idx]
    starts, ends, threads = t.start[idx].tolist(), t.end[idx].tolist(), t.thread[idx].tolist()
    stack: list[int] = []
    thread = None
    for j in range(len(idx)):
        if threads[j] != thread:
            stack, thread = [], threads[j]
        while stack and ends[stack[-1]] <= starts[j]:
            stack.pop()
        if stack:
            parent = stack[-1]
            self_t[parent] -= min(ends[j], ends[parent]) - starts[j]
        stack.append(j)
    out = np.empty(len(sel))
    out[order] = self_t
    return out


def _aggregate(t: EventTable, sel: np.ndarray, kind: str, self_t: np.ndarray | None, top: int) -> list[dict]:
    if not len(sel):
        return []
    dur = t.end[sel] - t.start[sel]
    ids = t.name[sel]
    uniq, inv = np.unique(ids, return_inverse=True)
    count = np.bincount(inv)
    total = np.bincount(inv, weights=dur)
    mx = np.zeros(len(uniq))
    np.maximum.at(mx, inv, dur)
    slf = np.bincount(inv, weights=self_t) if self_t is not None else total
    grand = float(slf.sum()) or 1.0
    order = np.argsort(-slf)[:top]
    return [{"name": t.names[uniq[i]], "kind": kind, "count": int(count[i]), "total_ms": float(total[i]) / 1e3,
             "self_ms": float(slf[i]) / 1e3, "mean_ms": float(total[i] / count[i]) / 1e3,
             "max_ms": float(mx[i]) / 1e3, "share": float(slf[i]) / grand} for i in order]


def top_ops(t: EventTable, top: int = 50) -> list[dict]:
    cpu = np.flatnonzero(t.kind == CPU_OP)
    kernels = np.flatnonzero(np.isin(t.kind, (KERNEL, MEMCPY, MEMSET)))
    return _aggregate(t, cpu, "cpu_op", self_times(t, cpu), top) + _aggregate(t, kernels, "kernel", None, top)


def collectives(t: EventTable, device: bool) -> list[dict]:
    flags = name_flags(t.names, COLLECTIVE)[t.name] if len(t) else np.zeros(0, bool)
    kinds = (KERNEL,) if device else None
    sel = np.flatnonzero(flags & (np.isin(t.kind, kinds) if kinds else (t.kind != KERNEL)))
    return [{k: v for k, v in row.items() if k in ("name", "count", "total_ms", "mean_ms", "max_ms")}
            for row in _aggregate(t, sel, "collective", None, 1000)]


def launch_overhead(t: EventTable) -> dict:
    flags = name_flags(t.names, LAUNCH)[t.name] if len(t) else np.zeros(0, bool)
    sel = (t.kind == RUNTIME) & flags
    dur = t.end[sel] - t.start[sel]
    return {"launches": int(sel.sum()), "total_ms": float(dur.sum()) / 1e3,
            "mean_us": float(dur.mean()) if len(dur) else 0.0}


def memory(t: EventTable, points: int = 400) -> dict:
    if not len(t.memory):
        return {"peak_bytes": None, "timeline": []}
    ts, total = t.memory[:, 0], t.memory[:, 1]
    step = max(1, len(ts) // points)
    return {"peak_bytes": float(total.max()),
            "timeline": [[float(a), float(b)] for a, b in zip(ts[::step], total[::step])]}

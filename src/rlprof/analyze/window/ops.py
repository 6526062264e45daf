"""Top operators and kernels, collectives, launch overhead and memory, from one event table."""

from __future__ import annotations

import numpy as np

from .breakdown import host_window
from ..tables.classify import COLLECTIVE, LAUNCH, name_flags
from ..tables.intervals import Coverage
from ..tables.table import CPU_MEMORY, CPU_OP, DEVICE_KINDS, KERNEL, MEMCPY, MEMSET, UNKNOWN_DEVICE, EventTable


SEGMENT = 1 << 18  # events per self-time segment: bounds the temporaries on huge traces


def self_times(t: EventTable, sel: np.ndarray) -> np.ndarray:
    """Duration minus the time of directly nested events on the same thread, aligned with `sel`.

    Vectorised: events sorted by (thread, start, longest first); an event's depth is the number of
    earlier events still open at its start; its parent is the nearest earlier event one level up.
    Nesting never crosses a depth-0 event, so the parent search runs in bounded segments.
    """
    n = len(sel)
    if n == 0:
        return np.zeros(0)
    # The same arithmetic as written plainly, done in place: on a 2 GB trace every array here is ~20 MB.
    s = t.start[sel]
    e = t.end[sel]
    base = float(s.min())
    lane = (float(e.max()) - base) * 2 + 1.0  # threads laid end to end on one axis
    e -= s  # duration
    s -= base
    s += t.thread[sel] * lane
    e += s
    order = np.lexsort((s - e, s)).astype(np.int32)
    s, e = s[order], e[order]
    depth = np.arange(n, dtype=np.int64)
    sorted_end = np.sort(e)
    depth -= np.searchsorted(sorted_end, s, side="right")
    del sorted_end
    depth = depth.astype(np.int32)
    np.clip(depth, 0, None, out=depth)
    self_t = e - s
    roots = np.flatnonzero(depth == 0)
    cuts = [0] + [int(roots[k]) for k in np.searchsorted(roots, np.arange(SEGMENT, n, SEGMENT)) if k < len(roots)] + [n]
    del roots
    for a, b in zip(cuts[:-1], cuts[1:]):
        if b > a:
            self_t[a:b] -= _children_time(s[a:b], e[a:b], depth[a:b])
    del s, e, depth
    np.clip(self_t, 0, None, out=self_t)
    out = np.empty(n)
    out[order] = self_t
    return out


def _children_time(s: np.ndarray, e: np.ndarray, depth: np.ndarray) -> np.ndarray:
    n = len(s)
    by_depth = np.argsort(depth, kind="stable")  # grouped by depth, ascending positions within a level
    bounds = np.concatenate([[0], np.cumsum(np.bincount(depth))])
    parent = np.full(n, -1, dtype=np.int64)
    for level in range(1, len(bounds) - 1):
        above = by_depth[bounds[level - 1] : bounds[level]]
        here = by_depth[bounds[level] : bounds[level + 1]]
        pos = np.searchsorted(above, here) - 1
        ok = pos >= 0
        parent[here[ok]] = above[pos[ok]]
    child = np.flatnonzero(parent >= 0)
    covered = np.clip(np.minimum(e[child], e[parent[child]]) - s[child], 0, None)
    return np.bincount(parent[child], weights=covered, minlength=n)


def _aggregate(
    t: EventTable,
    sel: np.ndarray,
    kind: str,
    self_t: np.ndarray | None,
    top: int | None,
    groups: np.ndarray | None = None,
    by_shape: bool = False,
) -> list[dict]:
    """count/total/self/mean/max per (group, name[, input shape]); the `top` by self time in each group.
    Rows carry `group` (index into the caller's windows, -1 outside them) when groups are given."""
    if not len(sel):
        return []
    dur = t.end[sel]
    dur -= t.start[sel]
    key = groups[sel].astype(np.int64) if groups is not None else np.zeros(len(sel), np.int64)
    key += 1
    key *= len(t.names)
    key += t.name[sel]
    shaped = by_shape and t.shape is not None
    if shaped:
        key *= max(1, len(t.shapes))
        key += t.shape[sel]
    size = int(key.max()) + 1
    if size > max(len(key), 1 << 16):  # sparse keys: number them (a sort)
        uniq, key = np.unique(key, return_inverse=True)
        size, present = len(uniq), slice(None)
        count = np.bincount(key, minlength=size)
    else:  # dense enough to count in place: no sort, no inverse index (the same sums, in the same order)
        count = np.bincount(key, minlength=size)
        present = uniq = np.flatnonzero(count)
        count = count[present]
    total = np.bincount(key, weights=dur, minlength=size)[present]
    mx = np.zeros(size)
    np.maximum.at(mx, key, dur)
    mx = mx[present]
    slf = np.bincount(key, weights=self_t, minlength=size)[present] if self_t is not None else total
    del key
    shape_id = uniq % max(1, len(t.shapes)) if shaped else None
    rest = uniq // max(1, len(t.shapes)) if shaped else uniq
    name_id, group_of = rest % len(t.names), rest // len(t.names) - 1
    grand = np.bincount(group_of + 1, weights=slf)  # share: within the op's own group
    order = np.lexsort((-slf, group_of))
    if top is not None:
        first = np.searchsorted(group_of[order], group_of[order], side="left")
        order = order[np.arange(len(order)) - first < top]
    rows = []
    for i in order.tolist():
        row = {
            "name": t.names[name_id[i]],
            "kind": kind,
            "count": int(count[i]),
            "total_ms": float(total[i]) / 1e3,
            "self_ms": float(slf[i]) / 1e3,
            "mean_ms": float(total[i] / count[i]) / 1e3,
            "max_ms": float(mx[i]) / 1e3,
            "share": float(slf[i]) / (float(grand[group_of[i] + 1]) or 1.0),
        }
        if shaped:
            row["shape"] = t.shapes[shape_id[i]]
        if groups is not None:
            row["group"] = int(group_of[i])
        rows.append(row)
    return rows


def top_ops(
    t: EventTable, top: int | None = 50, groups: np.ndarray | None = None, by_shape: bool = False
) -> list[dict]:
    """CPU operators (ranked by self time) and device kernels/copies, per group of events."""
    cpu = np.flatnonzero(t.kind == CPU_OP)
    rows = _aggregate(t, cpu, "cpu_op", self_times(t, cpu), top, groups, by_shape)
    del cpu
    kernels = np.flatnonzero(t.mask(KERNEL, MEMCPY, MEMSET))
    return rows + _aggregate(t, kernels, "kernel", None, top, groups, by_shape)


def collectives(t: EventTable, device: bool, groups: np.ndarray | None = None) -> list[dict]:
    flags = name_flags(t.names, COLLECTIVE)[t.name] if len(t) else np.zeros(0, bool)
    kinds = (KERNEL,) if device else None
    sel = np.flatnonzero(flags & (t.mask(*kinds) if kinds else (t.kind != KERNEL)))
    return [
        {k: v for k, v in row.items() if k in ("name", "count", "total_ms", "mean_ms", "max_ms", "group")}
        for row in _aggregate(t, sel, "collective", None, None, groups)
    ]


def launch_overhead(t: EventTable) -> dict:
    count = total = 0.0
    for name, (n, us) in t.runtime.items():
        if LAUNCH.match(name):
            count += n
            total += us
    return {"launches": int(count), "total_ms": total / 1e3, "mean_us": total / count if count else 0.0}


def memory(t: EventTable, points: int = 400, capacities: dict[int, float] | None = None) -> dict:
    """Allocated bytes over time of one allocator: the accelerator with the highest peak where the trace has
    device counters, else its one counter (host memory last). Counters of different devices never add up.
    `capacities`: device id -> bytes (the trace's deviceProperties), for the headroom."""
    if not len(t.memory):
        return {"peak_bytes": None, "timeline": []}
    dev = t.memory[:, 2].astype(int)
    peaks = {int(d): float(t.memory[dev == d, 1].max()) for d in np.unique(dev)}
    accel = [d for d in peaks if d >= 0]
    chosen = max(accel, key=peaks.get) if accel else (UNKNOWN_DEVICE if UNKNOWN_DEVICE in peaks else CPU_MEMORY)
    rows = t.memory[dev == chosen]
    ts, total = rows[:, 0], rows[:, 1]
    step = max(1, len(ts) // points)
    out = {
        "peak_bytes": peaks[chosen],
        "device": {CPU_MEMORY: "cpu", UNKNOWN_DEVICE: None}.get(chosen, chosen),
        "timeline": [[float(a), float(b)] for a, b in zip(ts[::step], total[::step])],
    }
    capacity = (capacities or {}).get(chosen) if chosen >= 0 else None
    if capacity:
        out["capacity_bytes"] = capacity
    return out


RECORDED_KEYS = ("free_bytes", "max_reserved_bytes")  # what the window's device record adds to a memory record


def with_device_record(mem: dict, recorded: dict | None, snapshot: bool = False) -> dict:
    """A memory record with the device memory its window recorded (the manifest row's or the trace's
    `device_memory`, collect/device_memory.py): the device's capacity where the file gives none, its name, what the
    caching allocator had reserved; else `capacity_why`, why the capacity is not known (the memory measure says it).
    A snapshot's record takes the recorded device; a trace's, only where it is the device its counter is."""
    if mem.get("peak_bytes") is None:
        return mem
    out = dict(mem)
    rec = recorded if isinstance(recorded, dict) and recorded.get("capacity_bytes") else None
    same = rec is not None and (snapshot or out.get("device") == rec.get("index"))
    if same:
        if snapshot:
            out["device"] = rec.get("index")
        out.setdefault("capacity_bytes", float(rec["capacity_bytes"]))
        out["device_name"] = rec.get("name")
        out.setdefault("reserved_bytes", float(rec.get("reserved_bytes") or 0.0))
        out.update({k: float(rec[k]) for k in RECORDED_KEYS if isinstance(rec.get(k), (int, float))})
    if out.get("capacity_bytes"):
        return out
    if out.get("device") == "cpu":
        out["capacity_why"] = "the memory recorded is host memory, not a device's"
    elif snapshot:
        out["capacity_why"] = (
            "a memory snapshot holds no capacity and its window recorded none (a recording made before rlprof "
            "recorded the device's memory beside each window, or a snapshot read without its run's manifest.jsonl)"
        )
    elif out.get("device") is None:
        out["capacity_why"] = "the trace does not say which device its memory counter is"
    else:
        out["capacity_why"] = (
            f"the trace gives no capacity for device {out['device']} (no deviceProperties) and its window recorded none"
        )
    return out


def device_capacities(properties: list | None) -> dict[int, float]:
    """Device id -> total memory in bytes, from a Kineto trace's deviceProperties."""
    out = {}
    for p in properties or ():
        if isinstance(p, dict) and isinstance(p.get("id"), int) and isinstance(p.get("totalGlobalMem"), (int, float)):
            out[p["id"]] = float(p["totalGlobalMem"])
    return out


def unit_signatures(t: EventTable, rows: list[dict]) -> None:
    """Give each unit row (decode step, micro-/mini-batch) `ops_sig`: a short digest of the set of operator and
    kernel names placed inside it (a kernel at its launch), so units that run the same operators can be told apart from ones that do
    not (findings: repeating units). One pass per unit kind; units of one kind do not overlap."""
    import hashlib

    ops = np.flatnonzero(t.mask(CPU_OP, KERNEL, MEMCPY, MEMSET))
    for kind in {r["unit"] for r in rows if r.get("unit")}:
        units = sorted(
            (r for r in rows if r.get("unit") == kind and r.get("start_us") is not None),
            key=lambda r: host_window(r)[0],
        )
        if not units or not len(ops):
            continue
        lo, hi = (np.array(side) for side in zip(*map(host_window, units)))
        width = max(len(t.names), 1)
        # the (unit, name) pairs present, as one flag each where that table is small (a scatter, no sort), else
        # sorted out of each segment
        seen = np.zeros(len(units) * width, bool) if len(units) * width <= max(1 << 24, len(ops)) else None
        pairs = []
        for a in range(0, len(ops), SEGMENT * 4):  # in segments: bounded temporaries on a large trace
            seg = ops[a : a + SEGMENT * 4]
            when = t.placed_at(seg)
            i = np.searchsorted(lo, when, side="right") - 1
            inside = (i >= 0) & (when <= hi[np.clip(i, 0, None)])
            key = i[inside].astype(np.int64) * width + t.name[seg[inside]]  # (unit, name)
            if seen is not None:
                seen[key] = True
            else:
                pairs.append(np.unique(key))
            del when, i, inside, key
        pairs = np.flatnonzero(seen) if seen is not None else np.unique(np.concatenate(pairs))
        unit_of, name_of = pairs // width, pairs % width
        cuts = np.searchsorted(unit_of, np.arange(len(units) + 1))
        for k, u in enumerate(units):
            names = sorted(t.names[n] for n in name_of[cuts[k] : cuts[k + 1]])
            u["ops_sig"] = hashlib.blake2b("\n".join(names).encode(), digest_size=6).hexdigest() if names else None


class LaunchGaps:
    """Where the device sat idle between its events (kernels, copies, sets on any stream), and why.

    A gap ends when the next device event starts. It is launch-bound when the host issued that event (its
    launch call, linked by the trace's flow) only after the device went idle: the device waited on the host
    to launch. A gap whose next event was launched before it began waits on something else (a dependency, a
    synchronisation, a copy from the host); one whose launch the trace does not link is counted as unknown.
    """

    def __init__(self, t: EventTable):
        sel = np.flatnonzero(t.mask(*DEVICE_KINDS)) if len(t) else np.zeros(0, int)
        sel = sel[np.argsort(t.start[sel], kind="stable")]
        s, e = t.start[sel], t.end[sel]
        launch = t.launch[sel] if t.launch is not None else np.full(len(sel), np.nan)
        busy_until = np.maximum.accumulate(e) if len(e) else e
        after = np.flatnonzero(s[1:] > busy_until[:-1]) + 1  # events that start after an idle stretch
        self.lo, self.hi = busy_until[after - 1], s[after]
        issued = launch[after]
        self.bound = issued > self.lo  # NaN compares False
        self.unknown = np.isnan(issued)
        self.span = (float(s[0]), float(busy_until[-1])) if len(s) else None
        # the gaps are disjoint and sorted: a window's share is two searchsorted cuts and prefix sums (thousands of
        # rows, decode steps or ProfilerSteps, each cost O(log gaps), not a pass over every gap)
        length = self.hi - self.lo
        self.cum = {
            k: np.concatenate([[0.0], np.cumsum(np.where(m, length, 0.0))])
            for k, m in (("all", np.ones(len(length), bool)), ("bound", self.bound), ("unknown", self.unknown))
        }

    def bound_runs(self) -> Coverage:
        """The launch-bound gaps as runs (disjoint, sorted): what the host's stacks split by frame."""
        return Coverage.runs(self.lo[self.bound], self.hi[self.bound])

    def within(self, lo: float, hi: float) -> dict[str, float]:
        """Device gap, launch-bound and unlinked gap time (ms) inside [lo, hi]."""
        i, j = int(np.searchsorted(self.hi, lo, "right")), int(np.searchsorted(self.lo, hi, "left"))
        out = {}
        for key, name, flags in (
            ("all", "device_gap_ms", None),
            ("bound", "launch_bound_ms", self.bound),
            ("unknown", "launch_unlinked_ms", self.unknown),
        ):
            total = 0.0
            if j > i:  # gaps i..j-1 meet the window; the first and the last may stick out of it
                total = self.cum[key][j] - self.cum[key][i]
                if flags is None or flags[i]:
                    total -= max(0.0, lo - self.lo[i])
                if flags is None or flags[j - 1]:
                    total -= max(0.0, self.hi[j - 1] - hi)
            out[name] = float(max(total, 0.0)) / 1e3
        return out

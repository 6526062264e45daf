"""Idle explained: each row's idle time split by the Python frames on the stage thread's stack while the device (on a
CPU-only trace: the operators) waited, from the host's stacks sampled beside the window (analyze/inputs/
host_stacks_file.py); and the stage thread's time in the host-side causes (a host sync, data moved between roles,
waiting on I/O or a remote call, garbage collection), each with its call site.

A sample stands for the time nearest to it (half-way to its neighbours, at most `REACH` sampling intervals away):
idle time no sample is that near to is said as unattributed, never spread over the others. Each stretch of idle is
charged to the innermost frame of the code that drives the stage (a framework or the user's own code:
frameworks/host_frames.py), said with the library the thread was in at the time (`inside`: torch, the standard
library, ...); `idle_libraries` sums the idle by that library.

What a row gains (docs/analysis_schema.md): `idle_frames` (function, file, line, library, inside, ms, share of the
row's idle), `idle_frames_rest_ms` (the charged frames past the listed ones), `idle_unattributed_ms`,
`idle_libraries`, `idle_tree` (the stacks of the idle, merged and pruned: the report's icicle), `host_time` (per
cause: ms of the row's time, its top call site) and, on a device trace that links its launches, `launch_frames` (its
launch-bound gaps, the device waiting for the host's next launch, split the same way).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ...frameworks import host_frames
from ..inputs.host_stacks_file import HostStacks
from ..tables.intervals import Coverage

# A sample stands for time at most this far away: two sampling intervals, and at least Python's switch interval
# (5 ms) and its interval: a look waits for the GIL that long while the stage thread runs Python
REACH = 2
REACH_MIN_US = 10_000
TOP = 25  # idle_frames lists at most this many frames
LISTED_SHARE = 0.995  # and stops once the listed ones hold this share of the attributed idle
TREE_MIN_SHARE = 0.01  # the icicle keeps the stacks holding at least this share of the row's attributed idle
TREE_NODES = 200  # and at most this many nodes
ROW_FIELDS = (
    "idle_frames",
    "idle_frames_rest_ms",
    "idle_unattributed_ms",
    "idle_libraries",
    "idle_tree",
    "host_time",
    "host_samples",
    "launch_frames",
)


def short_file(module: str, file: str) -> str:
    """A frame's file from its package's root (`verl/workers/actor/dp_actor.py`), else its name: documents stay the
    same wherever the code was installed."""
    path = file.replace("\\", "/")
    parts = module.split(".") if module and module != "__main__" else []
    for n in range(len(parts), 0, -1):
        root = "/" + "/".join(parts[:n]) + "/"
        at = path.rfind(root)
        if at >= 0:
            return path[at + 1 :]
        tail = "/" + "/".join(parts[:n]) + ".py"
        if path.endswith(tail):
            return tail[1:]
    return path.rsplit("/", 1)[-1]


class _Node:
    """What one stack node of the samples says: its charged frame, the library it is inside, its host cause."""

    __slots__ = ("charged", "inside", "kind", "path")

    def __init__(self, stacks: HostStacks, node: int, info: list):
        frames = stacks.frames_of(node)  # innermost first
        self.path = frames[::-1]
        libs = [info[f][0] for f in frames]
        self.inside = next((lib for lib in libs if lib != host_frames.PROFILER), libs[0] if libs else "?")
        charged = next((f for f, lib in zip(frames, libs) if host_frames.is_host(lib)), None)
        if charged is None:  # no host code on the stack: the innermost frame that is not the profiler's
            charged = next((f for f, lib in zip(frames, libs) if lib != host_frames.PROFILER), frames[0])
        self.charged = charged
        self.kind = host_frames.host_kind([stacks.frames[f] for f in frames])


class IdleAttribution:
    """One window's samples of its stage thread, on the trace's clock, and the device's (or operators') busy time."""

    def __init__(
        self, stacks: HostStacks, busy: Coverage, base_us: float, device: bool = True, bound: Coverage | None = None
    ):
        self.stacks = stacks
        self.device = device  # a host sync waits for a device: none on a CPU-only trace
        self.bound = bound  # the device's launch-bound gaps (ops.LaunchGaps), where the trace links launches
        self.busy = busy
        thread = stacks.stage_thread()
        s = stacks.samples
        mine = [i for i, th in enumerate(s.thread) if th == thread]
        t = np.array([s.t_us[i] for i in mine], float) - base_us
        order = np.argsort(t, kind="stable")
        self.t = t[order]
        self.sample_node = np.array([s.stack[i] for i in mine], np.int64)[order]
        reach = max(REACH * stacks.interval_us, REACH_MIN_US)
        mid = (self.t[1:] + self.t[:-1]) / 2
        self.a = np.maximum(np.concatenate([[-np.inf], mid]), self.t - reach)
        self.b = np.minimum(np.concatenate([mid, [np.inf]]), self.t + reach)
        self.info = [(host_frames.library(m, f), short_file(m, f), line, fn) for m, f, line, fn, _ in stacks.frames]
        self._nodes: dict[int, _Node] = {}
        gc_thread = [g for g in stacks.gc if g[2] == thread]
        self.gc = np.array([[g[0] - base_us, g[1] - base_us] for g in gc_thread], float).reshape(-1, 2)

    def node(self, n: int) -> _Node:
        found = self._nodes.get(n)
        if found is None:
            found = self._nodes[n] = _Node(self.stacks, n, self.info)
        return found

    def frame(self, f: int) -> dict:
        lib, file, line, fn = self.info[f]
        return {"function": fn, "file": file, "line": line, "library": lib}

    def row(self, row: dict) -> dict:
        """The fields a row gains (ROW_FIELDS); {} where no sample of the stage thread falls in it."""
        lo = row["start_us"]
        hi = lo + row["wall_ms"] * 1e3
        i, j = np.searchsorted(self.b, lo, "right"), np.searchsorted(self.a, hi, "left")
        if j <= i:
            return {}
        a, b = np.clip(self.a[i:j], lo, hi), np.clip(self.b[i:j], lo, hi)
        idle = self._idle_runs(lo, hi)
        idle_us = _covered_between(idle, a, b)
        bound_us = _covered_between(self.bound, a, b) if self.bound is not None else np.zeros(len(idle_us))
        span_us = b - a
        by_frame: dict = defaultdict(float)
        by_library: dict = defaultdict(float)
        by_kind: dict = defaultdict(lambda: defaultdict(float))
        tree: dict = defaultdict(float)
        by_launch: dict = defaultdict(float)
        weights = zip(self.sample_node[i:j].tolist(), idle_us.tolist(), span_us.tolist(), bound_us.tolist())
        for n, w_idle, w_span, w_bound in weights:
            info = self.node(n)
            if w_bound > 0:
                by_launch[(info.charged, info.inside)] += w_bound
            if w_idle > 0:
                by_frame[(info.charged, info.inside)] += w_idle
                by_library[info.inside] += w_idle
                tree[n] += w_idle
            if info.kind is not None and w_span > 0 and (self.device or info.kind != "host_sync"):
                by_kind[info.kind][info.charged] += w_span
        gc_us, gc_site = self._gc(lo, hi, i, j)
        if gc_us > 0:
            by_kind["garbage_collection"][gc_site] += gc_us
        attributed = sum(by_frame.values())
        idle_ms = row.get("idle_ms") or 0.0
        listed, rest = _top(by_frame, attributed)
        return {
            "idle_frames": self._frames(listed, idle_ms),
            "idle_frames_rest_ms": rest / 1e3,
            "idle_unattributed_ms": max(0.0, idle_ms - attributed / 1e3),
            "idle_libraries": {lib: us / 1e3 for lib, us in sorted(by_library.items(), key=lambda kv: -kv[1])},
            "idle_tree": self._tree(tree, attributed),
            "host_time": {
                kind: {**self.frame(max(sites, key=sites.get)), "ms": sum(sites.values()) / 1e3}
                for kind, sites in by_kind.items()
            },
            "host_samples": int(j - i),
            **(
                {"launch_frames": self._frames(_top(by_launch, 0.0)[0], row.get("launch_bound_ms"))}
                if by_launch
                else {}
            ),
        }

    def _frames(self, listed: list, of_ms: float | None) -> list[dict]:
        """Charged frames [((frame, inside), µs)] as records, each with its share of `of_ms`."""
        return [
            {**self.frame(f), "inside": inside, "ms": us / 1e3, "share": us / 1e3 / of_ms if of_ms else 0.0}
            for (f, inside), us in listed
        ]

    def _idle_runs(self, lo: float, hi: float) -> Coverage:
        """The row's idle: [lo, hi] less the busy runs inside it."""
        s, e = self.busy.s, self.busy.e
        k0, k1 = np.searchsorted(e, lo, "right"), np.searchsorted(s, hi, "left")
        bs, be = np.clip(s[k0:k1], lo, hi), np.clip(e[k0:k1], lo, hi)
        starts = np.concatenate([[lo], be])
        ends = np.concatenate([bs, [hi]])
        keep = ends > starts
        return Coverage.runs(starts[keep], ends[keep])

    def _gc(self, lo: float, hi: float, i: int, j: int) -> tuple[float, int | None]:
        """The stage thread's collections inside [lo, hi] (µs) and the frame that ran into the first of them (the
        charged frame of the sample nearest its start)."""
        if not len(self.gc):
            return 0.0, None
        s, e = np.clip(self.gc[:, 0], lo, hi), np.clip(self.gc[:, 1], lo, hi)
        inside = e > s
        if not inside.any():
            return 0.0, None
        start = float(s[inside][0])
        k = i + int(np.argmin(np.abs(self.t[i:j] - start)))
        return float((e - s)[inside].sum()), self.node(int(self.sample_node[k])).charged

    def _tree(self, weights: dict, total: float) -> list[dict]:
        """The idle's stacks as an icicle: nodes {id, parent, function, file, line, ms}, the frames every sample of
        the row shares left out (they hold all of it), stacks under TREE_MIN_SHARE pruned."""
        if total <= 0:
            return []
        paths = [(self.node(n).path, w) for n, w in weights.items()]
        common = paths[0][0]
        for path, _ in paths[1:]:
            k = 0
            while k < min(len(common), len(path)) and common[k] == path[k]:
                k += 1
            common = common[:k]
        cut = max(0, len(common) - 1)  # keep the deepest shared frame as the root
        ids: dict = {}
        nodes: list[dict] = []
        ms: list[float] = []
        for path, w in sorted(paths, key=lambda p: -p[1]):
            if w < TREE_MIN_SHARE * total:
                continue
            parent = -1
            for f in path[cut:]:
                key = (parent, f)
                index = ids.get(key)
                if index is None:
                    if len(nodes) >= TREE_NODES:
                        break
                    index = ids[key] = len(nodes)
                    nodes.append({"id": index, "parent": parent, **self.frame(f)})
                    ms.append(0.0)
                ms[index] += w / 1e3
                parent = index
        for node, value in zip(nodes, ms):
            node["ms"] = value
        return nodes


def _covered_between(runs: Coverage, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """How much of each [a_k, b_k] the runs cover (µs), vectorised over k."""
    return np.maximum(0.0, _cumulative(runs, b) - _cumulative(runs, a))


def _cumulative(runs: Coverage, x: np.ndarray) -> np.ndarray:
    """The runs' covered length up to x."""
    if not len(runs.s):
        return np.zeros(len(x))
    k = np.searchsorted(runs.s, x, "right") - 1
    kk = np.clip(k, 0, None)
    inside = np.clip(x - runs.s[kk], 0.0, runs.e[kk] - runs.s[kk])
    return np.where(k >= 0, runs.cum[kk] + inside, 0.0)


def _top(weights: dict, total: float) -> tuple[list, float]:
    """The heaviest entries, until TOP or LISTED_SHARE of the total; and what the rest hold."""
    ranked = sorted(weights.items(), key=lambda kv: -kv[1])
    listed, held = [], 0.0
    for key, w in ranked:
        if len(listed) >= TOP or (total > 0 and held >= LISTED_SHARE * total):
            break
        listed.append((key, w))
        held += w
    return listed, total - held


def attribute_idle(
    rows: list[dict], busy: Coverage, stacks: HostStacks, base_us: float, device: bool, bound: Coverage | None = None
) -> None:
    """Each stage row (the units where the file has no stage row: a window sampled by its units) gains the fields of
    ROW_FIELDS, from the stacks sampled beside its file (`device`: the trace records a device's work; `bound`: its
    launch-bound gaps, which `launch_frames` splits by frame)."""
    attribution = IdleAttribution(stacks, busy, base_us, device, bound)
    if not len(attribution.t):
        return
    stage_rows = [r for r in rows if r.get("unit") is None]
    for row in stage_rows if any(r.get("stage") for r in stage_rows) else rows:
        if row.get("start_us") is not None and row.get("wall_ms"):
            row.update(attribution.row(row))


def merged(units: list[dict]) -> dict:
    """The fields of ROW_FIELDS for a stage row made of its units (analyze/document.py): the frames, libraries,
    trees and host times summed by what they name, the shares taken again of the units' idle."""
    held = [u for u in units if "idle_frames" in u]
    if not held:
        return {}
    idle_ms = sum(u.get("idle_ms") or 0.0 for u in held)
    keys = ("function", "file", "line", "library", "inside")
    frames: dict = defaultdict(float)
    launch: dict = defaultdict(float)
    for u in held:
        for f in u["idle_frames"]:
            frames[tuple(f[k] for k in keys)] += f["ms"]
        for f in u.get("launch_frames", ()):
            launch[tuple(f[k] for k in keys)] += f["ms"]
    listed, rest = _top(frames, sum(frames.values()))
    bound_ms = sum(u.get("launch_bound_ms") or 0.0 for u in held)
    libraries: dict = defaultdict(float)
    host: dict = {}
    for u in held:
        for lib, v in u["idle_libraries"].items():
            libraries[lib] += v
        for kind, site in u["host_time"].items():
            if kind not in host or site["ms"] > host[kind]["top_ms"]:
                host[kind] = {**site, "top_ms": site["ms"], "ms": host.get(kind, {}).get("ms", 0.0)}
            host[kind]["ms"] += site["ms"]
    return {
        "idle_frames": [
            {**dict(zip(keys, key)), "ms": ms, "share": ms / idle_ms if idle_ms > 0 else 0.0} for key, ms in listed
        ],
        **(
            {
                "launch_frames": [
                    {**dict(zip(keys, key)), "ms": ms, "share": ms / bound_ms if bound_ms > 0 else 0.0}
                    for key, ms in _top(launch, 0.0)[0]
                ]
            }
            if launch
            else {}
        ),
        "idle_frames_rest_ms": rest + sum(u["idle_frames_rest_ms"] for u in held),
        "idle_unattributed_ms": sum(u["idle_unattributed_ms"] for u in held),
        "idle_libraries": dict(sorted(libraries.items(), key=lambda kv: -kv[1])),
        "idle_tree": _merged_trees([u["idle_tree"] for u in held]),
        "host_time": {k: {f: v for f, v in site.items() if f != "top_ms"} for k, site in host.items()},
        "host_samples": sum(u["host_samples"] for u in held),
    }


SAID_FRAMES = 3  # the idle finding names this many frames


def idle_said(rows: list[dict]) -> dict:
    """What the idle finding says of a stage's rows that carry frames: its top frames (share of their idle) and the
    share no sample was near (unattributed); {} where none carries frames."""
    m = merged(rows)
    if not m:
        return {}
    idle_ms = sum(r.get("idle_ms") or 0.0 for r in rows if "idle_frames" in r)
    keep = ("function", "file", "line", "library", "inside", "share")
    return {
        "frames": [{k: f[k] for k in keep} for f in m["idle_frames"][:SAID_FRAMES]],
        "unattributed_share": m["idle_unattributed_ms"] / idle_ms if idle_ms > 0 else 0.0,
    }


def _merged_trees(trees: list[list[dict]]) -> list[dict]:
    """Icicles merged by the path of frames to each node."""
    out: list[dict] = []
    ids: dict = {}
    for tree in trees:
        local: dict = {}
        for node in tree:
            parent = local.get(node["parent"], -1)
            key = (parent, node["function"], node["file"], node["line"])
            index = ids.get(key)
            if index is None:
                index = ids[key] = len(out)
                out.append({**node, "id": index, "parent": parent, "ms": 0.0})
            out[index]["ms"] += node["ms"]
            local[node["id"]] = index
    return out

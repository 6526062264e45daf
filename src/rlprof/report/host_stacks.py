"""The host's stacks in what rlprof draws: in the report, an icicle of each stage's idle time by the host's Python
frames (the stacks the stage thread was in while nothing ran: analyze/window/idle_frames.py) and each stage's top
frames as a table (stages whose windows carry no host stacks are left out; a page without any has no such section);
in `rlprof slice`, the sampled stacks of the window's threads as flame-chart tracks Perfetto shows beside the trace."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from ..analyze.inputs.host_stacks_file import read_host_stacks
from ..analyze.window.idle_frames import REACH, REACH_MIN_US, merged
from .charts import _layout, esc
from .fragments import table

TOP_FRAMES = 8  # frames listed per stage


def _by_stage(doc: dict) -> dict[tuple, list[dict]]:
    out: dict = defaultdict(list)
    for r in doc["rows"]:
        if r.get("unit") is None and r.get("idle_tree"):
            out[(r.get("role"), r.get("stage"))].append(r)
    return dict(sorted(out.items(), key=lambda kv: -sum(r["idle_ms"] for r in kv[1])))


def has_idle_frames(doc: dict) -> bool:
    return bool(_by_stage(doc))


def idle_icicle(doc: dict) -> dict | None:
    """One icicle: the root is the idle of every stage with host stacks, a stage under it, then its frames from the
    outermost the stage's windows do not all share, each as wide as the idle time under it (summed over windows)."""
    stages = _by_stage(doc)
    if not stages:
        return None
    ids, labels, parents, values, hover = ["idle"], ["idle"], [""], [0.0], ["all the stages' idle"]
    for (role, stage), rows in stages.items():
        tree = merged(rows)["idle_tree"]
        key = f"{role}/{stage}"
        total = sum(n["ms"] for n in tree if n["parent"] == -1)
        ids.append(key)
        labels.append(esc(key))
        parents.append("idle")
        values.append(total)
        hover.append(f"{key}: {total:.1f} ms of idle with a sample, over {len(rows)} window(s)")
        values[0] += total
        for n in tree:
            ids.append(f"{key}#{n['id']}")
            labels.append(f"{esc(n['function'])}<br>{esc(n['file'])}:{n['line']}")
            parents.append(key if n["parent"] == -1 else f"{key}#{n['parent']}")
            values.append(n["ms"])
            hover.append(f"{n['function']} ({n['file']}:{n['line']}, {n['library']}): {n['ms']:.1f} ms")
    return {
        "data": [
            {
                "type": "icicle",
                "ids": ids,
                "labels": labels,
                "parents": parents,
                "values": values,
                "branchvalues": "total",
                "hovertext": [esc(x) for x in hover],
                "hoverinfo": "text",
                "tiling": {"orientation": "v"},
                "maxdepth": 8,
            }
        ],
        "layout": _layout(
            esc(
                "Idle by the host's frames: each stage's idle under the Python frames its thread was in (click to zoom)"
            ),
            margin={"l": 10, "r": 10, "t": 60, "b": 10},
            height=560,
        ),
    }


def idle_frames_html(doc: dict) -> str:
    """Each stage's top frames: where its idle went, with the share no sample was near."""
    parts = []
    for (role, stage), rows in _by_stage(doc).items():
        m = merged(rows)
        idle = sum(r["idle_ms"] for r in rows)
        said = (
            f"{role}/{stage}: {idle:.1f} ms idle over {len(rows)} window(s); "
            f"{m['idle_unattributed_ms'] / idle:.0%} with no host sample near it"
            if idle > 0
            else f"{role}/{stage}"
        )
        records = [
            {**f, "where": f"{f['file']}:{f['line']}", "share": f"{f['share']:.1%}"}
            for f in m["idle_frames"][:TOP_FRAMES]
        ]
        columns = [
            ("function", "frame"),
            ("where", "file:line"),
            ("library", "library"),
            ("inside", "inside"),
            ("ms", "ms"),
            ("share", "share"),
        ]
        parts.append(f'<p class="note">{esc(said)}</p>' + table(records, columns, limit=TOP_FRAMES))
    return "".join(parts)


STACKS_PID = 980_000  # the host stacks' own process in a sliced trace, beside the host, the device and the samples


def stack_tracks(trace: Path, lo: float, hi: float, base_us: float) -> list[dict]:
    """The host's stacks sampled beside `trace` between lo and hi (the trace's clock), one track per thread (the
    stage's first): each frame a span from the first sample that holds it at that depth to the last, as a flame
    chart; a gap with no sample longer than a sample stands for (analyze/window/idle_frames.py's reach) ends them."""
    stacks = read_host_stacks(trace)
    if stacks is None:
        return []
    reach = max(REACH * stacks.interval_us, REACH_MIN_US)
    stage = stacks.stage_thread()
    order = sorted(range(len(stacks.threads)), key=lambda i: (i != stage, i))
    by_thread: dict = defaultdict(list)
    s = stacks.samples
    for t, thread, node in zip(s.t_us, s.thread, s.stack):
        t -= base_us
        if lo - reach <= t <= hi + reach:
            by_thread[thread].append((t, node))
    out: list[dict] = [{"ph": "M", "name": "process_name", "pid": STACKS_PID, "args": {"name": "host stacks (rlprof)"}}]
    for rank, thread in enumerate(order):
        samples = sorted(by_thread.get(thread, ()))
        if not samples:
            continue
        info = stacks.threads[thread]
        name = info.name + (" (the stage's thread)" if thread == stage else "")
        tid = info.native_id or thread
        out.append({"ph": "M", "name": "thread_name", "pid": STACKS_PID, "tid": tid, "args": {"name": name}})
        out.append(
            {"ph": "M", "name": "thread_sort_index", "pid": STACKS_PID, "tid": tid, "args": {"sort_index": rank}}
        )
        out += _flame(stacks, samples, tid, lo, hi, reach)
    return out if len(out) > 1 else []


def _flame(stacks, samples: list[tuple[float, int]], tid: int, lo: float, hi: float, reach: float) -> list[dict]:
    """Spans of the frames the samples hold, merged while a frame stays at its depth under the same callers."""
    out: list[dict] = []
    open_spans: list[tuple[int, float]] = []  # (frame, start) outermost first
    last = None

    def close(depth: int, end: float) -> None:
        while len(open_spans) > depth:
            frame, start = open_spans.pop()
            end = min(end, hi)
            if end <= start:  # before the slice began: nothing of it inside
                continue
            module, file, line, function, _ = stacks.frames[frame]
            out.append(
                {
                    "ph": "X",
                    "cat": "rlprof_host_stack",
                    "name": function,
                    "pid": STACKS_PID,
                    "tid": tid,
                    "ts": start,
                    "dur": end - start,
                    "args": {"file": file, "line": line, "module": module},
                }
            )

    for t, node in samples:
        if last is not None and t - last > 2 * reach:
            close(0, last + reach)
        path = stacks.frames_of(node)[::-1]
        same = 0
        while same < min(len(path), len(open_spans)) and open_spans[same][0] == path[same]:
            same += 1
        start = max(lo, t if last is None or t - last > 2 * reach else (last + t) / 2)
        close(same, start)
        open_spans.extend((f, start) for f in path[same:])
        last = t
    if last is not None:
        close(0, min(hi, last + reach))
    return out

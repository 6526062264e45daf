"""Analysing one input: a Kineto trace (whole or in byte ranges), an Ascend collection or a memory snapshot ->
its rows, operators, collectives, launch overhead and memory (small: safe to send between processes). Whatever
goes wrong inside one input is that input's warning. The background analysis's cached result is reused here."""

from __future__ import annotations

from pathlib import Path

import msgspec

from ...errors import AnalyzeError
from ...where import this_process
from .breakdown import Breakdown, OverlapBreakdown, framework_ranges, stage_of_events, window_rows
from .idle_frames import attribute_idle
from ..inputs.host_stacks_file import read_host_stacks
from ..tables.schema import SCHEMA_VERSION
from ..inputs.hardware import hardware_record
from ..inputs.manifest import LOAD_KEYS
from .ops import (
    LaunchGaps,
    collectives,
    device_capacities,
    launch_overhead,
    memory,
    top_ops,
    unit_signatures,
    with_device_record,
)
from ..inputs.readers.kineto import NotATrace, read_kineto, stream_size
from ..tables.table import release_free_memory

SPLIT_BYTES = 32 << 20  # a plain trace this large is read in byte ranges by several workers
RANGE_BYTES = 64 << 20  # at most this much per range: bounds what a worker holds


def analyze_file(
    path: Path, meta: dict, top: int | None = 50, by_shape: bool = False, map_ranges=None, workers: int = 1
) -> dict:
    """Everything rlprof reports about one trace file (small: safe to send between processes).
    Operators and collectives are per stage window; `top` bounds the operators kept per window.
    With `map_ranges` (a map over worker processes or Ray tasks), a large plain trace is read in byte ranges."""
    from ..inputs.readers.ascend import is_ascend

    if is_ascend(Path(path)):
        return analyze_ascend(Path(path), meta, top)
    if str(path).endswith(".pickle"):
        return analyze_snapshot(Path(path), meta)
    try:
        trace = read_kineto(path, shapes=by_shape, map_ranges=map_ranges, parts=range_count(path, workers))
    except NotATrace as exc:
        return failed(path, exc)
    if not len(trace.table):
        if trace.partial:  # damage before the first event: said as such, never taken for an empty window
            return {**failed(path, NotATrace(trace.warnings[0])), "warnings": trace.warnings}
        return {
            **failed(path, NotATrace(f"{path.name} holds no events (an empty collection window)")),
            "input": {"path": str(path), "kind": "kineto", "events": 0, "partial": False, "rank": meta.get("rank")},
        }
    info = dict(trace.meta.rlprof or {})
    info.update({k: v for k, v in meta.items() if v is not None})
    info.setdefault("rank", trace.rank)
    info["file"] = path.name
    device = trace.has_device
    rows = window_rows(trace.table, device, info)
    release_free_memory()  # attribution by launch's sorted device columns, before the next phase's arrays
    if trace.partial:
        unknown_time(rows)
    tag = _window_tag(info, path)
    groups, windows = stage_of_events(trace.table, rows)
    unit_signatures(trace.table, rows)
    release_free_memory()
    launch = {**tag, **launch_overhead(trace.table)} if device else None
    gaps = LaunchGaps(trace.table) if device else None
    if gaps is not None:
        for row in rows:  # the device's idle gaps inside each window, and how many of them waited on a launch
            if row.get("start_us") is not None:
                row.update(gaps.within(row["start_us"], row["start_us"] + row["wall_ms"] * 1e3))
        if gaps.span:
            launch.update(device_span_ms=(gaps.span[1] - gaps.span[0]) / 1e3, **gaps.within(*gaps.span))
    stacks = read_host_stacks(path)
    if stacks is not None:  # the host's stacks sampled beside the window: each row's idle (and launch gaps) by frame
        base_us = (trace.meta.baseTimeNanoseconds or 0) / 1e3
        bound = gaps.bound_runs() if gaps is not None else None
        attribute_idle(rows, Breakdown(trace.table, device).busy, stacks, base_us, device, bound)
    del gaps  # before the operator tables: its prefix sums are 40 bytes a device gap
    release_free_memory()
    return {
        "input": {
            "path": str(path),
            "kind": "kineto",
            "events": len(trace.table),
            "device": device,
            "rank": info.get("rank"),
            "partial": trace.partial,
            "bytes_read": trace.bytes_read,
            **({"clock_base_ns": trace.meta.baseTimeNanoseconds} if trace.meta.baseTimeNanoseconds else {}),
            "window_status": meta.get("status"),
            "window_bytes": meta.get("bytes"),
            "tool": info.get("tool"),
            "step": info.get("step"),
            **{k: info.get(k) for k in LOAD_KEYS},
            "hardware": hardware_record(info.get("device"), trace.meta.deviceProperties),
        },
        "warnings": trace.warnings,
        "model": info.get("model"),  # the model its collector recorded (an engine's), where one did
        "rows": rows,
        "ops": _tagged(top_ops(trace.table, top, groups, by_shape), tag, windows),
        "collectives": _tagged(collectives(trace.table, device, groups), tag, windows),
        "launch": launch,
        "memory": {
            **tag,
            **with_device_record(
                memory(trace.table, capacities=device_capacities(trace.meta.deviceProperties)),
                info.get("device_memory"),
            ),
        },
    }


def unknown_time(rows: list[dict]) -> None:
    """A partial trace's windows: what the events kept leave uncovered is idle or the lost events' time, which
    the file no longer says; so idle is its lower bound (0) and that time is `unknown_ms` (docs/bad_input.md).
    Every other bucket is already a lower bound of the whole file's (the kept events' union)."""
    for row in rows:
        row["unknown_ms"], row["idle_ms"] = row["idle_ms"], 0.0


def _tagged(records: list[dict], tag: dict, windows: list[dict]) -> list[dict]:
    """Per-window records get their window's step/role/stage; those outside any window the file's."""
    out = []
    for rec in records:
        g = rec.pop("group", -1)
        where = {k: windows[g][k] for k in ("step", "role", "stage")} if g >= 0 else {}
        out.append({**tag, **where, **rec})
    return out


def range_count(path: Path, workers: int) -> int:
    """How many byte ranges to read a trace in: none below SPLIT_BYTES; else a multiple of the workers (balanced)
    with ranges of at most RANGE_BYTES (what one worker holds at a time). A gzip trace counts by the size it
    inflates to (its trailer's, where the file is one member under 4 GB)."""
    try:
        size = stream_size(Path(path))
    except OSError:
        return 1
    if workers <= 1 or size < SPLIT_BYTES:
        return 1
    return workers * -(-size // (workers * RANGE_BYTES))


def run_job(job, map_ranges=None, workers: int = 1):
    """One input; whatever goes wrong inside it is that file's warning, and the directory goes on. A window the
    background analysis already analysed with the same parameters is not read again. Records where it ran."""
    path, meta, top, by_shape = job
    meta = {k: v for k, v in meta.items() if k != "where"}  # where the file was written: placement, not input
    try:
        result = cached_analysis(path, meta, top, by_shape)
        reused = result is not None
        if reused:
            result["input"]["path"] = str(path)  # as given now (the background analysis saw it absolute)
        else:
            result = analyze_file(path, meta, top, by_shape, map_ranges=map_ranges, workers=workers)
    except (NotATrace, AnalyzeError):
        raise
    except (
        ValueError,
        TypeError,
        KeyError,
        IndexError,
        OSError,
        RecursionError,
        UnicodeDecodeError,
        msgspec.DecodeError,
    ) as exc:
        result, reused = failed(path, NotATrace(f"{path}: unreadable ({type(exc).__name__}: {exc})")), False
    result["input"]["analysed_on"] = {**this_process(), "reused": reused}
    return result


def cache_path(trace: Path) -> Path:
    """Where the background analysis (`analysis: true`) keeps one window's tables: next to its trace."""
    return trace.with_name(trace.name.split(".")[0] + ".analysis.json")


def cache_key(meta: dict, top: int | None, by_shape: bool) -> dict:
    return {"schema_version": SCHEMA_VERSION, "meta": meta, "top": top, "by_shape": by_shape}


def cached_analysis(path: Path, meta: dict, top: int | None, by_shape: bool) -> dict | None:
    """The background analysis of this window, when it was made from this trace with these parameters."""
    import json

    cache = cache_path(Path(path))
    try:
        if cache == Path(path) or cache.stat().st_mtime < Path(path).stat().st_mtime:
            return None
        doc = json.loads(cache.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.pop("cache", None) != json.loads(json.dumps(cache_key(meta, top, by_shape))):
        return None
    return doc


def analyze_ascend(path: Path, meta: dict, top: int | None = 50) -> dict:
    """One Ascend output (text or db export): rows per mstx stage range, else per recorded step, else the
    whole device timeline; operators and collectives from the device tasks; memory where recorded."""
    from ..inputs.readers.ascend import read_ascend

    try:
        trace = read_ascend(path, meta.get("export"))
    except NotATrace as exc:
        return failed(path, exc)
    except (ValueError, TypeError, OverflowError) as exc:  # a value of the wrong type in a table
        return failed(path, NotATrace(f"{path}: unreadable value in its Ascend output ({exc})"))
    info = {k: v for k, v in meta.items() if v is not None}
    info.setdefault("rank", trace.rank)
    info.update(file=path.name, kind="ascend", step_spans=trace.step_spans)
    tag = _window_tag(info, path)
    table = trace.table
    lanes = OverlapBreakdown(trace.overlap) if trace.overlap else None
    span = lanes.span if lanes else None
    base = {
        "role": info.get("role"),
        "stage": info.get("stage"),
        "rank": info.get("rank"),
        "replica": info.get("replica"),
        "file": path.name,
        "unit": None,
        "index": None,
    }
    if framework_ranges(table, info):
        rows = window_rows(table, True, info, lanes, span=span)
    elif trace.step_spans and lanes:  # a step's device time, as the Ascend step trace counts it
        rows = [
            {**base, "step": step, "start_us": lo, **lanes.window(lo, hi)}
            for step, lo, hi in (lanes.extent(*s) for s in trace.step_spans)
            if hi > lo
        ]
    elif trace.steps:
        rows = [{**base, "start_us": None, **s} for s in trace.steps]
    else:
        rows = window_rows(table, True, info, lanes, span=span)
    groups, windows = stage_of_events(table, rows)
    mem = with_device_record(memory(table), meta.get("device_memory")) if len(table.memory) else None
    for row in rows:  # back to epoch µs, as every other reader (the windows are these same rows)
        for key in ("start_us", "host_start_us", "device_start_us"):
            if row.get(key) is not None:
                row[key] += trace.origin_us
    for point in mem["timeline"] if mem else ():
        point[0] += trace.origin_us
    return {
        "input": {
            "path": str(path),
            "kind": "ascend",
            "export": trace.export,
            "files": trace.files,
            # the whole device timeline, first to last task: what the Ascend tools' overall numbers cover
            "device_totals": lanes.window(*span) if span else None,
            # the same from the first to the last device task of any kind (the runtime's input copies and
            # waits before the first operator too), as msprof-analyze's db comparison counts its E2E
            "device_totals_all_tasks": lanes.window(*trace.task_span) if trace.task_span else None,
            "events": max(len(table), len(trace.steps)),
            "device": True,
            "rank": info.get("rank"),
            "partial": trace.partial,
            "bytes_read": 0,
            "hardware": hardware_record(meta.get("device")),
        },
        "warnings": trace.warnings,
        "rows": rows,
        "ops": _tagged(top_ops(table, top, groups), tag, windows),
        "collectives": _tagged(collectives(table, True, groups), tag, windows),
        "launch": None,
        "memory": {**tag, **mem} if mem else None,
    }


def failed(path: Path, exc: Exception) -> dict:
    return {
        "input": {"path": str(path), "events": 0, "partial": True, "error": str(exc)},
        "warnings": [str(exc)],
        "rows": [],
        "ops": [],
        "collectives": [],
        "launch": None,
        "memory": None,
    }


def analyze_snapshot(path: Path, meta: dict) -> dict:
    from ..inputs.readers.memory_snapshot import read_snapshot, snapshot_memory

    try:
        mem = with_device_record(snapshot_memory(read_snapshot(path)), meta.get("device_memory"), snapshot=True)
    except NotATrace as exc:
        return failed(path, exc)
    tag = {k: meta.get(k) for k in ("rank", "step", "role", "stage")} | {"file": path.name}
    return {
        "input": {
            "path": str(path),
            "kind": "memory_snapshot",
            "events": len(mem["timeline"]),
            "device": True,
            "rank": meta.get("rank"),
            "partial": False,
            "bytes_read": path.stat().st_size,
        },
        "warnings": [],
        "rows": [],
        "ops": [],
        "collectives": [],
        "launch": None,
        "memory": {**tag, **mem},
    }


def _window_tag(info: dict, path: Path) -> dict:
    """What every record of one file's windows carries: the window it belongs to and the file."""
    return {k: info.get(k) for k in ("rank", "step", "role", "stage")} | {"file": path.name}

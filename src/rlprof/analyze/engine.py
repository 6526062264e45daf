"""`rlprof analyze`: inputs -> per-file analysis (in parallel) -> one analysis document."""

from __future__ import annotations

import gc
import multiprocessing
import os
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import msgspec

from ..errors import RLProfError
from .breakdown import BUCKETS, framework_ranges, order_key, stage_of_events, window_rows
from .findings import findings
from .ops import collectives, launch_overhead, memory, top_ops, unit_signatures
from .readers.kineto import NotATrace, read_kineto, stream_size
from ..where import this_process
from .table import release_free_memory

SCHEMA_VERSION = 1
SPLIT_BYTES = 32 << 20  # a plain trace this large is read in byte ranges by several workers
RANGE_BYTES = 64 << 20  # at most this much per range: bounds what a worker holds
TRACE_SUFFIXES = (".json", ".json.gz", ".pickle")


class AnalyzeError(RLProfError):
    pass


def find_inputs(path: str | Path) -> list[tuple[Path, dict]]:
    """(trace file, manifest metadata) pairs for a run directory, a manifest, or one trace."""
    from .manifest import manifest_inputs

    path = Path(path)
    if not path.exists():
        raise AnalyzeError(f"{path} does not exist; allowed: a run directory, a manifest.jsonl or a trace file")
    if path.is_file() and path.name.endswith(".jsonl"):
        return manifest_inputs(path)
    if path.is_file():
        return [(path, {})]
    if (path / "manifest.jsonl").exists():
        return manifest_inputs(path / "manifest.jsonl")
    from .mindspeed_output import unparsed, unparsed_message
    from .readers.ascend import is_ascend

    if path.name.endswith("_ascend_pt") or path.name == "ASCEND_PROFILER_OUTPUT":
        return [(path, {})]
    ascend = ascend_collections(path)
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(TRACE_SUFFIXES)
                   and not p.name.endswith((".summary.json", "analysis.json"))
                   and not any(a in p.parents for a in ascend) and p.name != "trace_view.json")
    if not ascend and not files and is_ascend(path):
        return [(path, {})]
    raw = unparsed(ascend)
    if raw and len(raw) == len(ascend) and not files:
        raise AnalyzeError(unparsed_message(path, raw, len(ascend)))
    files = [p for p in ascend if p not in raw] + files
    if not files:
        raise AnalyzeError(f"{path} holds no trace files (*.json, *.json.gz), no Ascend output and no "
                           "manifest.jsonl")
    return directory_inputs(path, files)


def ascend_collections(path: Path) -> list[Path]:
    return sorted(p for p in Path(path).rglob("*_ascend_pt") if p.is_dir())


def directory_inputs(root: Path, files: list[Path]) -> list[tuple[Path, dict]]:
    """Files of a directory without a manifest; those verl's profiler named carry its step/role/stage/rank, those
    torch's or torch_npu's handlers named carry the host that wrote them (where --ray analyses them)."""
    from ..frameworks.torch_profiler import host_of
    from .mindspeed_output import dir_meta
    from .verl_output import file_meta, number_units

    inputs = [(p, file_meta(p, root) or dir_meta(p) or {}) for p in files]
    number_units(inputs)
    for p, meta in inputs:
        host = host_of(p)
        if host:
            meta["where"] = {"host": host, "node_id": None}
    return inputs


def analyze_file(path: Path, meta: dict, top: int | None = 50, by_shape: bool = False, map_ranges=None,
                 workers: int = 1) -> dict:
    """Everything rlprof reports about one trace file (small: safe to send between processes).
    Operators and collectives are per stage window; `top` bounds the operators kept per window.
    With `map_ranges` (a map over worker processes or Ray tasks), a large plain trace is read in byte ranges."""
    from .readers.ascend import is_ascend

    if is_ascend(Path(path)):
        return analyze_ascend(Path(path), meta, top)
    if str(path).endswith(".pickle"):
        return analyze_snapshot(Path(path), meta)
    try:
        trace = read_kineto(path, shapes=by_shape, map_ranges=map_ranges, parts=range_count(path, workers))
    except NotATrace as exc:
        return _failed(path, exc)
    if not len(trace.table):
        return {**_failed(path, NotATrace(f"{path.name} holds no events (an empty collection window)")),
                "input": {"path": str(path), "kind": "kineto", "events": 0, "partial": False, "rank": meta.get("rank")}}
    info = dict(trace.meta.rlprof or {})
    info.update({k: v for k, v in meta.items() if v is not None})
    info.setdefault("rank", trace.rank)
    info["file"] = path.name
    device = trace.has_device
    rows = window_rows(trace.table, device, info)
    tag = {"rank": info.get("rank"), "step": info.get("step"), "role": info.get("role"),
           "stage": info.get("stage"), "file": path.name}
    groups, windows = stage_of_events(trace.table, rows)
    unit_signatures(trace.table, rows)
    release_free_memory()
    return {
        "input": {"path": str(path), "kind": "kineto", "events": len(trace.table), "device": device,
                  "rank": info.get("rank"), "partial": trace.partial, "bytes_read": trace.bytes_read,
                  "window_status": meta.get("status"), "window_bytes": meta.get("bytes"), "tool": info.get("tool")},
        "warnings": trace.warnings,
        "rows": rows,
        "ops": _tagged(top_ops(trace.table, top, groups, by_shape), tag, windows),
        "collectives": _tagged(collectives(trace.table, device, groups), tag, windows),
        "launch": {**tag, **launch_overhead(trace.table)} if device else None,
        "memory": {**tag, **memory(trace.table)},
    }


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


def _run(job, map_ranges=None, workers: int = 1):
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
    except (ValueError, TypeError, KeyError, IndexError, OSError, RecursionError, UnicodeDecodeError,
            msgspec.DecodeError) as exc:
        result, reused = _failed(path, NotATrace(f"{path}: unreadable ({type(exc).__name__}: {exc})")), False
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


def analyze(path: str | Path, *, workers: int | None = None, use_ray: bool = False, progress=None,
            top: int | None = 50, by_shape: bool = False) -> dict:
    """`top`: operators kept per window (None: all, as compare needs); `by_shape`: keep input shapes."""
    return analyze_each([path], workers=workers, use_ray=use_ray, progress=progress, top=top, by_shape=by_shape)[0]


def analyze_each(paths: list, *, workers: int | None = None, use_ray: bool = False, progress=None,
                 top: int | None = 50, by_shape: bool = False) -> list[dict]:
    """One analysis document per path, their files scheduled together (compare's two sides share the cores)."""
    if use_ray:  # the inputs are listed by the nodes that hold them
        from .distributed import analyze_on_cluster

        docs = []
        for path in paths:
            results, warnings = analyze_on_cluster(str(path), top, by_shape, progress)
            docs.append(document(path, results, warnings))
        return docs
    side_inputs = [[(p, meta, top, by_shape) for p, meta in find_inputs(path)] for path in paths]
    results = run_inputs([job for inputs in side_inputs for job in inputs], workers or os.cpu_count() or 1,
                         progress)
    docs, at = [], 0
    for path, inputs in zip(paths, side_inputs):
        docs.append(document(path, results[at:at + len(inputs)]))
        at += len(inputs)
    return docs


def run_inputs(inputs: list, cores: int, progress=None) -> list[dict]:
    """Per-file results, in input order: in this process (one core, or one small file), a file's byte ranges
    over every core (fewer files than cores, large ones), else one file per worker process."""
    split = len(inputs) < cores and any(range_count(job[0], cores) > 1 for job in inputs)
    results = []
    if split or cores == 1 or len(inputs) == 1:
        for job in inputs:
            results.append(_run(job, partial(_pool_map, cores), cores) if split else _run(job))
            if progress:
                progress()
        return results
    with _pool(min(len(inputs), cores)) as pool:
        for res in pool.map(_run, inputs):
            results.append(res)
            if progress:
                progress()
    return results


def document(path, results: list[dict], warnings: list[str] = ()) -> dict:
    """The analysis document of one path from its per-file results."""
    doc = {"schema_version": SCHEMA_VERSION, "inputs": [], "warnings": [], "partial": False, "rows": [], "ops": [],
           "collectives": [], "launch": [], "memory": []}
    for res in results:
        doc["inputs"].append(res["input"])
        doc["warnings"].extend(res["warnings"])
        doc["partial"] |= bool(res["input"].get("partial"))
        for key in ("rows", "ops", "collectives"):
            doc[key].extend(res[key])
        for key in ("launch", "memory"):
            if res[key] is not None:
                doc[key].append(res[key])
    doc["warnings"].extend(warnings)
    if Path(path).exists():
        doc["warnings"].extend(_unparsed_warning(path) + _dangling_links(path))
    doc["warnings"].extend(_same_window_twice(doc["rows"]))
    doc["rows"].extend(stage_rows_from_units(doc["rows"]))
    if not doc["rows"] and not any(m.get("peak_bytes") is not None for m in doc["memory"]):
        raise AnalyzeError("nothing could be read: " + "; ".join(doc["warnings"][:3]))
    doc["rows"].sort(key=lambda r: (order_key(r["step"]), order_key(r["rank"]), r["start_us"] or 0))
    doc["findings"] = findings(doc)
    return doc


@contextmanager
def _pool(n: int):
    """Worker processes; forked where the platform can (they start in milliseconds with rlprof imported).
    This process's objects are frozen out of the collector meanwhile: a collection in a worker would otherwise
    walk every inherited object, copying each page it touches (measured: 0.2 s on a 300 MB trace)."""
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
    gc.freeze()
    try:
        with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context(method)) as pool:
            yield pool
    finally:
        gc.unfreeze()


def _pool_map(n: int, fn, jobs):
    """`fn` over `jobs` (any iterable, taken lazily: at most n + 1 in flight) on `n` fresh worker processes, results
    in order. The workers exit once the last result is taken (or the reader stops early), before the table is
    built and analysed: they never hold memory during the analysis's own peak."""
    with _pool(n) as pool:
        pending: deque = deque()
        for job in jobs:
            pending.append(pool.submit(fn, job))
            if len(pending) > n:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _same_window_twice(rows: list[dict]) -> list[str]:
    """Two files that hold the same (step, role, stage, rank) window: a copied rank, or two runs in one directory.
    Both are analysed (each is a real file), so per-rank means count that rank twice: said, naming both."""
    first: dict[tuple, str] = {}
    pairs: dict[tuple, None] = {}
    for r in rows:
        if r.get("unit") is not None or r.get("file") is None:
            continue
        key = (str(r.get("step")), r.get("role"), r.get("stage"), str(r.get("rank")), str(r.get("replica")))
        seen = first.setdefault(key, r["file"])
        if seen != r["file"]:
            pairs[(seen, r["file"], key[3])] = None
    return [f"{a} and {b} hold the same windows (rank {rank}, same steps and stages): a copied file or two runs in "
            "one directory? both are counted" for a, b, rank in pairs]


def _dangling_links(path) -> list[str]:
    """Trace-named links in a run directory whose target is gone: named, not skipped in silence."""
    path = Path(path)
    if not path.is_dir():
        return []
    return [f"{p}: a link to {os.readlink(p)}, which does not exist; skipped" for p in sorted(path.rglob("*"))
            if p.name.endswith(TRACE_SUFFIXES) and p.is_symlink() and not p.exists()]


def _unparsed_warning(path) -> list[str]:
    from .mindspeed_output import unparsed, unparsed_message

    path = Path(path)
    if not path.is_dir():
        return []
    ascend = ascend_collections(path)
    raw = unparsed(ascend)
    return [unparsed_message(path, raw, len(ascend))] if raw else []


def stage_rows_from_units(rows: list[dict]) -> list[dict]:
    """A stage collected one unit per file (verl's discrete train_batch traces) has no stage row of its own:
    make one per (step, role, stage, rank) that sums its units' buckets (the time between files is unseen)."""
    have = {(r["step"], r["role"], r["stage"], r["rank"]) for r in rows if r["unit"] is None}
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        key = (r["step"], r["role"], r["stage"], r["rank"])
        if r["unit"] is not None and r["stage"] and key not in have:
            groups.setdefault(key, []).append(r)
    out = []
    for units in groups.values():
        first = min(units, key=lambda r: r["start_us"] or 0)
        sums = {b: sum(r[b] for r in units) for b in BUCKETS}
        out.append({**first, "unit": None, "index": None, "file": None, "units_only": len(units), **sums})
    return out


def analyze_ascend(path: Path, meta: dict, top: int | None = 50) -> dict:
    """One Ascend output (text or db export): rows per mstx stage range, else per recorded step, else the
    whole device timeline; operators and collectives from the device tasks; memory where recorded."""
    from .readers.ascend import OverlapBreakdown, read_ascend

    try:
        trace = read_ascend(path, meta.get("export"))
    except NotATrace as exc:
        return _failed(path, exc)
    except (ValueError, TypeError, OverflowError) as exc:  # a value of the wrong type in a table
        return _failed(path, NotATrace(f"{path}: unreadable value in its Ascend output ({exc})"))
    info = {k: v for k, v in meta.items() if v is not None}
    info.setdefault("rank", trace.rank)
    info.update(file=path.name, kind="ascend", step_spans=trace.step_spans)
    tag = {"rank": info.get("rank"), "step": info.get("step"), "role": info.get("role"),
           "stage": info.get("stage"), "file": path.name}
    table = trace.table
    lanes = OverlapBreakdown(trace.overlap) if trace.overlap else None
    span = lanes.span if lanes else None
    base = {"role": info.get("role"), "stage": info.get("stage"), "rank": info.get("rank"),
            "replica": info.get("replica"), "file": path.name, "unit": None, "index": None}
    if framework_ranges(table, info):
        rows = window_rows(table, True, info, lanes, span=span)
    elif trace.step_spans and lanes:  # a step's device time, as the Ascend step trace counts it
        rows = [{**base, "step": step, "start_us": lo, **lanes.window(lo, hi)}
                for step, lo, hi in (lanes.extent(*s) for s in trace.step_spans) if hi > lo]
    elif trace.steps:
        rows = [{**base, "start_us": None, **s} for s in trace.steps]
    else:
        rows = window_rows(table, True, info, lanes, span=span)
    groups, windows = stage_of_events(table, rows)
    mem = memory(table) if len(table.memory) else None
    for row in rows:  # back to epoch µs, as every other reader (the windows are these same rows)
        if row["start_us"] is not None:
            row["start_us"] += trace.origin_us
    for point in mem["timeline"] if mem else ():
        point[0] += trace.origin_us
    return {
        "input": {"path": str(path), "kind": "ascend", "export": trace.export, "files": trace.files,
                  # the whole device timeline, first to last task: what the Ascend tools' overall numbers cover
                  "device_totals": lanes.window(*span) if span else None,
                  # the same from the first to the last device task of any kind (the runtime's input copies and
                  # waits before the first operator too), as msprof-analyze's db comparison counts its E2E
                  "device_totals_all_tasks": lanes.window(*trace.task_span) if trace.task_span else None,
                  "events": max(len(table), len(trace.steps)), "device": True,
                  "rank": info.get("rank"), "partial": trace.partial, "bytes_read": 0},
        "warnings": trace.warnings,
        "rows": rows,
        "ops": _tagged(top_ops(table, top, groups), tag, windows),
        "collectives": _tagged(collectives(table, True, groups), tag, windows),
        "launch": None,
        "memory": {**tag, **mem} if mem else None,
    }


def _failed(path: Path, exc: Exception) -> dict:
    return {"input": {"path": str(path), "events": 0, "partial": True, "error": str(exc)}, "warnings": [str(exc)],
            "rows": [], "ops": [], "collectives": [], "launch": None, "memory": None}


def analyze_snapshot(path: Path, meta: dict) -> dict:
    from .readers.memory_snapshot import read_snapshot, snapshot_memory

    try:
        mem = snapshot_memory(read_snapshot(path))
    except NotATrace as exc:
        return _failed(path, exc)
    tag = {k: meta.get(k) for k in ("rank", "step", "role", "stage")} | {"file": path.name}
    return {"input": {"path": str(path), "kind": "memory_snapshot", "events": len(mem["timeline"]), "device": True,
                      "rank": meta.get("rank"), "partial": False, "bytes_read": path.stat().st_size},
            "warnings": [], "rows": [], "ops": [], "collectives": [], "launch": None, "memory": {**tag, **mem}}


def is_analysis_file(path: Path) -> bool:
    """An analysis.json written by `rlprof analyze` (rather than a trace)."""
    if not (path.is_file() and path.name.endswith(".json")):
        return False
    with open(path, "rb") as f:
        head = f.read(256)
    return b'"schema_version"' in head and b'"traceEvents"' not in head


def load_analysis(path: str | Path, *, top: int | None = 50, by_shape: bool = False,
                  workers: int | None = None, use_ray: bool = False) -> dict:
    """An analysis document from anything `rlprof analyze` reads, or from its analysis.json."""
    path = Path(path)
    if is_analysis_file(path):
        import json

        doc = json.loads(path.read_text())
        if doc.get("schema_version") != SCHEMA_VERSION or "rows" not in doc:
            raise AnalyzeError(f"{path}: analysis schema {doc.get('schema_version')!r} is not readable; "
                               f"allowed: schema {SCHEMA_VERSION} (re-run rlprof analyze on the traces)")
        if "findings" not in doc:  # written before findings existed
            doc["findings"] = findings(doc)
        return doc
    return analyze(path, workers=workers, top=top, by_shape=by_shape, use_ray=use_ray)

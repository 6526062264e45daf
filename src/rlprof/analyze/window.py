"""Per-window summary written next to a finished window (the analysis-on-collection hook).

A first, real analysis: span, busy time per category, stage and unit ranges, top operators.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path


def _open(path: Path):
    return gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")


def summarize_trace(trace: dict, top: int = 20) -> dict:
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    if not events:
        return {"events": 0, "span_ms": 0.0, "categories": {}, "ranges": [], "top_ops": []}
    t0 = min(float(e["ts"]) for e in events)
    t1 = max(float(e["ts"]) + float(e.get("dur", 0)) for e in events)
    by_cat: dict[str, float] = defaultdict(float)
    ops: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    ranges = []
    for e in events:
        dur = float(e.get("dur", 0))
        name = str(e.get("name", ""))
        by_cat[str(e.get("cat", ""))] += dur
        if name.startswith("rlprof:"):
            ranges.append({"name": name, "start_ms": (float(e["ts"]) - t0) / 1e3, "dur_ms": dur / 1e3})
        elif e.get("cat") in ("cpu_op", "kernel", "gpu_memcpy", "gpu_memset"):
            ops[name][0] += 1
            ops[name][1] += dur
    top_ops = sorted(ops.items(), key=lambda kv: -kv[1][1])[:top]
    return {
        "events": len(events),
        "span_ms": (t1 - t0) / 1e3,
        "categories": {k: v / 1e3 for k, v in sorted(by_cat.items())},
        "ranges": sorted(ranges, key=lambda r: r["start_ms"]),
        "top_ops": [{"name": n, "count": c, "total_ms": t / 1e3} for n, (c, t) in top_ops],
    }


def analyze_window_file(path: str | Path) -> Path:
    path = Path(path)
    with _open(path) as f:
        trace = json.load(f)
    summary = {"path": path.name, "rlprof": trace.get("rlprof"), **summarize_trace(trace)}
    out = path.with_name(path.name.split(".")[0] + ".summary.json")
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=1))
    tmp.replace(out)
    return out

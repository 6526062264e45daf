"""torch.cuda.memory._dump_snapshot pickles, read without executing anything.

A snapshot is plain containers, strings and numbers. The unpickler here refuses every global
(class or function) a pickle names, so a malicious file cannot run code: it is reported and skipped.
"""

from __future__ import annotations

import pickle
from pathlib import Path

from .kineto import NotATrace


class RefusedPickle(NotATrace):
    pass


class PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        raise RefusedPickle(f"names the global {module}.{name}")


def read_snapshot(path: str | Path) -> dict:
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = PlainUnpickler(f).load()
    except RefusedPickle as exc:
        raise RefusedPickle(
            f"{path}: refused: the pickle {exc}; allowed: a memory snapshot of plain containers and numbers"
        ) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise NotATrace(f"{path}: not a readable memory snapshot ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict):
        raise NotATrace(
            f"{path}: not a memory snapshot (top level is {type(data).__name__}); allowed: the dict "
            "torch.cuda.memory._dump_snapshot writes"
        )
    return data


def snapshot_memory(snapshot: dict, points: int = 400) -> dict:
    """Allocated bytes over time from the allocator history (device_traces), and the peak."""
    total, peak, timeline = 0, 0, []
    traces = snapshot.get("device_traces") or []
    for device in traces:
        for entry in device or []:
            action, size = entry.get("action"), int(entry.get("size", 0) or 0)
            if action == "alloc":
                total += size
            elif action in ("free_completed", "free"):
                total -= size
            else:
                continue
            peak = max(peak, total)
            timeline.append([float(entry.get("time_us", len(timeline))), float(total)])
    segments = snapshot.get("segments") or []
    reserved = sum(int(s.get("total_size", 0) or 0) for s in segments)
    live = sum(
        int(b.get("size", 0) or 0)
        for s in segments
        for b in s.get("blocks", [])
        if b.get("state") == "active_allocated"
    )
    step = max(1, len(timeline) // points)
    return {
        "peak_bytes": float(max(peak, live)),
        "reserved_bytes": float(reserved),
        "live_bytes": float(live),
        "timeline": timeline[::step],
    }

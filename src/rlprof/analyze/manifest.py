"""Reading rlprof manifests (the analysis side never imports collect)."""

from __future__ import annotations

from pathlib import Path

import msgspec


META_KEYS = ("step", "steps", "role", "stage", "rank", "replica", "window", "status", "bytes", "device_memory")
LOAD_KEYS = ("cpu_ms", "run_wait_ms", "span_ms", "host_busy_ms", "job_cpu_ms", "host_cpus")  # the machine's load


def row_meta(row: dict) -> dict:
    """What analysis takes from a window's manifest row (the background analysis uses the same, so that its
    per-window tables can stand in for a fresh read)."""
    return {k: row.get(k) for k in META_KEYS + LOAD_KEYS}


def manifest_inputs(path: Path) -> list[tuple[Path, dict]]:
    run_dir = path.parent
    out = []
    with open(path, "rb") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                row = msgspec.json.decode(line)
            except (msgspec.DecodeError, UnicodeDecodeError):
                continue  # a torn last line from a crashed writer
            if not isinstance(row, dict):
                continue  # not a manifest row
            p = row.get("path")
            if row.get("status") == "failed" or not isinstance(p, str) or not p:
                continue
            if not str(p).endswith((".json", ".json.gz", ".pickle")) and not (run_dir / p).is_dir():
                continue
            meta = row_meta(row)
            if row.get("host") or row.get("node_id"):  # where the window was written (not analysis input)
                meta["where"] = {"host": row.get("host"), "node_id": row.get("node_id")}
            out.append((run_dir / p, meta))
    return out

"""Reading rlprof manifests (the analysis side never imports collect)."""

from __future__ import annotations

from pathlib import Path


META_KEYS = (
    "step",
    "steps",
    "role",
    "stage",
    "rank",
    "replica",
    "window",
    "status",
    "bytes",
    "device_memory",
    "device",
    "model",
)
LOAD_KEYS = ("cpu_ms", "run_wait_ms", "span_ms", "host_busy_ms", "job_cpu_ms", "host_cpus")  # the machine's load


def row_meta(row: dict) -> dict:
    """What analysis takes from a window's manifest row (the background analysis uses the same, so that its
    per-window tables can stand in for a fresh read)."""
    return {k: row.get(k) for k in META_KEYS + LOAD_KEYS}


def manifest_inputs(path: Path) -> list[tuple[Path, dict]]:
    """The windows a manifest lists as written, then those the directory holds beyond it (analyze/inputs/salvage.py: a
    crash's or a fault's leftovers, recovered). A manifest that is not there (a run killed before its first row) is
    none."""
    from .salvage import account, read_manifest

    run_dir = path.parent
    rows = read_manifest(path)[0] if path.is_file() else []
    out = []
    for row in rows:
        p = row.get("path")
        if row.get("status") in ("failed", "partial") or not isinstance(p, str) or not p:
            continue  # a failed or partial window: accounted for below, from what the directory holds
        if not str(p).endswith((".json", ".json.gz", ".pickle")) and not (run_dir / p).is_dir():
            continue
        meta = row_meta(row)
        if row.get("host") or row.get("node_id"):  # where the window was written (not analysis input)
            meta["where"] = {"host": row.get("host"), "node_id": row.get("node_id")}
        out.append((run_dir / p, meta))
    return out + account(run_dir, rows)[0]

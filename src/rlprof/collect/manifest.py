"""manifest.jsonl: one JSON object per window. Many processes append to one file safely."""

from __future__ import annotations

import fcntl
import os
import socket
import sys
from pathlib import Path

import msgspec

from .naming import MANIFEST

_encoder = msgspec.json.Encoder()


def written_where() -> dict:
    """Where this process writes its windows: the host name, and the Ray node id when the process runs on a
    Ray node (a Ray worker, or a launcher that exports RLPROF_NODE_ID for its ranks). `rlprof analyze --ray`
    sends the analysis of each window to the node that holds it."""
    node_id = os.environ.get("RLPROF_NODE_ID") or None
    ray = sys.modules.get("ray")  # never imported here: only asked when the process already uses Ray
    if node_id is None and ray is not None:
        try:
            if ray.is_initialized():
                node_id = ray.get_runtime_context().get_node_id()
        except Exception:  # an old or partial Ray: the host name still says where
            node_id = None
    return {"host": socket.gethostname(), "node_id": node_id}


def append_row(run_dir: Path, row: dict) -> None:
    # One write() of one line under an exclusive lock: rows from many ranks never interleave.
    line = _encoder.encode(row) + b"\n"
    fd = os.open(run_dir / MANIFEST, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, line)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def read_rows(path: str | os.PathLike) -> list[dict]:
    """Rows of a manifest (a run directory or the file itself); skips a torn last line."""
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST
    rows = []
    with open(path, "rb") as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    rows.append(msgspec.json.decode(line))
                except msgspec.DecodeError:
                    continue
    return rows

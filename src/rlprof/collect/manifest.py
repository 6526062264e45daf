"""manifest.jsonl: one JSON object per window. Many processes append to one file safely."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

import msgspec

from ..where import this_process
from .naming import MANIFEST

_encoder = msgspec.json.Encoder()


def written_where() -> dict:
    """Where this process writes its windows: the host name, and the Ray node id when the process runs on a
    Ray node (a Ray worker), or the one a launcher exports as RLPROF_NODE_ID for its ranks. `rlprof analyze
    --ray` sends the analysis of each window to the node that holds it."""
    where = this_process()
    where["node_id"] = os.environ.get("RLPROF_NODE_ID") or where["node_id"]
    return where


def append_row(run_dir: Path, row: dict) -> None:
    """One write() of one line under an exclusive lock: rows from many ranks never interleave. All or nothing: a
    write the disk cut short (full) is taken back, so the next row starts on a line of its own; the OSError is the
    caller's (a window's fault)."""
    line = _encoder.encode(row) + b"\n"
    fd = os.open(run_dir / MANIFEST, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        end = os.fstat(fd).st_size
        try:
            written = os.write(fd, line)
        except OSError:
            written = -1
            raise
        finally:
            if written != len(line):
                _take_back(fd, end)
        if written != len(line):
            raise OSError(errno.ENOSPC, f"only {written} of {len(line)} bytes of a manifest row were written")
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _take_back(fd: int, end: int) -> None:
    try:
        os.ftruncate(fd, end)
    except OSError:
        pass  # the reader reads a cut line up to the cut (analyze/inputs/salvage.py)


def read_rows(path: str | os.PathLike) -> list[dict]:
    """Rows of a manifest (a run directory or the file itself); a line cut by a crash is read up to the cut
    (analyze/inputs/salvage.py)."""
    from ..analyze.inputs.salvage import read_manifest

    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST
    return read_manifest(path)[0]

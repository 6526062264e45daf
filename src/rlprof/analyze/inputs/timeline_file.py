"""The watch's per-rank timeline (collect/watch.py writes it, analyze/over_time/timeline.py reads it): one fixed-width
little-endian record per watched step, appended as the step ends, in `<run_dir>/timeline/rank<R>.bin`.

Record: step (u4), flags (u4: BUSY, WARMUP, CAPTURED, PROFILED; and the trigger's verdict, the same on every rank:
JUDGED, and what it found there, SLOW, STRAGGLER), the step's wall seconds (f4), then one f4 per stage in
`vocab.STAGES` order: that stage's wall seconds in the step (entries summed), NaN where the stage did not run; then
one f4 per stage: when it was first entered, in seconds from the step's start (the order the stages ran in: a
straggler's slow stage comes before the stage where the other ranks wait for it).
`timeline/columns.json` names the columns, so a reader never guesses the layout."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from ...vocab import STAGES

TIMELINE_DIR = "timeline"
COLUMNS_FILE = "columns.json"
FORMAT_VERSION = 1
BUSY, WARMUP, CAPTURED = 1, 2, 4
PROFILED = 8  # a window of the plan's own steps was open on this rank (the profiler's cost is in the times)
JUDGED, SLOW, STRAGGLER = 16, 32, 64  # the trigger judged the step; it found it slow; it found a rank straggling
RECORD = struct.Struct("<IIf" + "f" * 2 * len(STAGES))
DTYPE = np.dtype(
    [
        ("step", "<u4"),
        ("flags", "<u4"),
        ("step_s", "<f4"),
        ("stage_s", "<f4", (len(STAGES),)),
        ("stage_start_s", "<f4", (len(STAGES),)),
    ]
)
assert DTYPE.itemsize == RECORD.size


def rank_file(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / TIMELINE_DIR / f"rank{rank}.bin"


def columns() -> dict:
    return {
        "version": FORMAT_VERSION,
        "record_bytes": RECORD.size,
        "fields": ["step", "flags", "step_s", "stage_s", "stage_start_s"],
        "stages": list(STAGES),
        "flags": {
            "busy": BUSY,
            "warmup": WARMUP,
            "captured": CAPTURED,
            "profiled": PROFILED,
            "judged": JUDGED,
            "slow": SLOW,
            "straggler": STRAGGLER,
        },
    }


def timeline_ranks(run_dir: Path) -> list[tuple[int, Path]]:
    """(rank, file) of every rank's timeline under a run directory, by rank; [] when the run has none."""
    d = Path(run_dir) / TIMELINE_DIR
    if not d.is_dir():
        return []
    out = []
    for p in d.glob("rank*.bin"):
        try:
            out.append((int(p.stem[4:]), p))
        except ValueError:
            continue
    return sorted(out)


def read_rank(path: Path) -> np.ndarray:
    """One rank's records; a torn last record (the job was writing it) is left out."""
    data = np.fromfile(path, dtype=np.uint8)
    whole = len(data) - len(data) % DTYPE.itemsize
    return data[:whole].view(DTYPE)


def stage_names(run_dir: Path) -> list[str]:
    """The stage columns as the writer named them (columns.json), else this version's."""
    p = Path(run_dir) / TIMELINE_DIR / COLUMNS_FILE
    try:
        return list(json.loads(p.read_text())["stages"])
    except (OSError, ValueError, KeyError):
        return list(STAGES)

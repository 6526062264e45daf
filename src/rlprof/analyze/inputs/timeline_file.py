"""The watch's per-rank timeline (collect/watch.py writes it, analyze/over_time/timeline.py reads it): one fixed-width
little-endian record per watched step, appended as the step ends, in `<run_dir>/timeline/rank<R>.bin`.

Record: step (u4), flags (u4: BUSY, WARMUP, CAPTURED, PROFILED, CONTENTION; and the trigger's verdict, the same on
every rank: JUDGED, and what it found there, SLOW, STRAGGLER), the step's wall seconds (f4), then one f4 per stage in
`vocab.STAGES` order: that stage's wall seconds in the step (entries summed), NaN where the stage did not run; then
one f4 per stage: when it was first entered, in seconds from the step's start (the order the stages ran in: a
straggler's slow stage comes before the stage where the other ranks wait for it); then (version 2) when the step began
on the wall clock (f8, seconds since the Unix epoch: the clock of the samples and of the traces' events, so a file
whose name holds no step is placed in one), how long the thread that ran the step ran on a core (f4, ms) and waited
for one (f4, ms: its run-queue wait), and the share of the host's CPUs other processes used meanwhile (f4:
busy_machine.py's external share); then one f4 per stage: the thread's wait for a core inside it (ms), and one f4
per stage: its time on a core inside it (ms); NaN where not known. A version 1 file (no fields after the starts)
reads with them NaN.
`timeline/columns.json` names the columns, so a reader never guesses the layout.

Beside it, where the host knows when its rollout stage ran and what it did inside (verl's driver: the stage is its
`gen` timer, around the replay buffer's sampling), `timeline/rollout.jsonl`: one JSON object per generation pass of a
watched step, appended as the step ends: `step`, `pass` (0, 1, ... within the step), `start_unix_s` (the stage
entered), `sampled_unix_s` (the batch handed over: generation and scoring done as far as the host waited),
`end_unix_s` (the stage left: what the host does after, verl's replicas put to sleep and, on a profiled step, its
rollout profiler stopped), `profiled` (a window of the step was open); with DAPO's dynamic sampling `refills` (each
refill the replay buffer dispatched: [when, prompts]) and `filtered_groups` (the groups its filter dropped); seconds
since the epoch, the samples' clock."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from ...vocab import STAGES

TIMELINE_DIR = "timeline"
COLUMNS_FILE = "columns.json"
FORMAT_VERSION = 2
BUSY, WARMUP, CAPTURED = 1, 2, 4
PROFILED = 8  # a window of the plan's own steps was open on this rank (the profiler's cost is in the times)
JUDGED, SLOW, STRAGGLER = 16, 32, 64  # the trigger judged the step; it found it slow; it found a rank straggling
CONTENTION = 128  # found slow, or this rank straggling, and its wait for a core explains it (collect/trigger.py): said
RECORD = struct.Struct("<IIf" + "f" * 2 * len(STAGES) + "dfff" + "f" * 2 * len(STAGES))
V1_FIELDS = [
    ("step", "<u4"),
    ("flags", "<u4"),
    ("step_s", "<f4"),
    ("stage_s", "<f4", (len(STAGES),)),
    ("stage_start_s", "<f4", (len(STAGES),)),
]
LOAD_FIELDS = [
    ("start_unix_s", "<f8"),
    ("cpu_ms", "<f4"),
    ("run_wait_ms", "<f4"),
    ("others_share", "<f4"),
    ("stage_wait_ms", "<f4", (len(STAGES),)),
    ("stage_cpu_ms", "<f4", (len(STAGES),)),
]
DTYPE = np.dtype(V1_FIELDS + LOAD_FIELDS)
V1_DTYPE = np.dtype(V1_FIELDS)
assert DTYPE.itemsize == RECORD.size


ROLLOUT_FILE = "rollout.jsonl"


def rollout_file(run_dir: Path) -> Path:
    return Path(run_dir) / TIMELINE_DIR / ROLLOUT_FILE


def read_rollout_windows(run_dir: Path) -> list[dict]:
    """The host's rollout passes (`rollout.jsonl`), whole lines only; [] where the run has none."""
    try:
        lines = rollout_file(run_dir).read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a torn last line
        if isinstance(rec, dict) and isinstance(rec.get("step"), int):
            out.append(rec)
    return out


def rank_file(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / TIMELINE_DIR / f"rank{rank}.bin"


def columns() -> dict:
    return {
        "version": FORMAT_VERSION,
        "record_bytes": RECORD.size,
        "fields": [f[0] for f in DTYPE.descr],
        "stages": list(STAGES),
        "flags": {
            "busy": BUSY,
            "warmup": WARMUP,
            "captured": CAPTURED,
            "profiled": PROFILED,
            "judged": JUDGED,
            "slow": SLOW,
            "straggler": STRAGGLER,
            "contention": CONTENTION,
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
    """One rank's records, in this version's layout (a version 1 file's with its missing fields NaN); a torn last
    record (the job was writing it) is left out."""
    path = Path(path)
    layout = record_dtype(path.parent)
    data = np.fromfile(path, dtype=np.uint8)
    whole = len(data) - len(data) % layout.itemsize
    records = data[:whole].view(layout)
    if layout is DTYPE:
        return records
    out = np.empty(len(records), DTYPE)
    for name, *_ in V1_FIELDS:
        out[name] = records[name]
    for name, *_ in LOAD_FIELDS:
        out[name] = np.nan
    return out


def record_dtype(timeline_dir: Path) -> np.dtype:
    """The records' layout in a timeline directory: this version's, or version 1's (a reader of its first fields)."""
    return DTYPE if _version(Path(timeline_dir)) >= 2 else V1_DTYPE


def _version(timeline_dir: Path) -> int:
    """The layout's version as columns.json says (its record size where it names no version); this version's
    where the file is missing or unreadable (the writer writes it before the first record)."""
    try:
        cols = json.loads((timeline_dir / COLUMNS_FILE).read_text())
    except (OSError, ValueError):
        return FORMAT_VERSION
    if cols.get("record_bytes") == V1_DTYPE.itemsize:
        return 1
    return int(cols.get("version", FORMAT_VERSION))


def stage_names(run_dir: Path) -> list[str]:
    """The stage columns as the writer named them (columns.json), else this version's."""
    p = Path(run_dir) / TIMELINE_DIR / COLUMNS_FILE
    try:
        return list(json.loads(p.read_text())["stages"])
    except (OSError, ValueError, KeyError):
        return list(STAGES)

"""The run over time: every watched step's stage times per rank (the watch's timeline, timeline_file.py), with
spikes, drift and stragglers flagged by one documented rule each (docs/analysis_schema.md, "timeline"):

- spike: the job's time of a stage at a step (its slowest rank) over SPIKE_FACTOR x the median of the previous
  WINDOW judged steps, and at least MIN_SECONDS over it;
- level shift: a stage that goes from one level to another at a step and stays there: its job time at that step over
  DRIFT_FACTOR x the median of the previous WINDOW judged steps (and MIN_SECONDS over it), the median of the next
  WINDOW judged steps (SHIFT_STEPS at least, that step first) too, and SHIFT_SHARE of them above the midpoint of the
  two levels: said once, from that step, not as a spike per step until the median catches up. Spikes after it are
  judged against the new level (the median restarts there), and drift within the level it ended on;
- drift: a stage whose median over the last quarter of the judged steps (since its last level shift) is DRIFT_FACTOR
  x its median over the first quarter, and at least MIN_SECONDS more;
- straggler: a rank whose time in a stage is over STRAGGLER_FACTOR x the other ranks' median at the same step (with
  3 ranks or more, the median of all ranks stands for it), and at least MIN_SECONDS over it, at STRAGGLER_STEPS
  steps or more and at STRAGGLER_SHARE of the steps after the warm-up (busy ones included: a busy neighbour slows
  ranks at random; the same rank in the same stage step after step is the job's own). At a step where ranks straggle in several stages, only the stage that ran first counts:
  the other ranks wait for the straggler at their next collective and look slow there.
Judged steps: after the warm-up steps the job flagged, not captured or profiled by the plan's own steps on any rank
(the profiler's cost is in their times), and not busy on any rank (analyze/inputs/busy_machine.py's rule, applied by
the watch at each step). Memory: one float32 per (stage, rank, step), read rank by rank.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from ..inputs.timeline_file import BUSY, CAPTURED, PROFILED, WARMUP, read_rank, stage_names, timeline_ranks

SPIKE_FACTOR = 2.0
DRIFT_FACTOR = 1.3
STRAGGLER_FACTOR = 1.5
STRAGGLER_STEPS = 3
STRAGGLER_SHARE = 0.25
MIN_SECONDS = 0.02
WINDOW = 20
SHIFT_STEPS = 3
SHIFT_SHARE = 0.8
RULES = {
    "spike_factor": SPIKE_FACTOR,
    "drift_factor": DRIFT_FACTOR,
    "shift_steps": SHIFT_STEPS,
    "shift_share": SHIFT_SHARE,
    "straggler_factor": STRAGGLER_FACTOR,
    "straggler_steps": STRAGGLER_STEPS,
    "straggler_share": STRAGGLER_SHARE,
    "min_seconds": MIN_SECONDS,
    "window": WINDOW,
}


def _load(run_dir: Path):
    """(steps, flags OR-ed over ranks, step_s [ranks x steps], {stage: [ranks x steps]}, {stage: mean first entry
    in the step over ranks [steps]}, ranks). Two passes over the files, one rank's records in memory at a time:
    the first finds the steps and the stages that ran, the second fills the tables."""
    files = timeline_ranks(run_dir)
    names = stage_names(run_dir)
    steps = np.zeros(0, np.uint32)
    present = np.zeros(len(names), bool)
    for _, path in files:
        r = read_rank(path)
        if len(r):
            steps = np.union1d(steps, r["step"]) if not np.array_equal(steps, r["step"]) else steps
            present |= ~np.isnan(r["stage_s"]).all(axis=0)
    kept = [i for i in range(len(names)) if present[i]]
    shape = (len(files), len(steps))
    step_s = np.full(shape, np.nan, np.float32)
    stages = {names[i]: np.full(shape, np.nan, np.float32) for i in kept}
    flags = np.zeros(len(steps), np.uint32)
    start_sum = np.zeros((len(names), len(steps)))
    start_n = np.zeros((len(names), len(steps)))
    for k, (_, path) in enumerate(files):
        r = read_rank(path)
        at = np.searchsorted(steps, r["step"])
        step_s[k, at] = r["step_s"]
        np.bitwise_or.at(flags, at, r["flags"])
        for i in kept:
            stages[names[i]][k, at] = r["stage_s"][:, i]
            start = r["stage_start_s"][:, i]
            ok = ~np.isnan(start)
            start_sum[i, at[ok]] += start[ok]
            start_n[i, at[ok]] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        starts = {names[i]: np.where(start_n[i] > 0, start_sum[i] / start_n[i], np.inf) for i in kept}
    return steps, flags, step_s, stages, starts, [rank for rank, _ in files]


def _median0(a: np.ndarray) -> np.ndarray:
    """Median over ranks (axis 0), NaN-aware only where NaN is present (nanmedian is slow on wide arrays)."""
    if not np.isnan(a).any():
        return np.median(a, axis=0)
    with warnings.catch_warnings():  # a step no rank ran the stage in: NaN, said as such
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(a, axis=0)


def _rolling_median(series: np.ndarray, window: int) -> np.ndarray:
    """At each position, the median of the previous `window` numbers of `series` (NaN: not judged, skipped);
    NaN where none precedes."""
    out = np.full(len(series), np.nan)
    where = np.flatnonzero(~np.isnan(series))
    values = series[where]
    if len(values) < 2:
        return out
    prev = np.full(len(values), np.nan)
    for i in range(1, min(window, len(values))):
        prev[i] = np.median(values[:i])
    if len(values) > window:
        prev[window:] = np.median(np.lib.stride_tricks.sliding_window_view(values, window)[:-1], axis=1)
    # a position's baseline: the median before the last judged value at or before it
    at = np.searchsorted(where, np.arange(len(series)), side="left")
    ok = at < len(where)
    out[ok] = prev[at[ok]]
    out[where] = prev
    return out


def _levels(series: np.ndarray) -> tuple[np.ndarray, list[tuple[int, float, float, int]]]:
    """(each position's baseline, the level shifts as (position, level before, level after, steps seen after)):
    the rolling median of the previous WINDOW judged values (NaN: not judged), restarted at each level shift, so
    that the steps at a new level are judged against it."""
    base = _rolling_median(series, WINDOW)
    where = np.flatnonzero(~np.isnan(series))
    shifts: list[tuple[int, float, float, int]] = []
    start = 0  # the judged values from here on are the current level's
    while True:
        with np.errstate(invalid="ignore"):
            jump = (series > DRIFT_FACTOR * base) & (series - base >= MIN_SECONDS)
        found = None
        for i in np.flatnonzero(jump[where[start:]] if start < len(where) else []):
            k = start + int(i)
            after = series[where[k : k + WINDOW]]
            if len(after) < SHIFT_STEPS:
                break
            before, level = float(base[where[k]]), float(np.median(after))
            mid = (before + level) / 2
            if level >= DRIFT_FACTOR * before and level - before >= MIN_SECONDS and (after > mid).mean() >= SHIFT_SHARE:
                found = (k, before, level, len(after))
                break
        if found is None:
            return base, shifts
        shifts.append((int(where[found[0]]), *found[1:]))
        start = found[0]
        restarted = series.copy()
        restarted[: where[start]] = np.nan  # the new level's own median, from the shift on
        base[where[start] :] = _rolling_median(restarted, WINDOW)[where[start] :]


def _round(values) -> list:
    """Numbers for JSON: 6 decimals, None where not a number."""
    return [
        None if v != v or v in (np.inf, -np.inf) else v
        for v in np.round(np.asarray(values, dtype=np.float64), 6).tolist()
    ]


def triggered_windows(run_dir: Path) -> list[dict]:
    """The manifest rows of the windows a trigger captured: step, role, stage, rank, path and its `trigger`."""
    import msgspec

    path = Path(run_dir) / "manifest.jsonl"
    out = []
    if not path.exists():
        return out
    with open(path, "rb") as f:
        for line in f:
            try:
                row = msgspec.json.decode(line.strip() or b"{}")
            except msgspec.DecodeError:
                continue  # a torn last line
            if isinstance(row, dict) and row.get("trigger"):
                out.append({k: row.get(k) for k in ("step", "role", "stage", "rank", "path", "status", "trigger")})
    return out


def run_timeline(path) -> dict | None:
    """The document's `timeline` section for a run directory that holds one, else None (the hook analysis and
    the report call)."""
    path = Path(path)
    if not path.is_dir() or not timeline_ranks(path):
        return None
    return analyze_timeline(path, triggered_windows(path))


def timeline_only(path) -> bool:
    """A run directory with a timeline and no windows (nothing was captured): analysed from the timeline alone."""
    from ..inputs.salvage import has_leftovers

    path = Path(path)
    return (
        path.is_dir()
        and not (path / "manifest.jsonl").exists()
        and bool(timeline_ranks(path))
        and not has_leftovers(path)  # windows a crash left before the first manifest row
    )


def analyze_timeline(run_dir: str | Path, captures: list[dict] | None = None) -> dict | None:
    """The run-over-time section of the analysis document; None when the run has no timeline."""
    run_dir = Path(run_dir)
    steps, flags, step_s, stages, starts, ranks = _load(run_dir)
    if not len(steps):
        return None
    judged = (flags & (BUSY | WARMUP)) == 0
    out = {
        "rules": RULES,
        "ranks": ranks,
        "steps": [int(s) for s in steps],
        "busy_steps": [int(s) for s in steps[(flags & BUSY) != 0]],
        "warmup_steps": [int(s) for s in steps[(flags & WARMUP) != 0]],
        "captured_steps": [int(s) for s in steps[(flags & CAPTURED) != 0]],
        "profiled_steps": [int(s) for s in steps[(flags & PROFILED) != 0]],
        "per_step": {},
        "spikes": [],
        "level_shifts": [],
        "drift": [],
        "stragglers": [],
        "captures": list(captures or []),
    }
    # the profiler's own cost is in these times: neither judged nor baseline
    profiled = (flags & (CAPTURED | PROFILED)) != 0
    judged &= ~profiled
    columns = {"step": step_s, **stages}
    times_of = columns.__getitem__
    compared = ((flags & WARMUP) == 0) & ~profiled  # the steps ranks are compared at
    least = max(STRAGGLER_STEPS, STRAGGLER_SHARE * int(compared.sum()))
    straggling: dict = {}
    for name, times in columns.items():
        with np.errstate(all="ignore"):
            job = np.fmax.reduce(times, axis=0)
            median = _median0(times)
        out["per_step"][name] = {"max": _round(job), "median": _round(median)}
        series = np.where(judged, job, np.nan)
        base, shifts = _levels(series)
        for i, before, after, seen in shifts:
            out["level_shifts"].append(
                {
                    "stage": name,
                    "from_step": int(steps[i]),
                    "before_seconds": before,
                    "after_seconds": after,
                    "ratio": after / before if before > 0 else None,
                    "steps": seen,
                    "rank": ranks[int(np.nanargmax(times[:, i]))],
                }
            )
        with np.errstate(invalid="ignore"):
            hit = judged & (job > SPIKE_FACTOR * base) & (job - base >= MIN_SECONDS)
        for i, *_ in shifts:  # the shift's first step is the change, not a spike
            hit[i] = False
        for i in np.flatnonzero(hit):
            col = times[:, i]
            out["spikes"].append(
                {
                    "step": int(steps[i]),
                    "stage": name,
                    "seconds": float(job[i]),
                    "baseline_seconds": float(base[i]),
                    "rank": ranks[int(np.nanargmax(col))],
                }
            )
        values = series[shifts[-1][0] if shifts else 0 :]
        values = values[~np.isnan(values)]  # the level the stage ended on
        if len(values) >= 8:
            quarter = len(values) // 4
            first, last = float(np.median(values[:quarter])), float(np.median(values[-quarter:]))
            if last >= DRIFT_FACTOR * first and last - first >= MIN_SECONDS:
                out["drift"].append(
                    {
                        "stage": name,
                        "first_seconds": first,
                        "last_seconds": last,
                        "ratio": last / first if first > 0 else None,
                    }
                )
        if name != "step" and len(ranks) >= 2:
            others = times[::-1] if len(ranks) == 2 else median[None, :]  # 2 ranks: each rank's other rank
            with np.errstate(invalid="ignore"):
                slow = (times > STRAGGLER_FACTOR * others) & (times - others >= MIN_SECONDS) & compared[None, :]
            if slow.any():
                straggling[name] = (slow, others)
    # at each step, only the first stage (by when it ran) in which a rank straggles: later ones are the wait for it
    if straggling:
        names = list(straggling)
        first = np.stack([np.where(straggling[n][0].any(axis=0), starts[n], np.inf) for n in names])
        winner = np.argmin(first, axis=0)
        for i, name in enumerate(names):
            slow, others = straggling[name]
            slow &= (winner == i)[None, :]
            counts = slow.sum(axis=1)
            for k in np.flatnonzero(counts >= least):
                at = np.flatnonzero(slow[k])
                ratio = times_of(name)[k, at] / np.broadcast_to(others, slow.shape)[k, at]
                out["stragglers"].append(
                    {
                        "rank": ranks[int(k)],
                        "stage": name,
                        "steps": int(counts[k]),
                        "first_step": int(steps[at[0]]),
                        "median_ratio": float(np.median(ratio)),
                    }
                )
    out["stragglers"].sort(key=lambda s: (-s["steps"], s["rank"]))
    return out

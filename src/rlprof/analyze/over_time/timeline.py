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
- contention: a spike contention explains (analyze/inputs/busy_machine.py: the busy ranks' waits for a core in the
  stage beyond the wait their time on a core there would have had at their usual share -- each rank's median over
  the judged steps contention did not slow -- summed, half the excess or more) is the machine's, not the job's: said
  with its evidence (the ranks' wait there, the wait expected at their usual share, other processes' share of the
  host) as contention, not as a spike; so is one the live trigger found so (the step's CONTENTION flag). Contention
  alike on every rank is one record for the run; a straggler whose wait in the stage beyond the one expected at the
  other ranks' share explains its excess at half of its steps or more carries the same cause and evidence.
Judged steps: after the warm-up steps the job flagged, not captured or profiled by the plan's own steps on any rank
(the profiler's cost is in their times), busy ones included. The baselines and the levels leave out the steps
contention slowed (the live trigger's, and those whose waits for a core explain their excess over the level before
them): a neighbour's load neither starts nor holds a level. Memory: one float32 per (stage, rank, step), read rank
by rank.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from ..inputs.busy_machine import CONTENTION_SHARE
from ..inputs.timeline_file import BUSY, CAPTURED, CONTENTION, PROFILED, WARMUP, timeline_ranks
from .contention import contention_evidence, contention_records, rank_evidence, straggler_contention
from .watched import Loaded

WAITED_STAGE = "rollout_generate"  # the stage whose per-step wait for a core the document keeps (rollout_why.py)

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
    "contention_share": CONTENTION_SHARE,
}


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
    t = Loaded(run_dir)
    steps, flags, step_s, stages, starts, ranks = t.steps, t.flags, t.step_s, t.stages, t.starts, t.ranks
    if not len(steps):
        return None
    out = {
        "rules": RULES,
        "ranks": ranks,
        "steps": [int(s) for s in steps],
        "busy_steps": [int(s) for s in steps[(flags & BUSY) != 0]],
        "warmup_steps": [int(s) for s in steps[(flags & WARMUP) != 0]],
        "captured_steps": [int(s) for s in steps[(flags & CAPTURED) != 0]],
        "profiled_steps": [int(s) for s in steps[(flags & PROFILED) != 0]],
        "contention_steps": [int(s) for s in steps[(flags & CONTENTION) != 0]],
        "per_step": {},
        "spikes": [],
        "level_shifts": [],
        "drift": [],
        "stragglers": [],
        "contention": [],
        "captures": list(captures or []),
    }
    # the profiler's own cost is in these times: neither judged nor baseline
    profiled = (flags & (CAPTURED | PROFILED)) != 0
    judged = ((flags & WARMUP) == 0) & ~profiled  # busy steps included
    own = judged & ((flags & CONTENTION) == 0)  # the live trigger's contention steps: no baseline, no level
    columns = {"step": step_s, **stages}
    usual = t.usual_shares(own)
    times_of = columns.__getitem__
    least = max(STRAGGLER_STEPS, STRAGGLER_SHARE * int(judged.sum()))
    straggling: dict = {}
    contended: list[dict] = []
    for name, times in columns.items():
        with np.errstate(all="ignore"):
            job = np.fmax.reduce(times, axis=0)
            median = _median0(times)
        out["per_step"][name] = {"max": _round(job), "median": _round(median)}
        if name == WAITED_STAGE:  # the slowest rank's wait for a core there: the rollout's why takes it out
            out["per_step"][name]["wait_ms"] = _round(t.slowest_waits(name, times))
        # a step slowed by contention (its waits for a core explain the excess over the level before it) neither
        # starts nor holds a level: taken out, and the levels found again without it
        first_base = _carried(_levels(np.where(own, job, np.nan))[0])
        explained = np.zeros(len(steps), bool)
        with np.errstate(invalid="ignore"):
            over = own & (job > DRIFT_FACTOR * first_base) & (job - first_base >= MIN_SECONDS)
        for i in np.flatnonzero(over):
            explained[i] = contention_evidence(t, name, i, usual[name], float(job[i] - first_base[i])) is not None
        series = np.where(own & ~explained, job, np.nan)
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
        base = _carried(base)  # a contended step's baseline: the steps' before it
        with np.errstate(invalid="ignore"):
            hit = judged & (job > SPIKE_FACTOR * base) & (job - base >= MIN_SECONDS)
        for i, *_ in shifts:  # the shift's first step is the change, not a spike
            hit[i] = False
        for i in np.flatnonzero(hit):
            col = times[:, i]
            k = int(np.nanargmax(col))
            spike = {
                "step": int(steps[i]),
                "stage": name,
                "seconds": float(job[i]),
                "baseline_seconds": float(base[i]),
                "rank": ranks[k],
            }
            evidence = contention_evidence(t, name, i, usual[name], float(job[i] - base[i]))
            if evidence is None and flags[i] & CONTENTION:  # the live trigger found the wait explained it
                evidence = rank_evidence(t, name, i, usual[name])
            if evidence is not None:
                contended.append({**spike, **evidence})
            else:
                out["spikes"].append(spike)
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
                slow = (times > STRAGGLER_FACTOR * others) & (times - others >= MIN_SECONDS) & judged[None, :]
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
                mine = times_of(name)[k, at]
                theirs = np.broadcast_to(others, slow.shape)[k, at]
                straggler = {
                    "rank": ranks[int(k)],
                    "stage": name,
                    "steps": int(counts[k]),
                    "first_step": int(steps[at[0]]),
                    "median_ratio": float(np.median(mine / theirs)),
                }
                straggler.update(straggler_contention(t, name, int(k), at, mine - theirs))
                out["stragglers"].append(straggler)
    out["stragglers"].sort(key=lambda s: (-s["steps"], s["rank"]))
    out["contention"] = contention_records(contended, ranks)
    return out


def _carried(base: np.ndarray) -> np.ndarray:
    """A baseline for every step: the last known one carried forward over the steps that had none (busy ones)."""
    out = base.copy()
    known = np.flatnonzero(~np.isnan(out))
    if len(known):
        at = np.searchsorted(known, np.arange(len(out)), side="right") - 1
        ok = at >= 0
        out[ok] = out[known[at[ok]]]
    return out

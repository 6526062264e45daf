"""The watch's timeline as tables (timeline_file.py's records, every rank's): what the run over time (timeline.py),
its contention (contention.py), the rollout's account (rollout_account.py) and the placing of files that name no step
(row_steps.py) read."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from ..inputs.timeline_file import read_rank, stage_names, timeline_ranks


class Loaded:
    """A run's timeline as tables: steps, flags OR-ed over ranks and per rank, step and stage times [ranks x steps],
    each stage's mean first entry in the step over ranks, each rank's time on a core, run-queue wait and others' share
    and its wait for a core and time on one in the step and in each stage [ranks x steps], each step's earliest start
    on the wall clock, and the ranks."""

    def shares(self, name: str) -> np.ndarray:
        """Each rank's wait for a core in `name` (a stage or the step) as a share of its ready time there [ranks x
        steps] (NaN: not known)."""
        ready = self.cpus[name].astype(float) + self.waits[name]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(ready > 0, self.waits[name] / ready, np.nan)

    def __init__(self, run_dir: Path):
        files = timeline_ranks(run_dir)
        names = stage_names(run_dir)
        steps = np.zeros(0, np.uint32)
        present = np.zeros(len(names), bool)
        for _, path in files:  # two passes, one rank's records in memory at a time: the steps and stages first
            r = read_rank(path)
            if len(r):
                steps = np.union1d(steps, r["step"]) if not np.array_equal(steps, r["step"]) else steps
                present |= ~np.isnan(r["stage_s"]).all(axis=0)
        kept = [i for i in range(len(names)) if present[i]]
        shape = (len(files), len(steps))
        self.steps, self.ranks = steps, [rank for rank, _ in files]
        self.step_s = np.full(shape, np.nan, np.float32)
        self.stages = {names[i]: np.full(shape, np.nan, np.float32) for i in kept}
        self.waits = {
            "step": np.full(shape, np.nan, np.float32),
            **{names[i]: np.full(shape, np.nan, np.float32) for i in kept},
        }
        self.cpus = {name: np.full(shape, np.nan, np.float32) for name in self.waits}
        self.rank_flags = np.zeros(shape, np.uint32)
        self.others_share = np.full(shape, np.nan, np.float32)
        self.start_unix_s = np.full(len(steps), np.nan)
        start_sum = np.zeros((len(names), len(steps)))
        start_n = np.zeros((len(names), len(steps)))
        for k, (_, path) in enumerate(files):
            r = read_rank(path)
            at = np.searchsorted(steps, r["step"])
            self.step_s[k, at] = r["step_s"]
            self.rank_flags[k, at] = r["flags"]
            self.waits["step"][k, at] = r["run_wait_ms"]
            self.cpus["step"][k, at] = r["cpu_ms"]
            self.others_share[k, at] = r["others_share"]
            self.start_unix_s[at] = np.fmin(self.start_unix_s[at], r["start_unix_s"])
            for i in kept:
                self.stages[names[i]][k, at] = r["stage_s"][:, i]
                self.waits[names[i]][k, at] = r["stage_wait_ms"][:, i]
                self.cpus[names[i]][k, at] = r["stage_cpu_ms"][:, i]
                start = r["stage_start_s"][:, i]
                ok = ~np.isnan(start)
                start_sum[i, at[ok]] += start[ok]
                start_n[i, at[ok]] += 1
        self.flags = np.bitwise_or.reduce(self.rank_flags, axis=0) if len(files) else np.zeros(len(steps), np.uint32)
        with np.errstate(invalid="ignore", divide="ignore"):
            self.starts = {names[i]: np.where(start_n[i] > 0, start_sum[i] / start_n[i], np.inf) for i in kept}


def step_bounds(run_dir: str | Path) -> list[tuple[int, float, float]]:
    """(step, start, end) of each watched step on the wall clock (seconds since the epoch; the earliest start of the
    ranks, plus the longest step), where the timeline says when its steps began (version 2)."""
    t = Loaded(Path(run_dir))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        longest = np.nanmax(t.step_s, axis=0) if len(t.ranks) else np.full(len(t.steps), np.nan)
    return [
        (int(s), float(a), float(a + d))
        for s, a, d in zip(t.steps, t.start_unix_s, longest)
        if np.isfinite(a) and np.isfinite(d)
    ]

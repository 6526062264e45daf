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
    each stage's mean first entry in the step over ranks, each step's earliest start on the wall clock, and the
    ranks. The waits for a core and times on one (the step's and each stage's) and others' share are read where asked
    (`sched`, `usual_shares`), a rank's records at a time: a run of 1,000 ranks x 10,000 steps keeps only its stage
    times in memory (timeline.py's limit, bench/timeline_scale.py)."""

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
        self.paths = [path for _, path in files]
        self.column = {"step": None, **{names[i]: i for i in kept}}  # where a stage's wait and time on a core are
        self.steps, self.ranks = steps, [rank for rank, _ in files]
        self.step_s = np.full(shape, np.nan, np.float32)
        self.stages = {names[i]: np.full(shape, np.nan, np.float32) for i in kept}
        self.rank_flags = np.zeros(shape, np.uint32)
        self.start_unix_s = np.full(len(steps), np.nan)
        start_sum = np.zeros((len(names), len(steps)))
        start_n = np.zeros((len(names), len(steps)))
        for k, path in enumerate(self.paths):
            r = read_rank(path)
            at = np.searchsorted(steps, r["step"])
            self.step_s[k, at] = r["step_s"]
            self.rank_flags[k, at] = r["flags"]
            self.start_unix_s[at] = np.fmin(self.start_unix_s[at], r["start_unix_s"])
            for i in kept:
                self.stages[names[i]][k, at] = r["stage_s"][:, i]
                start = r["stage_start_s"][:, i]
                ok = ~np.isnan(start)
                start_sum[i, at[ok]] += start[ok]
                start_n[i, at[ok]] += 1
        self.flags = np.bitwise_or.reduce(self.rank_flags, axis=0) if len(files) else np.zeros(len(steps), np.uint32)
        with np.errstate(invalid="ignore", divide="ignore"):
            self.starts = {names[i]: np.where(start_n[i] > 0, start_sum[i] / start_n[i], np.inf) for i in kept}

    def _sched(self, name: str, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(time on a core, wait for one) in `name` (a stage or the step) of records `r`, ms."""
        i = self.column[name]
        if i is None:
            return r["cpu_ms"].astype(float), r["run_wait_ms"].astype(float)
        return r["stage_cpu_ms"][:, i].astype(float), r["stage_wait_ms"][:, i].astype(float)

    def sched(self, name: str, k: int, idx) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rank k's (time on a core, wait for one, others' share of the host) in `name` at the steps `idx` (indices
        into `steps`), NaN where its timeline has no such step."""
        idx = np.atleast_1d(np.asarray(idx, int))
        r = read_rank(self.paths[k])
        where = np.searchsorted(r["step"], self.steps[idx])
        found = (where < len(r)) & (r["step"][np.minimum(where, max(len(r) - 1, 0))] == self.steps[idx])
        out = [np.full(len(idx), np.nan) for _ in range(3)]
        if found.any():
            rows = r[where[found]]
            cpu, wait = self._sched(name, rows)
            out[0][found], out[1][found], out[2][found] = cpu, wait, rows["others_share"]
        return out[0], out[1], out[2]

    def slowest_waits(self, name: str, times: np.ndarray) -> np.ndarray:
        """At each step, the wait for a core (ms) in `name` of the rank whose time there (`times`, [ranks x steps]) is
        the job's (the slowest); NaN where no rank ran it or its wait is not known. One read per rank that is ever
        the slowest."""
        out = np.full(len(self.steps), np.nan)
        ran = ~np.isnan(times).all(axis=0)
        slowest = np.zeros(len(self.steps), int)
        slowest[ran] = np.nanargmax(times[:, ran], axis=0)
        for k in np.unique(slowest[ran]):
            idx = np.flatnonzero(ran & (slowest == k))
            out[idx] = self.sched(name, int(k), idx)[1]
        return out

    def usual_shares(self, own: np.ndarray) -> dict[str, np.ndarray]:
        """Each rank's usual wait share of its ready time in each stage and the step: its median over the steps
        `own` marks (NaN where not known), one rank's records at a time."""
        out = {name: np.full(len(self.paths), np.nan) for name in self.column}
        for k, path in enumerate(self.paths):
            r = read_rank(path)
            r = r[own[np.searchsorted(self.steps, r["step"])]] if len(r) else r
            for name in self.column:
                cpu, wait = self._sched(name, r)
                with np.errstate(invalid="ignore", divide="ignore"):
                    share = np.where(cpu + wait > 0, wait / (cpu + wait), np.nan)
                if np.isfinite(share).any():
                    out[name][k] = float(np.nanmedian(share))
        return out


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

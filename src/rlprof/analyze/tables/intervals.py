"""Interval arithmetic with numpy. Every bucket is a covered length of a union of intervals,
answered per window in O(log n) from pre-merged, disjoint, sorted runs."""

from __future__ import annotations

import numpy as np


class Coverage:
    """The union of a set of [start, end) intervals as disjoint sorted runs, with prefix sums."""

    def __init__(self, start: np.ndarray, end: np.ndarray):
        if len(start) == 0:
            self.s = self.e = np.zeros(0)
            self.cum = np.zeros(1)
            return
        order = np.argsort(start, kind="stable")
        s, e = start[order], end[order]
        reach = np.maximum.accumulate(e)
        new_run = np.empty(len(s), dtype=bool)
        new_run[0] = True
        new_run[1:] = s[1:] > reach[:-1]  # begins after everything before it has ended
        first = np.flatnonzero(new_run)
        self.s = s[first]
        self.e = np.maximum.reduceat(e, first)
        self.cum = np.concatenate([[0.0], np.cumsum(self.e - self.s)])

    @classmethod
    def runs(cls, s: np.ndarray, e: np.ndarray) -> "Coverage":
        """From runs that are already disjoint and sorted."""
        cov = cls.__new__(cls)
        cov.s, cov.e = s, e
        cov.cum = np.concatenate([[0.0], np.cumsum(e - s)])
        return cov

    def minus(self, other: "Coverage") -> "Coverage":
        """The parts of this union that `other` does not cover."""
        if not len(self.s) or not len(other.s):
            return self
        cuts = np.unique(np.concatenate([self.s, self.e, other.s, other.e]))
        lo, hi = cuts[:-1], cuts[1:]
        mid = (lo + hi) / 2
        keep = self._covers(mid) & ~other._covers(mid)
        return Coverage(lo[keep], hi[keep])  # adjacent pieces merge back into runs

    def _covers(self, x: np.ndarray) -> np.ndarray:
        i = np.searchsorted(self.s, x, side="right") - 1
        return (i >= 0) & (self.e[np.clip(i, 0, None)] > x)

    @property
    def total(self) -> float:
        return float(self.cum[-1])

    def within(self, lo: float, hi: float) -> float:
        """Covered length inside [lo, hi]."""
        i = int(np.searchsorted(self.e, lo, side="right"))
        j = int(np.searchsorted(self.s, hi, side="left"))
        if j <= i:
            return 0.0
        total = self.cum[j] - self.cum[i]
        total -= max(0.0, lo - self.s[i])
        total -= max(0.0, self.e[j - 1] - hi)
        return float(max(total, 0.0))


def covered(s: np.ndarray, e: np.ndarray) -> float:
    """Coverage(s, e).total for intervals already sorted by start (stably): the same runs and the same sum, without
    the sort and the prefix array (a row of LaunchedWork asks this four times)."""
    if not len(s):
        return 0.0
    reach = np.maximum.accumulate(e)
    new_run = np.empty(len(s), dtype=bool)
    new_run[0] = True
    new_run[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new_run)
    return float(np.cumsum(np.maximum.reduceat(e, first) - s[first])[-1])

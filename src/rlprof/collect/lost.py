"""Windows lost to faults, said without flooding the training's log: the first window of each kind of fault is one
line naming it and the reason, the next ones a short line each, counted; past LOST_LINES they are only counted, and
the count is said at close. One instance per Profiler (and per verl plugin sampler)."""

from __future__ import annotations

import logging

from ..warn_once import warn_once

log = logging.getLogger("rlprof")

LOST_LINES = 20  # windows lost to one kind of fault said a line each; past them, counted and said at close


class LostWindows:
    def __init__(self, said: set | None = None):
        self.said = said  # warn_once's scope for the first lines (a Profiler's own; None: the process)
        self.by_kind: dict[tuple, list[str]] = {}  # kind of fault -> the windows it failed, in order
        self._told: dict[tuple, int] = {}  # kind -> the count last said

    def lost(self, kind: tuple, window: str, first: str, reason: str) -> None:
        """`window` lost to a fault of `kind`: `first` is its line where it is the first of its kind (the window
        and the reason in full), else a short line with `reason` and the count."""
        windows = self.by_kind.setdefault(kind, [])
        if window in windows:
            return
        windows.append(window)
        if len(windows) == 1:
            warn_once(kind, "%s", first, said=self.said)
        elif len(windows) <= LOST_LINES:
            log.warning("rlprof: window %s failed the same way (%s), %d so far", window, reason, len(windows))

    def say_total(self) -> None:
        """The count of each kind of fault that went past its lines, where it grew since last said (at close, or at
        a step's end)."""
        for kind, windows in self.by_kind.items():
            if len(windows) > max(LOST_LINES, self._told.get(kind, 0)):
                self._told[kind] = len(windows)
                log.warning("rlprof: %d windows in all failed the same way; the last: %s", len(windows), windows[-1])

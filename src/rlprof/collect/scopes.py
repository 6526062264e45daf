"""The contexts the Profiler's hot path hands out: the shared no-op, and the scopes of a selected step, stage and
unit. A stage, tick or mark that nothing selected costs one dict lookup and returns NULL, whose enter/exit are C
builtins: no formatting, no allocation, no environment lookups."""

from __future__ import annotations

import threading

from ..warn_once import warn_once


class _NullContext:
    """Shared no-op context whose entering and leaving run no Python frame: `tuple` (a C type, no descriptor)
    returns the empty tuple as the `as` target; `"".format`, a C builtin taking any arguments, returns ""
    (falsy, so exceptions propagate). The cheapest C callables measured for the two slots (bench/overhead.py)."""

    __slots__ = ()
    __enter__ = tuple
    __exit__ = "".format


NULL = _NullContext()
E2E = object()  # a selected stage's target: mark this stage as a range inside the open end-to-end window


class StepScope:
    __slots__ = ("prof", "n")

    def __init__(self, prof, n: int):
        self.prof, self.n = prof, n

    def __enter__(self):
        self.prof._begin_step(self.n)
        return self.prof

    def __exit__(self, *exc):
        self.prof._end_step(self.n)
        return False


class StageScope:
    __slots__ = ("prof", "name", "target", "window", "opened", "range")

    def __init__(self, prof, name: str, target):
        self.prof, self.name, self.target = prof, name, target
        self.window = self.range = None
        self.opened = False

    def __enter__(self):
        prof = self.prof
        prof._units = {}
        if prof._open:  # a window is already open: the stage is a range inside it
            self.window = prof._open[-1]
            if self.target is not E2E:
                warn_once(
                    "nested",
                    "rlprof: stage %s ran inside an open window; marked as a range there instead of "
                    "a window of its own",
                    self.name,
                    said=prof.said,
                )
        else:
            if self.target is E2E:
                return self
            self.window = prof._open_window(self.target, self.name, (prof._step,))
            self.opened = True
            prof._stage_now[self.name] = None  # entered again this step (a DAPO refill): first one only
            prof._scopes[self.name] = NULL
        self.range = self.window.range("rlprof:stage:" + self.name)
        self.range.__enter__()
        return self

    def __exit__(self, *exc):
        if self.range is not None:
            self.range.__exit__(*exc)
        prof = self.prof
        prof.tick("stage")
        if self.opened:
            prof._close_window(self.window)
        return False


class SelectedStage:
    """What `prof.stage(name)` returns for a stage selected this step: every entry opens a scope of its own
    (per thread, so that threads entering the same stage do not share one)."""

    __slots__ = ("prof", "name", "target", "_local")

    def __init__(self, prof, name: str, target):
        self.prof, self.name, self.target = prof, name, target
        self._local = threading.local()

    def __enter__(self):
        scope = StageScope(self.prof, self.name, self.target)
        self._local.__dict__.setdefault("open", []).append(scope)
        return scope.__enter__()

    def __exit__(self, *exc):
        return self._local.open.pop().__exit__(*exc)


def null() -> _NullContext:
    return NULL


def unit_range_name(unit: str, index: int, args: dict) -> str:
    """`rlprof:<unit>:<index>`, then `|key=value,...` for what the unit holds (sequences, tokens): the analysis
    reads them back from the range name, the one field every backend's ranges keep."""
    name = f"rlprof:{unit}:{index}"
    if args:
        name += "|" + ",".join(f"{k}={v}" for k, v in args.items())
    return name


class UnitScope:
    __slots__ = ("prof", "unit", "range", "args")

    def __init__(self, prof, unit: str, args: dict):
        self.prof, self.unit, self.range, self.args = prof, unit, None, args

    def __enter__(self):
        prof = self.prof
        k = prof._units.get(self.unit, 0)
        prof._units[self.unit] = k + 1
        self.range = prof._open[-1].range(unit_range_name(self.unit, k, self.args))
        self.range.__enter__()
        return self

    def __exit__(self, *exc):
        self.range.__exit__(*exc)
        self.prof.tick(self.unit)
        return False

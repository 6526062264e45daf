"""verl's profiler config as the verl plugin reads it: its schedule dataclasses taught to accept rlprof's keys, and a
key read from any shape verl holds a config in. Standard library and `frameworks` only (the loader imports it)."""

from __future__ import annotations

import dataclasses
import functools

from ...frameworks import verl as facts


def teach_config(module) -> None:
    """verl.utils.profiler.config, just imported: each schedule class accepts the rlprof keys it lacks."""
    for name, keys in facts.SCHEDULE_CLASSES.items():
        cls = getattr(module, name, None)
        if cls is None or not dataclasses.is_dataclass(cls) or getattr(cls.__init__, "_rlprof_accepts", None):
            continue
        own = {f.name for f in dataclasses.fields(cls)}
        extra = tuple(k for k in keys if k not in own)
        if extra:
            cls.__init__ = _accepting(cls.__init__, extra)


def _accepting(init, extra: tuple[str, ...]):
    """The dataclass's own __init__, with rlprof's keys taken out first and kept on the instance (not as fields:
    verl's code never sees them)."""

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        given = {k: kwargs.pop(k) for k in extra if k in kwargs}
        init(self, *args, **kwargs)
        for key, value in given.items():
            setattr(self, key, value)

    __init__._rlprof_accepts = extra
    return __init__


def field(obj, key, default=None):
    """A key of one of verl's configs: a dataclass (verl's BaseConfig), a DictConfig or a dict."""
    if obj is None:
        return default
    if isinstance(obj, dict):
        return obj.get(key, default)
    getter = getattr(obj, "get", None)
    if callable(getter):
        try:
            return getter(key, default)
        except Exception:
            pass
    return getattr(obj, key, default)


def asks_for_sampling(schedule) -> bool:
    """Whether a DistProfiler's schedule asks rlprof for anything: a unit other than verl's own (mini_batch)."""
    unit = field(schedule, "unit")
    return unit is not None and unit != facts.SCHEDULE_UNIT

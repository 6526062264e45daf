"""Collection runtime: Profiler, stage/mark/tick, backends, manifest."""

from .profiler import NULL, Profiler, current, mark, stage, tick

__all__ = ["Profiler", "stage", "mark", "tick", "current", "NULL"]

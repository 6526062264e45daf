"""rlprof: selective, config-driven profiling for RL post-training of LLMs."""

from __future__ import annotations

__version__ = "0.1.0"

from .errors import ConfigError, RLProfError


def __getattr__(name):
    # Imported on first use so that `import rlprof` (the CLI's start, every analysis worker) stays light.
    if name in ("Profiler", "stage", "mark", "tick", "current"):
        from . import collect

        return getattr(collect, name)
    if name == "analyze":  # the analysis package, callable: rlprof.analyze(path) -> Analysis
        import importlib

        return importlib.import_module(".analyze", __name__)
    if name == "Analysis":
        from .analyze.result import Analysis

        return Analysis
    if name in ("ProfilePlan", "load_plan"):
        from . import config

        return getattr(config, name)
    raise AttributeError(name)


__all__ = [
    "analyze",
    "Analysis",
    "Profiler",
    "ProfilePlan",
    "load_plan",
    "stage",
    "mark",
    "tick",
    "current",
    "ConfigError",
    "RLProfError",
    "__version__",
]

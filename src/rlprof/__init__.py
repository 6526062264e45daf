"""rlprof: selective, config-driven profiling for RL post-training of LLMs."""

from __future__ import annotations

__version__ = "0.1.0"

from .config import ProfilePlan, load_plan
from .errors import ConfigError, RLProfError


def __getattr__(name):
    # The runtime imports lazily so that `import rlprof` (and the CLI's dry run) stays light.
    if name in ("Profiler", "stage", "mark", "tick", "current"):
        from . import collect

        return getattr(collect, name)
    raise AttributeError(name)


__all__ = ["Profiler", "ProfilePlan", "load_plan", "stage", "mark", "tick", "current", "ConfigError",
           "RLProfError", "__version__"]

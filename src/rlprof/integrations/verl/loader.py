"""The verl plugin's entry point (`verl.plugins`, or VERL_USE_EXTERNAL_MODULES on verl 0.7.x): on import it hands a
rollout decode window to the vLLM plugin where main_ppo's command line asks for one (`rollout_plan.py`), then waits
for two of verl's modules and wraps them in memory. Until a DistProfiler's config asks for sampling it has imported
nothing but the standard library, `frameworks` and the warn-once helper (a contract in pyproject.toml checks it);
then `sampler.py` takes over that DistProfiler."""

from __future__ import annotations

import functools
import importlib.abc
import os
import sys

from ...warn_once import warn_once
from .config_keys import asks_for_sampling, field, teach_config
from .rollout_plan import engine_keeps_decode_steps, hand_rollout_plan, name_the_run, naming_the_replica


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a function on a module right after its first import, then steps aside (a post-import hook)."""

    def __init__(self, hooks: dict):
        self.hooks = hooks

    def find_spec(self, name, path=None, target=None):
        hook = self.hooks.get(name)
        if hook is None:
            return None
        spec = None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        del self.hooks[name]
        if not self.hooks and self in sys.meta_path:
            sys.meta_path.remove(self)
        spec.loader = _HookedLoader(spec.loader, hook)
        return spec


class _HookedLoader(importlib.abc.Loader):
    def __init__(self, loader, hook):
        self.loader, self.hook = loader, hook

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        _guarded(self.hook, module)

    def __getattr__(self, name):  # get_source, get_resource_reader, ...: the real loader's
        return getattr(self.loader, name)


def _guarded(hook, module) -> None:
    try:
        hook(module)
    except Exception as exc:  # never break verl's import
        warn_once(
            ("attach", module.__name__),
            f"rlprof: the verl plugin could not attach to {module.__name__} "
            f"({type(exc).__name__}: {exc}); verl goes on without it",
        )


def install() -> None:
    """Wrap verl's profiler config, its DistProfiler and main_ppo's v1 trainer now where verl imported them already,
    else right after."""
    hooks = {
        "verl.utils.profiler.config": teach_config,
        "verl.utils.profiler.profile": watch_profilers,
        TRAINER_MODULE: watch_steps,
        AGENT_LOOP_MODULE: watch_samples,
    }
    pending = {}
    for name, hook in hooks.items():
        module = sys.modules.get(name)
        if module is not None:
            _guarded(hook, module)
        else:
            pending[name] = hook
    if pending:
        sys.meta_path.insert(0, _AfterImport(pending))


# main_ppo's driver: global_profiler.trigger (trigger.py)
TRAINER_MODULE = "verl.trainer.ppo.v1.trainer_base"  # the v1 trainer, in main_ppo's driver


def watch_steps(module) -> None:
    """The v1 trainer, just imported: its step boundaries wrapped (a cheap test per step without a trigger)."""
    from .trigger import attach  # a lazy hand-off (ignored, by name, by the light-loader contract)

    attach(module)


# each agent-loop worker: the samples it generates (agent_samples.py)
AGENT_LOOP_MODULE = "verl.experimental.agent_loop.agent_loop"


def watch_samples(module) -> None:
    """verl's agent loop, just imported: its worker's samples recorded where the job watches or profiles a step."""
    from .agent_samples import attach  # a lazy hand-off (ignored, by name, by the light-loader contract)

    attach(module)


def watch_profilers(module) -> None:
    """verl.utils.profiler.profile, just imported: each DistProfiler built looks at its config's schedule."""
    cls = getattr(module, "DistProfiler", None)
    if cls is None or getattr(cls.__init__, "_rlprof_watch", False):
        if cls is None:
            warn_once(
                "no-dist-profiler",
                "rlprof: this verl has no DistProfiler (verl.utils.profiler.profile); "
                "the verl plugin does nothing here",
            )
        return
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        schedule = getattr(getattr(self, "tool_config", None), "schedule", None)
        if schedule is not None:  # the cheap test: most profilers have none, or one without rlprof's unit
            _take_over(self, schedule)

    __init__._rlprof_watch = True
    cls.__init__ = __init__
    build = getattr(module, "build_rollout_dist_profiler", None)
    if callable(build) and not getattr(build, "_rlprof_replica", False):
        module.build_rollout_dist_profiler = naming_the_replica(build)


def _take_over(prof, schedule) -> None:
    """A schedule with rlprof's unit: the sampler (and with it torch, `config` and `collect`) is imported now."""
    if not asks_for_sampling(schedule) or engine_keeps_decode_steps(field(schedule, "unit")):
        return  # mini_batch is verl's own meaning; a rollout server's decode steps are the vLLM plugin's
    try:
        from .sampler import take_over  # the one lazy hand-off (ignored, by name, by the light-loader contract)
    except Exception as exc:
        warn_once(
            ("import", type(exc).__name__),
            f"rlprof: the verl plugin's sampler does not import "
            f"({type(exc).__name__}: {exc}); verl goes on, its own profiler collecting",
        )
        return
    take_over(prof)


def _at_import() -> None:
    try:
        name_the_run(sys.argv[1:], os.environ)
        hand_rollout_plan(sys.argv[1:], os.environ)
    except Exception as exc:  # never break verl's import
        warn_once(
            "hand-plan",
            f"rlprof: the rollout's decode-step plan could not be handed to vLLM "
            f"({type(exc).__name__}: {exc}); verl goes on without it",
        )
    install()


_at_import()

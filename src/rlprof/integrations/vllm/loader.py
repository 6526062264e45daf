"""The vLLM plugin's entry point (`vllm.general_plugins`): `register()`, called by vLLM in every process it starts,
and `step()`, the host's way to say a training step. With no plan in the environment both cost one lookup; this
module imports nothing but the standard library and rlprof's ground, and hands over to `engine_hooks.py` only when a
plan is set (a contract in pyproject.toml checks it)."""

from __future__ import annotations

import os
from contextlib import contextmanager

from ...errors import ConfigError
from ...warn_once import warn_once
from .environment import ENV_PLAN


def register() -> None:
    """The entry point. Nothing to do (the common case) costs one environment lookup."""
    spec = os.environ.get(ENV_PLAN)
    if not spec:
        return
    try:
        from .engine_hooks import install  # the lazy hand-off (ignored, by name, by the light-loader contract)
        from .settings import engine_settings

        settings = engine_settings(spec)
        if settings is not None:
            install(settings)
    except ConfigError as exc:
        warn_once(None, f"rlprof: {ENV_PLAN}: {exc}; vLLM generates without rlprof", inherit=True)
    except Exception as exc:  # the host goes on whatever happens here
        warn_once(
            None,
            f"rlprof: the vLLM plugin could not start: {type(exc).__name__}: {exc}; vLLM generates without rlprof",
            inherit=True,
        )


@contextmanager
def step(llm, n: int, trigger: dict | None = None):
    """`with step(llm, n): llm.generate(...)`: step n of training, said by the host (an `LLM` or anything with
    vLLM's collective_rpc). Without the plugin active in the engine it does nothing but two no-op calls.
    `trigger`: the host's trigger armed a capture of this step's rollout (`prof.delegated("rollout_generate")` of
    the host's Profiler): the engine's worker takes it, its decode steps as units, the row in its manifest row."""
    rpc = getattr(llm, "collective_rpc", None)
    if rpc is None or not os.environ.get(ENV_PLAN):
        yield
        return
    from .engine_hooks import began, ended, front_end_step

    rpc(began, args=(n, "driver", trigger))
    front_end_step(n)
    try:
        yield
    finally:
        rpc(ended, args=("driver",))
        front_end_step(None)

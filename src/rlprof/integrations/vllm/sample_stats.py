"""The vLLM plugin's sample records, in the engine's front end (the process holding `LLM` / `AsyncLLM`): each
finished request, as vLLM's own stats give it (collect/vllm_samples.py), written to
`<save_path>/<run_id>/samples/vllm_replica<K>.jsonl` for each step the plan watches (a trigger) or profiles on this
replica. Only while vLLM's stats are on (`disable_log_stats=False`): with them off vLLM builds no stat logger.

The step, in the front end, comes from the same source as the worker's windows (`RLPROF_VLLM_STEPS`):
- `driver`: the host's `with step(llm, n)` (loader.py), in this process;
- `profile_calls`: the front end's start_profile / stop_profile, the step read from the profile prefix (`stepN`) or
  the k-th call's step, as the worker reads it (session.py);
- `rounds`: each busy period of the engine is one step, counted here from vLLM's own scheduler stats (requests
  running or waiting after an iteration), as the engine core counts them (engine_hooks.py).
"""

from __future__ import annotations

import functools
import os
import weakref

from ...collect.samples import SampleWriter
from ...collect.vllm_samples import EngineSamples, install as install_stat_logger
from ...warn_once import warn_once
from .session import STEP_IN_PREFIX

_live: "weakref.WeakSet[FrontEndSamples]" = weakref.WeakSet()  # this process's engines' samples


class FrontEndSamples(EngineSamples):
    """One engine's finished requests in its front end, recorded for the steps the plan wants."""

    def __init__(self, settings, vllm_config, engine_index: int):
        replica = settings.replica + engine_index  # data-parallel engines behind one front end: one replica each
        run_dir = os.path.join(settings.rollout.save_path, os.environ.get("RLPROF_RUN_ID") or "run")
        super().__init__(SampleWriter(run_dir, "vllm", replica=replica), replica=replica)
        self.settings = settings
        vllm_profiles = getattr(getattr(vllm_config, "profiler_config", None), "profiler", None) is not None
        self.source = settings.source if settings.source != "auto" else ("profile_calls" if vllm_profiles else "rounds")
        self.busy = False
        self.rounds = 0
        self.calls = 0  # start_profile calls seen (profile_calls)
        _live.add(self)

    def wanted(self, step: int | None) -> bool:
        return step is not None and (self.settings.plan.trigger is not None or self.settings.selected(step))

    def say(self, step: int | None, source: str) -> None:
        """Step `step` begins (None: the step ends), said by `source`."""
        if source == "driver":
            self.source = "driver"  # the host says the steps from now on
        elif source != self.source:
            return
        if step is not None and self.wanted(step):
            self.begin(step)
        else:
            self.end()

    def iteration(self, scheduler_stats, iteration_stats) -> None:
        if self.source != "rounds":
            super().iteration(scheduler_stats, iteration_stats)
            return
        running = _running(scheduler_stats)
        finished = bool(getattr(iteration_stats, "finished_requests", None))
        if not self.busy and (running or finished):
            self.busy = True
            self.rounds += 1
            self.say(self.rounds, "rounds")
        super().iteration(scheduler_stats, iteration_stats)
        if self.busy and scheduler_stats is not None and not running:
            self.busy = False
            self.say(None, "rounds")

    def profile_call(self, start: bool, prefix: str | None) -> None:
        if start:
            m = STEP_IN_PREFIX.search(prefix or "")
            steps = self.settings.steps
            step = int(m.group(1)) if m else (steps[self.calls] if self.calls < len(steps) else None)
            self.calls += 1
            self.say(step, "profile_calls")
        else:
            self.say(None, "profile_calls")


def _running(scheduler_stats) -> int:
    if scheduler_stats is None:
        return 0
    return int(getattr(scheduler_stats, "num_running_reqs", 0)) + int(getattr(scheduler_stats, "num_waiting_reqs", 0))


def install(settings, version: str) -> None:
    """In every process the plugin runs in (it matters in the front end, where vLLM builds its stat loggers). An
    engine whose stats are off builds none: it records no sample, silently (its decode-step windows are taken as
    ever; docs/vllm.md says to set disable_log_stats=False)."""
    if not install_stat_logger(lambda vllm_config, engine_index: FrontEndSamples(settings, vllm_config, engine_index)):
        return
    if settings.source not in ("auto", "profile_calls"):
        return
    try:
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.engine.llm_engine import LLMEngine
    except ImportError as exc:
        warn_once(None, f"rlprof: vLLM {version}: {exc}; sample records follow rounds, not profile calls", inherit=True)
        return
    if settings.source not in ("auto", "profile_calls"):
        return
    for cls in (LLMEngine, AsyncLLM):
        for name, start in (("start_profile", True), ("stop_profile", False)):
            method = getattr(cls, name, None)
            if callable(method) and not getattr(method, "_rlprof_samples", False):
                setattr(cls, name, _telling(method, start))


def said_by_driver(step: int | None) -> None:
    """The host's `with step(llm, n)` in this process (loader.step): every engine's front end here follows."""
    for samples in list(_live):
        samples.say(step, "driver")


def _telling(original, start: bool):
    """LLMEngine's / AsyncLLM's start_profile or stop_profile, telling this process's engines' samples first."""

    @functools.wraps(original)
    def call(self, *args, **kwargs):
        try:
            prefix = args[0] if args else kwargs.get("profile_prefix")
            for samples in list(_live):
                samples.profile_call(start, prefix)
        except Exception as exc:
            warn_once(None, f"rlprof: sample records: {type(exc).__name__}: {exc}", inherit=True)
        return original(self, *args, **kwargs)

    call._rlprof_samples = True
    return call

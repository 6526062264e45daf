"""rlprof inside vLLM: the `vllm.general_plugins` entry point (installed with rlprof; no vLLM file changes).

vLLM calls `register()` in every process it starts: the front end, the EngineCore and each worker (vllm-ascend's
NPU worker alike). With no plan in the environment it returns at once and costs nothing. Given one
(`RLPROF_PLAN`: a config file and/or `key=value` overrides, in any of rlprof's dialects; verl's rollout keys
with verl's meaning), each worker of a selected replica runs rlprof's Profiler (role rollout) and drives the
`decode_step` unit from its own execute loop: one unit per engine iteration that computes tokens, from
`execute_model` to the end of `sample_tokens`, its range naming what the scheduler gave it (rows still generating,
the round's rows, tokens computed, and the prefill part of both). `{unit: decode_step, wait: 29, warmup: 1,
active: 30}` records engine iterations 30-59 of a profiled step, on the torch tool with CUDA activity on a GPU,
the npu tool on vllm-ascend, markers anywhere.

What a step is (`RLPROF_VLLM_STEPS`, default `auto`):
- `profile_calls`: vLLM's own start_profile / stop_profile open and close the window (what verl's rollout servers
  call around each profiled step, and any user's `llm.start_profile()` or `POST /start_profile`); the k-th call is
  the plan's k-th profiled step, or step N when the call's profile prefix holds `stepN`. vLLM's own torch profiler
  is not started on a replica rlprof profiles (one process cannot hold two).
- `rounds`: each busy period of the engine (requests arrive after idle, until none is left) is one step, counted
  from 1: one `llm.generate(...)` per training step.
- `driver`: the host says it, `with step(llm, n): llm.generate(...)` (rlprof's trainer does).
- `auto`: `profile_calls` where vLLM's own profiler is configured (verl configures it when its rollout profiler
  is on), else `rounds`; a `step()` call from the host takes over either way.

Other variables: `RLPROF_REPLICA` (this engine's replica index, default 0), `RLPROF_RUN_ID` (one run directory
for every replica; set here for the processes this one starts when absent). A fault inside is one warning and
generation goes on; a vLLM release outside the one layout this relies on is one warning and no patching.
"""

from __future__ import annotations

import functools
import os
import shlex
from contextlib import contextmanager

from ..errors import ConfigError

ENV_PLAN = "RLPROF_PLAN"
ENV_REPLICA = "RLPROF_REPLICA"
ENV_STEPS = "RLPROF_VLLM_STEPS"
STEP_SOURCES = ("auto", "profile_calls", "rounds", "driver")


def _say(message: str, about: str | None = None) -> None:
    from ..collect.vllm_worker import say

    say(message, about)


def register() -> None:
    """The entry point. Nothing to do (the common case) costs one environment lookup."""
    spec = os.environ.get(ENV_PLAN)
    if not spec:
        return
    try:
        settings = engine_settings(spec)
        if settings is not None:
            _install(settings)
    except ConfigError as exc:
        _say(f"{ENV_PLAN}: {exc}; vLLM generates without rlprof")
    except Exception as exc:  # the host goes on whatever happens here
        _say(f"the vLLM plugin could not start: {type(exc).__name__}: {exc}; vLLM generates without rlprof")


# ---- the plan, as an engine reads it --------------------------------------------------------------------------
class EngineSettings:
    """What every process of one engine agrees on: the plan, the rollout role's part, the replica, the step source."""

    def __init__(self, plan, replica: int, source: str):
        self.plan, self.replica, self.source = plan, replica, source
        self.rollout = plan.role("rollout")
        self.steps = tuple(sorted(self.rollout.steps))

    def selected(self, step: int | None) -> bool:
        return step is not None and step in self.rollout.steps


def engine_settings(spec: str, environ=os.environ) -> EngineSettings | None:
    """The plan `RLPROF_PLAN` names, checked for what an engine can honour; None where it collects nothing on this
    replica. Raises ConfigError (one line naming the key) on anything the engine cannot do."""
    import msgspec

    from ..config import load_plan
    from ..config.source import split_config_args

    try:
        args = shlex.split(spec)
    except ValueError as exc:
        raise ConfigError(ENV_PLAN, spec, "a config file and/or key=value overrides, shell-quoted",
                          problem=f"does not split into arguments ({exc})") from None
    path, overrides = split_config_args(args)
    plan = load_plan(path, overrides)
    replica = _replica(environ.get(ENV_REPLICA, "0"))
    source = environ.get(ENV_STEPS, "auto").strip() or "auto"
    if source not in STEP_SOURCES:
        raise ConfigError(ENV_STEPS, source, ", ".join(STEP_SOURCES))
    check_engine_plan(plan)
    plan = msgspec.structs.replace(plan, async_rollout=True)  # an engine is a replica: rollout ranks are replicas
    rollout = plan.role("rollout")
    # with a trigger, the host's decision may capture any step here: the replicas the rollout selects listen
    follows = (plan.trigger is not None and rollout.enabled and rollout.tool is not None
               and (rollout.all_ranks or replica in rollout.ranks))
    if not ((rollout.collects_on(replica) or follows) and "rollout_generate" in rollout.stages):
        return None
    return EngineSettings(plan, replica, source)


def check_engine_plan(plan) -> None:
    """What no inference engine can honour, refused in one line naming the key."""
    from .engines import check_rollout_schedule

    check_rollout_schedule(plan.role("rollout"))


def _replica(value: str) -> int:
    try:
        replica = int(value)
    except ValueError:
        replica = -1
    if replica < 0:
        raise ConfigError(ENV_REPLICA, value, "an integer >= 0 (this engine's replica index)")
    return replica


# ---- patching vLLM, in memory ---------------------------------------------------------------------------------
def _install(settings: EngineSettings) -> None:
    import vllm

    from ..frameworks.engines import PLUGIN_VERSIONS, plugin_supports

    version = getattr(vllm, "__version__", "unknown")
    if not plugin_supports(version):
        lo, hi = (".".join(map(str, v)) for v in PLUGIN_VERSIONS)
        _say(f"vLLM {version} is outside the releases the plugin knows ({lo}-{hi}.x); nothing is patched and "
             "nothing is collected in vLLM")
        return
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    if not callable(getattr(WorkerWrapperBase, "init_device", None)):
        _say(f"vLLM {version}'s WorkerWrapperBase has no init_device; nothing is patched and nothing is collected")
        return
    if getattr(WorkerWrapperBase.init_device, "_rlprof", None) is None:
        WorkerWrapperBase.init_device = _after_init_device(WorkerWrapperBase.init_device, settings, version)
    if settings.source in ("auto", "rounds"):
        from vllm.v1.engine.core import EngineCore

        for name in ("step", "step_with_batch_queue"):
            method = getattr(EngineCore, name, None)
            if callable(method) and getattr(method, "_rlprof", None) is None:
                setattr(EngineCore, name, _counting_rounds(method, settings))
    os.environ.setdefault("RLPROF_RUN_ID", _new_run_id())  # the EngineCore and workers started from here share it


def _new_run_id() -> str:
    from ..collect.naming import new_run_id

    return new_run_id()


def _after_init_device(original, settings: EngineSettings, version: str):
    @functools.wraps(original)
    def init_device(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        try:
            from .vllm_session import EngineSession

            EngineSession.attach(self, settings, version)
        except Exception as exc:
            _say(f"could not attach to vLLM's worker: {type(exc).__name__}: {exc}; this worker is not profiled")
        return out

    init_device._rlprof = settings
    return init_device


def _counting_rounds(original, settings: EngineSettings):
    """EngineCore.step(_with_batch_queue) that tells the workers when a round of requests begins and ends."""

    @functools.wraps(original)
    def step(self, *args, **kwargs):
        rounds = self.__dict__.get("_rlprof_rounds")
        if rounds is None:
            rounds = self._rlprof_rounds = _Rounds(self, settings)
        if rounds.on and not rounds.busy and self.scheduler.has_unfinished_requests():
            rounds.begin()
        out = original(self, *args, **kwargs)
        if rounds.busy and not self.scheduler.has_unfinished_requests():
            rounds.end()
        return out

    step._rlprof = settings
    return step


class _Rounds:
    """The EngineCore's count of busy periods: round k is step k; only selected rounds reach the workers."""

    def __init__(self, core, settings: EngineSettings):
        self.core, self.settings = core, settings
        profiler_config = getattr(core.vllm_config, "profiler_config", None)
        vllm_profiles = getattr(profiler_config, "profiler", None) is not None
        self.on = settings.source == "rounds" or (settings.source == "auto" and not vllm_profiles)
        self.busy, self.count = False, 0

    def begin(self) -> None:
        self.busy = True
        self.count += 1
        if self.settings.selected(self.count):
            self.core.model_executor.collective_rpc(_began, args=(self.count, "rounds"))

    def end(self) -> None:
        self.busy = False
        if self.settings.selected(self.count):
            self.core.model_executor.collective_rpc(_ended, args=("rounds",))


def _session(worker_wrapper):
    return getattr(worker_wrapper, "_rlprof_session", None)


def _began(worker_wrapper, step: int, source: str, trigger: dict | None = None) -> None:
    """In a worker (vLLM's collective_rpc): step `step` begins, said by `source` (rounds, driver); `trigger`: the
    host's trigger captures this step's rollout here."""
    session = _session(worker_wrapper)
    if session is not None:
        session.begin(step, source, trigger)


def _ended(worker_wrapper, source: str) -> None:
    session = _session(worker_wrapper)
    if session is not None:
        session.end(source)


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
    rpc(_began, args=(n, "driver", trigger))
    try:
        yield
    finally:
        rpc(_ended, args=("driver",))

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
import logging
import os
import re
import shlex
import zlib
from contextlib import contextmanager

from ..errors import ConfigError

ENV_PLAN = "RLPROF_PLAN"
ENV_REPLICA = "RLPROF_REPLICA"
ENV_STEPS = "RLPROF_VLLM_STEPS"
ENV_SAID = "RLPROF_VLLM_SAID"  # a warning said in this process is not said again by the processes it starts
STEP_SOURCES = ("auto", "profile_calls", "rounds", "driver")
STEP_IN_PREFIX = re.compile(r"step(\d+)")

log = logging.getLogger("rlprof")


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


def _say(message: str, about: str | None = None) -> None:
    """One warning per message (or per `about`) for the whole engine: the processes vLLM starts after this one
    inherit the mark."""
    said = os.environ.get(ENV_SAID, "")
    key = format(zlib.crc32((about or message).encode()), "x")  # the same in every process (hash() is salted)
    if key in said.split(","):
        return
    os.environ[ENV_SAID] = f"{said},{key}" if said else key
    log.warning("rlprof: %s", message)


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
    if not (rollout.collects_on(replica) and "rollout_generate" in rollout.stages):
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
            self.core.model_executor.collective_rpc(_round_began, args=(self.count,))

    def end(self) -> None:
        self.busy = False
        if self.settings.selected(self.count):
            self.core.model_executor.collective_rpc(_round_ended)


def _session(worker_wrapper) -> "EngineSession | None":
    return getattr(worker_wrapper, "_rlprof_session", None)


def _round_began(worker_wrapper, step: int) -> None:
    session = _session(worker_wrapper)
    if session is not None:
        session.begin(step, "rounds")


def _round_ended(worker_wrapper) -> None:
    session = _session(worker_wrapper)
    if session is not None:
        session.end("rounds")


def _driver_began(worker_wrapper, step: int) -> None:
    session = _session(worker_wrapper)
    if session is not None:
        session.begin(step, "driver")


def _driver_ended(worker_wrapper) -> None:
    session = _session(worker_wrapper)
    if session is not None:
        session.end("driver")


@contextmanager
def step(llm, n: int):
    """`with step(llm, n): llm.generate(...)`: step n of training, said by the host (an `LLM` or anything with
    vLLM's collective_rpc). Without the plugin active in the engine it does nothing but two no-op calls."""
    rpc = getattr(llm, "collective_rpc", None)
    if rpc is None or not os.environ.get(ENV_PLAN):
        yield
        return
    rpc(_driver_began, args=(n,))
    try:
        yield
    finally:
        rpc(_driver_ended)


# ---- inside one worker ---------------------------------------------------------------------------------------
class _Iterations:
    """The worker's execute loop as decode-step units: execute_model(scheduler_output) opens one where a window is
    open (`recording`), the end of sample_tokens closes it. Subclasses say where the units go."""

    def __init__(self, unit):
        self.unit_of = unit  # (**held) -> a decode_step unit context (rlprof's Profiler.unit)
        self.unit = None  # the decode step's range in flight
        self.round_rows: set = set()
        self.details = _iteration_details()

    def recording(self) -> bool:
        raise NotImplementedError

    def instrument(self, worker, version: str) -> bool:
        """Wrap the worker's model runner (instance attributes: vLLM's classes stay as they are)."""
        runner = getattr(worker, "model_runner", None)
        missing = [m for m in ("execute_model", "sample_tokens") if not callable(getattr(runner, m, None))]
        if missing:
            _say(f"vLLM {version}'s worker {type(worker).__name__} has no model_runner.{'/'.join(missing)}; "
                 "nothing is patched and nothing is collected in this worker")
            return False
        runner.execute_model = self.wrap_execute(runner.execute_model)
        runner.sample_tokens = self.wrap_sample(runner.sample_tokens)
        return True

    def wrap_execute(self, original):
        @functools.wraps(original)
        def execute_model(scheduler_output, *args, **kwargs):
            if self.recording():
                self._open_unit(scheduler_output)
            try:
                out = original(scheduler_output, *args, **kwargs)
            except BaseException:
                self._close_unit()
                raise
            if out is not None:  # no sample_tokens follows (an empty or pooling iteration, a non-last PP rank)
                self._close_unit()
            return out

        return execute_model

    def wrap_sample(self, original):
        @functools.wraps(original)
        def sample_tokens(*args, **kwargs):
            try:
                return original(*args, **kwargs)
            finally:
                if self.unit is not None:
                    self._close_unit()

        return sample_tokens

    def _open_unit(self, scheduler_output) -> None:
        self._close_unit()
        try:
            held = self.details(scheduler_output, self.round_rows)
            if held is None:
                return
            unit = self.unit_of(**held)
            unit.__enter__()
            self.unit = unit
        except Exception as exc:
            _say(f"could not mark a decode step: {type(exc).__name__}: {exc}; this step's units are not marked")
            self.unit = None

    def _close_unit(self) -> None:
        unit, self.unit = self.unit, None
        if unit is not None:
            try:
                unit.__exit__(None, None, None)
            except Exception as exc:
                _say(f"could not close a decode step: {type(exc).__name__}: {exc}")


class EngineSession(_Iterations):
    """rlprof's own Profiler in one vLLM worker (role rollout, this replica), its steps from the step source."""

    @classmethod
    def attach(cls, worker_wrapper, settings: EngineSettings, version: str) -> None:
        worker = worker_wrapper.worker
        session = cls(worker, settings, version)
        if not session.instrument(worker, version):
            return
        worker_wrapper._rlprof_session = session
        if callable(getattr(worker, "profile", None)):
            worker.profile = session.wrap_profile(worker.profile)

    def __init__(self, worker, settings: EngineSettings, version: str):
        from ..collect import Profiler
        from ..collect.engine import RlprofEngineProfiler

        self.settings = settings
        config = worker.vllm_config
        parallel = config.parallel_config
        tp, pp = parallel.tensor_parallel_size, parallel.pipeline_parallel_size
        rank = int(getattr(worker, "rank", 0))
        size = tp * pp
        profiler_config = getattr(config, "profiler_config", None)
        vllm_profiles = getattr(profiler_config, "profiler", None) is not None
        self.source = settings.source if settings.source != "auto" else ("profile_calls" if vllm_profiles
                                                                         else "rounds")
        self.profiler = Profiler(settings.plan, rank=settings.replica * size + rank, world_size=size,
                                 role="rollout", replica=settings.replica, run_id=os.environ.get("RLPROF_RUN_ID"),
                                 tags={"engine": "vllm", "engine_version": version, "engine_tp_rank": rank % tp,
                                       "engine_pp_rank": rank // tp, "pid": os.getpid()})
        self.engine = RlprofEngineProfiler(self.profiler)
        super().__init__(self.engine.decode_step)
        self.step: int | None = None  # the step whose window is open here
        self.calls = 0  # start_profile calls seen (profile_calls)
        if self.source == "profile_calls" and vllm_profiles:
            _say(f"on replica {settings.replica}, vLLM's start_profile/stop_profile open and close rlprof's windows "
                 f"(steps {', '.join(map(str, settings.steps))}); vLLM's own torch profiler is not started there")

    def recording(self) -> bool:
        return self.step is not None

    # steps
    def begin(self, step: int, source: str) -> None:
        if source == "driver":
            self.source = "driver"  # the host says the steps from now on
        elif source != self.source:
            return
        self.end(source)
        if self.settings.selected(step):
            self.round_rows = set()
            self.step = step
            try:
                self.engine.start_profile(step)
            except Exception as exc:  # the Profiler marks backend faults itself; this is anything else
                self.step = None
                _say(f"could not open step {step}'s window: {type(exc).__name__}: {exc}; generation goes on",
                     about=f"open {type(exc).__name__}")

    def end(self, source: str) -> None:
        if source != self.source or self.step is None:
            return
        self._close_unit()
        step, self.step = self.step, None
        try:
            self.engine.stop_profile()
        except Exception as exc:
            _say(f"could not close step {step}'s window: {type(exc).__name__}: {exc}; generation goes on",
                 about=f"close {type(exc).__name__}")

    def wrap_profile(self, original):
        @functools.wraps(original)
        def profile(is_start: bool = True, profile_prefix: str | None = None, **kwargs):
            if self.source != "profile_calls":
                return original(is_start, profile_prefix, **kwargs)
            if is_start:
                m = STEP_IN_PREFIX.search(profile_prefix or "")
                steps = self.settings.steps
                step = int(m.group(1)) if m else (steps[self.calls] if self.calls < len(steps) else None)
                self.calls += 1
                if step is not None:
                    self.begin(step, "profile_calls")
            else:
                self.end("profile_calls")
            return None

        return profile


class HostSession(_Iterations):
    """An engine inside a process that already profiles (rlprof's trainer with `rollout.engine=vllm`): its
    iterations become decode-step units of the host's Profiler, in whatever window the host has open."""

    def __init__(self, profiler):
        super().__init__(lambda **held: profiler.unit("decode_step", **held))
        self.profiler = profiler

    def recording(self) -> bool:
        return self.profiler.recording

    def new_round(self) -> None:
        """A generate call begins: `seqs` counts this call's rows."""
        self.round_rows = set()


def attach_host(worker_wrapper, profiler) -> HostSession | None:
    """For `llm.collective_rpc(attach_host, args=(profiler,))` on an in-process engine: mark its iterations in the
    host's Profiler. Returns the session (None where this vLLM's worker has another layout: one warning)."""
    import vllm

    session = HostSession(profiler)
    return session if session.instrument(worker_wrapper.worker, getattr(vllm, "__version__", "unknown")) else None


def _iteration_details():
    """scheduler_output -> what the iteration holds, counted as vLLM's own annotation counts it (its
    compute_iteration_details where present); None for an iteration that computes no token."""
    try:
        from vllm.v1.utils import compute_iteration_details
    except ImportError:
        compute_iteration_details = None

    def held(scheduler_output, round_rows: set) -> dict | None:
        scheduled = scheduler_output.num_scheduled_tokens
        tokens = scheduler_output.total_num_scheduled_tokens
        if not tokens:
            return None
        round_rows.update(scheduled)
        if compute_iteration_details is not None:
            d = compute_iteration_details(scheduler_output)
            prefill_seqs, prefill_tokens = d.num_ctx_requests, d.num_ctx_tokens
        else:
            new = {r.req_id for r in scheduler_output.scheduled_new_reqs}
            prefill_seqs = len(new)
            prefill_tokens = sum(scheduled[r] for r in new if r in scheduled)
        return {"active": len(scheduled), "seqs": len(round_rows), "tokens": tokens,
                "prefill_seqs": prefill_seqs, "prefill_tokens": prefill_tokens}

    return held

"""rlprof's own Profiler in one vLLM worker, for the plugin (`engine_hooks.py` attaches it): imported only where a
plan selects this replica, so that an inactive plugin loads nothing but its entry module."""

from __future__ import annotations

import functools
import os
import re

from ...collect import Profiler
from ...collect.engine import RlprofEngineProfiler
from ...collect.vllm_worker import Iterations, engine_model
from ...warn_once import warn_once

STEP_IN_PREFIX = re.compile(r"step(\d+)")  # a start_profile prefix naming its step
# ... and a capture that main_ppo's driver armed (integrations/verl/trigger.py: rollout_prefix)
TRIGGER_IN_PREFIX = re.compile(r"\.rlprof-([a-z]+)-(\d+)-(\w+)$")


class EngineSession(Iterations):
    """rlprof's own Profiler in one vLLM worker (role rollout, this replica), its steps from the step source."""

    @classmethod
    def attach(cls, worker_wrapper, settings, version: str) -> None:
        worker = worker_wrapper.worker
        session = cls(worker, settings, version)
        if not session.instrument(worker, version):
            return
        worker_wrapper._rlprof_session = session
        if callable(getattr(worker, "profile", None)):
            worker.profile = session.wrap_profile(worker.profile)

    def __init__(self, worker, settings, version: str):
        self.settings = settings
        config = worker.vllm_config
        parallel = config.parallel_config
        tp, pp = parallel.tensor_parallel_size, parallel.pipeline_parallel_size
        rank = int(getattr(worker, "rank", 0))
        size = tp * pp
        profiler_config = getattr(config, "profiler_config", None)
        vllm_profiles = getattr(profiler_config, "profiler", None) is not None
        self.source = settings.source if settings.source != "auto" else ("profile_calls" if vllm_profiles else "rounds")
        self.profiler = Profiler(
            settings.plan,
            rank=settings.replica * size + rank,
            world_size=size,
            role="rollout",
            replica=settings.replica,
            run_id=os.environ.get("RLPROF_RUN_ID"),
            decides=False,  # with a trigger, the host decides (loader.step's trigger)
            tags={
                "engine": "vllm",
                "engine_version": version,
                "engine_tp_rank": rank % tp,
                "engine_pp_rank": rank // tp,
                "pid": os.getpid(),
                "model": engine_model(config),
            },
        )
        self.engine = RlprofEngineProfiler(self.profiler)
        super().__init__(self.engine.decode_step)
        self.step: int | None = None  # the step whose window is open here
        self.calls = 0  # start_profile calls seen (profile_calls)
        if self.source == "profile_calls" and vllm_profiles:
            steps = ", ".join(map(str, settings.steps)) or "none listed"
            triggered = "; and the steps the host's trigger captures" if settings.plan.trigger is not None else ""
            warn_once(
                None,
                f"rlprof: on replica {settings.replica}, vLLM's start_profile/stop_profile open and close "
                f"rlprof's windows (steps {steps}{triggered}); vLLM's own torch profiler is not started there",
                inherit=True,
            )

    def recording(self) -> bool:
        return self.step is not None

    # steps
    def begin(self, step: int, source: str, trigger: dict | None = None) -> None:
        if source == "driver":
            self.source = "driver"  # the host says the steps from now on
        elif source != self.source:
            return
        self.end(source)
        if self.settings.selected(step) or trigger is not None:
            self.round_rows = set()
            self.step = step
            try:
                self.engine.start_profile(step, trigger)
            except Exception as exc:  # the Profiler marks backend faults itself; this is anything else
                self.step = None
                warn_once(
                    f"open {type(exc).__name__}",
                    f"rlprof: could not open step {step}'s window: {type(exc).__name__}: {exc}; generation goes on",
                    inherit=True,
                )

    def end(self, source: str) -> None:
        if source != self.source or self.step is None:
            return
        self._close_unit()
        step, self.step = self.step, None
        try:
            self.engine.stop_profile()
        except Exception as exc:
            warn_once(
                f"close {type(exc).__name__}",
                f"rlprof: could not close step {step}'s window: {type(exc).__name__}: {exc}; generation goes on",
                inherit=True,
            )

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
                armed = TRIGGER_IN_PREFIX.search(profile_prefix or "")
                trigger = None
                if armed and step is not None and not self.settings.selected(step):
                    trigger = {
                        "reason": armed.group(1),
                        "step": int(armed.group(2)),
                        "stage": armed.group(3),
                        "rank": None,
                        "seconds": None,
                        "baseline_seconds": None,
                    }
                if step is not None:
                    self.begin(step, "profile_calls", trigger)
            else:
                self.end("profile_calls")
            return None

        return profile

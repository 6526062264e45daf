"""vLLM's classes patched in memory where a plan is set: each worker's init_device attaches rlprof's session
(`session.py`) to the worker of a selected replica, and, where rounds of requests are the steps, the EngineCore
tells the workers when a round begins and ends. A vLLM release outside the one layout this relies on is one warning
and no patching."""

from __future__ import annotations

import functools
import os

from ...collect.naming import new_run_id
from ...frameworks.engines import PLUGIN_VERSIONS, plugin_supports
from ...warn_once import warn_once
from .settings import EngineSettings


def install(settings: EngineSettings) -> None:
    import vllm

    version = getattr(vllm, "__version__", "unknown")
    if not plugin_supports(version):
        lo, hi = (".".join(map(str, v)) for v in PLUGIN_VERSIONS)
        warn_once(
            None,
            f"rlprof: vLLM {version} is outside the releases the plugin knows ({lo}-{hi}.x); nothing is "
            "patched and nothing is collected in vLLM",
            inherit=True,
        )
        return
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    if not callable(getattr(WorkerWrapperBase, "init_device", None)):
        warn_once(
            None,
            f"rlprof: vLLM {version}'s WorkerWrapperBase has no init_device; nothing is patched and "
            "nothing is collected",
            inherit=True,
        )
        return
    if getattr(WorkerWrapperBase.init_device, "_rlprof", None) is None:
        WorkerWrapperBase.init_device = _after_init_device(WorkerWrapperBase.init_device, settings, version)
    if settings.source in ("auto", "rounds"):
        from vllm.v1.engine.core import EngineCore

        for name in ("step", "step_with_batch_queue"):
            method = getattr(EngineCore, name, None)
            if callable(method) and getattr(method, "_rlprof", None) is None:
                setattr(EngineCore, name, _counting_rounds(method, settings))
    os.environ.setdefault("RLPROF_RUN_ID", new_run_id())  # the EngineCore and workers started from here share it
    from .sample_stats import install as record_samples

    record_samples(settings, version)  # in the front end, while vLLM's stats are on: each finished request


def _after_init_device(original, settings: EngineSettings, version: str):
    @functools.wraps(original)
    def init_device(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        try:
            from .session import EngineSession

            EngineSession.attach(self, settings, version)
        except Exception as exc:
            warn_once(
                None,
                f"rlprof: could not attach to vLLM's worker: {type(exc).__name__}: {exc}; this worker is not profiled",
                inherit=True,
            )
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
            self.core.model_executor.collective_rpc(began, args=(self.count, "rounds"))

    def end(self) -> None:
        self.busy = False
        if self.settings.selected(self.count):
            self.core.model_executor.collective_rpc(ended, args=("rounds",))


def _session(worker_wrapper):
    return getattr(worker_wrapper, "_rlprof_session", None)


def began(worker_wrapper, step: int, source: str, trigger: dict | None = None) -> None:
    """In a worker (vLLM's collective_rpc): step `step` begins, said by `source` (rounds, driver); `trigger`: the
    host's trigger captures this step's rollout here."""
    session = _session(worker_wrapper)
    if session is not None:
        session.begin(step, source, trigger)


def front_end_step(step: int | None) -> None:
    """The host says step `step` begins (None: it ended), in the front end's own process (loader.step)."""
    from .sample_stats import said_by_driver

    said_by_driver(step)


def ended(worker_wrapper, source: str) -> None:
    session = _session(worker_wrapper)
    if session is not None:
        session.end(source)

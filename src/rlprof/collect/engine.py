"""Inference-engine adapters: an engine that runs in its own process(es) profiles itself on the plan.

The driver decides which replicas profile which steps (rollout ranks are replica indices in async
mode) and calls start_profile / stop_profile on those replicas' adapters only.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Protocol

from ..config.plan import ProfilePlan


class EngineProfiler(Protocol):
    def start_profile(self, step: int) -> None: ...

    def stop_profile(self) -> None: ...


def replica_profiles(plan: ProfilePlan, replica: int, step: int) -> bool:
    """Whether the driver should ask this rollout replica to profile this step."""
    rollout = plan.role("rollout")
    return rollout.collects_on(replica) and step in rollout.steps and "rollout_generate" in rollout.stages


class RlprofEngineProfiler:
    """rlprof's own rollout engine: a Profiler in the replica process, opened around one generate call."""

    def __init__(self, profiler):
        self.profiler = profiler
        self._scopes: ExitStack | None = None

    def start_profile(self, step: int, trigger: dict | None = None) -> None:
        """`trigger`: the host's trigger captures this step here (the row the window's manifest row carries)."""
        self.stop_profile()
        if trigger is not None:
            self.profiler.arm(step, "rollout_generate", trigger)
        scopes = ExitStack()
        scopes.enter_context(self.profiler.step(step))
        scopes.enter_context(self.profiler.stage("rollout_generate"))
        self._scopes = scopes

    def decode_step(self, **held: int):
        """One decode step's range; `held`: active / seqs, the rows still generating and the batch's rows."""
        return self.profiler.unit("decode_step", **held)

    def stop_profile(self) -> None:
        scopes, self._scopes = self._scopes, None
        if scopes is not None:
            scopes.close()

"""The plan `RLPROF_PLAN` names, as every process of one vLLM engine reads it: checked for what an engine can
honour, with this engine's replica and the source of its steps."""

from __future__ import annotations

import os
import shlex

import msgspec

from ...config import load_plan
from ...config.source import split_config_args
from ...errors import ConfigError
from ..engines import check_rollout_schedule
from .environment import ENV_PLAN, ENV_REPLICA, ENV_STEPS, STEP_SOURCES


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
    try:
        args = shlex.split(spec)
    except ValueError as exc:
        raise ConfigError(
            ENV_PLAN,
            spec,
            "a config file and/or key=value overrides, shell-quoted",
            problem=f"does not split into arguments ({exc})",
        ) from None
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
    follows = (
        plan.trigger is not None
        and rollout.enabled
        and rollout.tool is not None
        and (rollout.all_ranks or replica in rollout.ranks)
    )
    if not ((rollout.collects_on(replica) or follows) and "rollout_generate" in rollout.stages):
        return None
    return EngineSettings(plan, replica, source)


def check_engine_plan(plan) -> None:
    """What no inference engine can honour, refused in one line naming the key."""
    check_rollout_schedule(plan.role("rollout"))


def _replica(value: str) -> int:
    try:
        replica = int(value)
    except ValueError:
        replica = -1
    if replica < 0:
        raise ConfigError(ENV_REPLICA, value, "an integer >= 0 (this engine's replica index)")
    return replica

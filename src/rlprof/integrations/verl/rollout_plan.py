"""The rollout engines' decode-step windows: on main_ppo's driver, verl's rollout profiler keys handed to rlprof's
vLLM plugin; in each rollout server, its engine told which replica it is. And the run's id, named once on main_ppo's
driver for the processes Ray starts from it (the trigger's run directory and the agent loop's sample records share
it). Standard library, `frameworks` and the vLLM plugin's variable names only (the loader imports it)."""

from __future__ import annotations

import functools
import os
import secrets
import shlex
import time

from ...frameworks import verl as facts
from ..vllm.environment import ENV_PLAN as ENV_ENGINE_PLAN, ENV_REPLICA as ENV_ENGINE_REPLICA

PROFILER_KEYS = ("global_profiler.", "actor_rollout_ref.actor.profiler.", "actor_rollout_ref.rollout.profiler.")
ROLLOUT_PROFILER = "actor_rollout_ref.rollout.profiler."
ENV_RUN_ID = "RLPROF_VERL_RUN_ID"  # main_ppo's run directory under global_profiler.save_path


def name_the_run(argv: list[str], environ) -> str | None:
    """In main_ppo's driver, when its command line sets rlprof's or verl's profiler keys: one run id, in the
    environment Ray's processes inherit (the driver's trigger and every agent-loop worker write under it). A run id
    already there (inherited, or the user's) is kept."""
    if not any(a.lstrip("+~").startswith(PROFILER_KEYS) for a in argv):
        return environ.get(ENV_RUN_ID)
    return environ.setdefault(ENV_RUN_ID, time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3))


def hand_rollout_plan(argv: list[str], environ) -> str | None:
    """In main_ppo's driver: when its command line asks the rollout for decode-step windows (a schedule whose unit is
    decode_step, or verl's profile_token_start/end), the command line's profiler overrides become the plan rlprof's
    vLLM plugin reads (RLPROF_PLAN), in the environment that Ray's processes started from here inherit: vLLM's
    engine processes in each rollout server among them. The rollout block falls back to the actor's as verl's own
    config does (rlprof's verl dialect reads it so). A plan the user gave is left alone; other processes find the
    variable set and stop here."""
    if environ.get(ENV_ENGINE_PLAN):
        return None
    picked = [a for a in argv if a.lstrip("+~").startswith(PROFILER_KEYS)]
    rollout = [a for a in picked if a.lstrip("+~").startswith(ROLLOUT_PROFILER)]
    if not any(facts.TOKEN_WINDOW_UNIT in a or ".profile_token_" in a for a in rollout):
        return None
    environ[ENV_ENGINE_PLAN] = shlex.join(picked)
    return environ[ENV_ENGINE_PLAN]


def naming_the_replica(build):
    """verl builds a rollout replica's profiler in that replica's server process, before the server starts its
    engine: where rlprof's vLLM plugin has a plan, the engine processes learn which replica they are."""

    @functools.wraps(build)
    def build_rollout_dist_profiler(replica_rank, *args, **kwargs):
        if os.environ.get(ENV_ENGINE_PLAN):
            os.environ[ENV_ENGINE_REPLICA] = str(int(replica_rank))
        return build(replica_rank, *args, **kwargs)

    build_rollout_dist_profiler._rlprof_replica = True
    return build_rollout_dist_profiler


def engine_keeps_decode_steps(unit) -> bool:
    """A rollout server's DistProfiler asking for decode-step windows where rlprof's vLLM plugin has a plan: the
    plugin keeps them inside its engine, and the verl plugin leaves that profiler alone."""
    return unit == facts.TOKEN_WINDOW_UNIT and bool(os.environ.get(ENV_ENGINE_PLAN))

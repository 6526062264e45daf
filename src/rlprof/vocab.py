"""rlprof's own vocabulary: roles, stages, tools, units (data; read by config and analysis alike)."""

from __future__ import annotations

TOOLS = ("torch", "torch_memory", "nsys", "npu", "markers")
ROLES = ("actor", "rollout", "ref", "critic", "reward")
STAGES = (
    "rollout_generate",
    "actor_compute_log_prob",
    "ref_compute_log_prob",
    "critic_compute_values",
    "reward_compute",
    "advantage_compute",
    "actor_update",
    "critic_update",
    "weight_sync",
)
# Which role runs each stage; a stage window belongs to (and follows the plan of) this role.
STAGE_ROLE = {
    "rollout_generate": "rollout",
    "actor_compute_log_prob": "actor",
    "ref_compute_log_prob": "ref",
    "critic_compute_values": "critic",
    "reward_compute": "reward",
    "advantage_compute": "actor",
    "actor_update": "actor",
    "critic_update": "critic",
    "weight_sync": "actor",
}
ROLE_STAGES = {role: tuple(s for s in STAGES if STAGE_ROLE[s] == role) for role in ROLES}

UNITS = ("step", "stage", "mini_batch", "micro_batch", "decode_step")
MODES = ("e2e", "discrete")
LEVELS = ("level_none", "level0", "level1", "level2")
EXPORT_TYPES = ("text", "db")
CONTENTS = {
    "torch": ("cpu", "cuda", "memory", "shapes", "stack", "module"),
    "npu": ("npu", "cpu", "memory", "shapes", "stack", "module"),
}
DEFAULT_CONTENTS = {"torch": ("cpu", "cuda"), "npu": ("npu", "cpu")}
# rlprof's content: the host's Python stacks sampled inside each window (collect/host_stacks.py). The frameworks' own
# `stack` (torch's with_stack: each operator's Python stack) asks for Python stacks too, and so turns it on.
HOST_STACKS = "host_stacks"


def wants_host_stacks(contents: tuple[str, ...]) -> bool:
    """Whether a window samples the host's stacks: where its contents are not listed (the default), or list them."""
    return not contents or HOST_STACKS in contents or "stack" in contents


DEFAULT_SAVE_PATH = "outputs/profile"
DEFAULT_INTEGRATED_SAVE_PATH = "./profiler_data"


def window_label(step, role, stage) -> str:
    """How a window is named to users: "step 2 actor/actor_update", "step 2", "whole trace"."""
    if stage is None and role is None:
        return "whole trace" if step is None else f"step {step}"
    return (f"step {step} " if step is not None else "") + f"{role}/{stage}"

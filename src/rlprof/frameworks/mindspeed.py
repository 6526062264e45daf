"""MindSpeed-RL (and the torch_npu profiler under it) as data: config keys, what its profiler writes, where.

Facts from MindSpeed-RL (`mindspeed_rl/utils/utils.py`: `get_grpo_profiler`, `profiler_start`,
`mstx_timer_decorator`; `docs/features/profiler.md`; `configs/*integrated*.yaml`) and from torch_npu's profiler
(`torch_npu/profiler/analysis`: the db tables it writes, `profiler_info_{rank}.json`,
`ascend_pytorch_profiler_{rank}.db`, `analysis.db`). No torch, no torch_npu import: config/ and analyze/ read it.
"""

from __future__ import annotations

import re

# ---- config (profiler_config.integrated) --------------------------------------------------------
KEYS = ("profile", "mstx", "stage", "profile_save_path", "profile_export_type", "profile_step_start",
        "profile_step_end", "profile_level", "profile_with_memory", "profile_record_shapes", "profile_with_cpu",
        "profile_with_npu", "profile_with_module", "profile_with_stack", "profile_analysis", "profile_ranks")
# `stage` values MindSpeed-RL's workers pass to profiler_start(role=...) -> rlprof's canonical stage.
# actor_image_embeds is the vision encoder pass of its multimodal (VL) pipeline: the actor's work.
STAGES = {
    "actor_generate": "rollout_generate",
    "actor_compute_log_prob": "actor_compute_log_prob",
    "reference_compute_log_prob": "ref_compute_log_prob",
    "actor_update": "actor_update",
    "critic_compute_values": "critic_compute_values",
    "critic_update": "critic_update",
    "actor_image_embeds": "actor_image_embeds",
}
# Stages MindSpeed-RL knows that have no canonical rlprof name: windows of their own, owned by this role.
EXTRA_STAGE_ROLE = {"actor_image_embeds": "actor"}

# ---- what mstx ranges are called ----------------------------------------------------------------
# mstx_timer_decorator names a range by the decorated function's __qualname__ ("IntegratedWorker.update",
# "compute_advantage", ...): the method name says which stage ran.
METHOD_STAGE = {
    "generate_sequences": "rollout_generate",
    "compute_log_prob": "actor_compute_log_prob",
    "compute_ref_log_prob": "ref_compute_log_prob",
    "compute_values": "critic_compute_values",
    "compute_rm_score": "reward_compute",
    "compute_rule_reward": "reward_compute",
    "compute_advantage": "advantage_compute",
    "reshard_to_infer_mode": "weight_sync",
}


def stage_of_range(name: str) -> str | None:
    """Canonical stage of an mstx range name: a MindSpeed-RL stage name, rlprof's own name, or a
    `Class.method` qualname of one of MindSpeed-RL's stage methods; None for any other range."""
    from ..vocab import STAGES as CANONICAL

    name = name.strip()
    if name in STAGES:
        return STAGES[name]
    if name in CANONICAL:
        return name
    method = name.rsplit(".", 1)[-1]
    if method == "update":  # ambiguous on its own: the class says whose
        owner = name.rsplit(".", 2)[-2].lower() if "." in name else ""
        return "critic_update" if "critic" in owner else "actor_update" if owner else None
    if method == "compute_log_prob" and "reference" in name.lower():
        return "ref_compute_log_prob"
    return METHOD_STAGE.get(method)


# ---- what torch_npu writes ------------------------------------------------------------------------
ASCEND_DIR_SUFFIX = "_ascend_pt"
OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"
TEXT_FILES = ("trace_view.json", "kernel_details.csv", "step_trace_time.csv")
PYTORCH_DB = re.compile(r"^ascend_pytorch_profiler(?:_(?P<rank>\d+))?\.db$")
MSPROF_DB = re.compile(r"^msprof_\d+\.db$")
ANALYSIS_DB = "analysis.db"
PROFILER_INFO = re.compile(r"^profiler_info(?:_(?P<rank>\d+))?\.json$")
# Raw, not yet parsed collection inside a *_ascend_pt directory (profile_analysis: false).
RAW_DIRS = ("FRAMEWORK",)
RAW_DIR_PREFIX = "PROF_"


def offline_parse_command(path: str) -> str:
    """The exact command MindSpeed-RL's docs give to parse a profile_save_path after the run."""
    return f"python -c \"import torch_npu; torch_npu.profiler.profiler.analyse(profiler_path='{path}')\""


# ---- the db schema (documented: "Data in ascend_pytorch_profiler_{Rank_ID}.db", msprof db reference) ----
# Ids of ENUM_API_TYPE, MSTX_EVENTS.eventType.
API_TYPE_MSTX = 50004
MSTX_RANGE = 2  # start/end range (mstx.range_start / range_end)
MSTX_MARK = 3
# Tables the reader needs; a db without TASK or STRING_IDS holds no device timeline.
REQUIRED_TABLES = ("STRING_IDS", "TASK")

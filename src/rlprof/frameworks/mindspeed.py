"""MindSpeed-RL (and the torch_npu profiler under it) as data: config keys, what its profiler writes, where.

Facts from MindSpeed-RL (`mindspeed_rl/utils/utils.py`: `get_grpo_profiler`, `profiler_start`,
`mstx_timer_decorator`; `docs/features/profiler.md`; `configs/*integrated*.yaml`) and from torch_npu's profiler
(`torch_npu/profiler/analysis`: the db tables it writes, `profiler_info_{rank}.json`,
`ascend_pytorch_profiler_{rank}.db`, `analysis.db`). No torch, no torch_npu import: config/ and analyze/ read it.
"""

from __future__ import annotations

import re

# ---- config (profiler_config.integrated) --------------------------------------------------------
# The fields of its ProfilerConfig (Ascend/MindSpeed-RL @05a90d7, mindspeed_rl/config_cls/mindstudio_config.py
# ~40-54); BaseConfig.update refuses any other key (base_config.py ~29-33: "The key ... is missing").
KEYS = (
    "profile",
    "mstx",
    "stage",
    "profile_save_path",
    "profile_export_type",
    "profile_step_start",
    "profile_step_end",
    "profile_level",
    "profile_with_memory",
    "profile_record_shapes",
    "profile_with_cpu",
    "profile_with_npu",
    "profile_with_module",
    "profile_analysis",
    "profile_ranks",
)
# get_grpo_profiler (mindspeed_rl/utils/utils.py ~518-589 @05a90d7): `profile_ranks` is "all" or anything
# list() takes; what list() refuses (an int) falls back to [0]; ranks are compared with torch's int rank, so a
# string other than "all" (a list of its characters) selects no rank. `mstx` only sets msprof_tx (its mstx
# ranges are recorded): activities come from profile_with_npu / profile_with_cpu and the level from
# profile_level, mstx or not.
RANKS_FALLBACK = (0,)
# What MindSpeed-RL does with what rlprof refuses (profiler_start, utils.py ~604-626): a stage no worker passes is
# never matched, and an iteration outside [profile_step_start, profile_step_end) is never profiled.
RUNS_UNKNOWN_STAGE = "MindSpeed-RL would run this config and profile nothing (no worker passes that stage)"
RUNS_EMPTY_STEPS = "MindSpeed-RL would run this config and profile no step"
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
# trace_view.json's processes (named by process_name metadata; a torch_npu version may leave CANN's unnamed).
DEVICE_PROCESS = "Ascend Hardware"  # every device task, one thread per stream
HCCL_PROCESS = "HCCL"  # threads "Group N Communication" (the collectives, hcom_*) and "Plane N" (their tasks)
OVERLAP_PROCESS = "Overlap Analysis"  # the exporter's own drawing of the step-trace lanes
HOST_PROCESS = "Python"
# trace_view.json's flows from a host launch to its device task, the first preferred: `async_npu` leaves the torch
# op on the training thread (where the mstx ranges are), `HostToDevice` the CANN call on the dequeue thread. The
# db keeps the same links as connection ids (PYTORCH_API -> CONNECTION_IDS -> TASK; CANN_API -> TASK).
LAUNCH_FLOWS = ("async_npu", "HostToDevice")
# CANN's host API events are named "{level}@{api}" (AscendCL@aclnnAdd, Node@launch, Hccl@..., Runtime@...).
CANN_API = re.compile(r"^(AscendCL|Node|Hccl|HCCL|Runtime|Model|Acl|ACL|Opapi|GE)@")
# Which device tasks are operators (computing in torch_npu's step trace), as CANN's op summary
# (kernel_details.csv, the db's COMPUTE_TASK_INFO) lists them: the AI Core / Vector / CPU kernels and the DSA
# operators (random-number generation runs on the DSA engine and is listed as an operator, Accelerator Core
# DSA_SQE). The rest is runtime plumbing (EVENT_RECORD/WAIT, MEMCPY_ASYNC over SDMA or PCIe, PLACE_HOLDER) or a
# communication stream's own tasks (Notify Wait, SDMA, Write Value): neither is computing. Older CANN versions
# type every task "Other"; there the task's name tells the runtime's tasks from operators. Checked against
# step_trace_time.csv on every real collection in tests/data/ascend (the KERNEL_* names are the db's TASK types).
COMPUTE_TASK_TYPES = frozenset(
    {
        "AI_CORE",
        "AI_VECTOR_CORE",
        "AI_CPU",
        "MIX_AIC",
        "MIX_AIV",
        "FFTS_PLUS",
        "DSA_SQE",
        "KERNEL_AICORE",
        "KERNEL_AIVEC",
        "KERNEL_AICPU",
        "KERNEL_MIX_AIC",
        "KERNEL_MIX_AIV",
    }
)
RUNTIME_TASK_TYPES = frozenset(
    {
        "EVENT_RECORD_SQE",
        "EVENT_WAIT_SQE",
        "PCIE_DMA_SQE",
        "SDMA_SQE",
        "PLACE_HOLDER_SQE",
        "Notify Wait",
        "Notify Record",
        "SDMA",
        "Write Value",
        "MEMCPY_ASYNC",
        "EVENT_RECORD",
        "EVENT_WAIT",
        "STARS_COMMON",
    }
)
RUNTIME_TASK_NAMES = frozenset(
    {
        "MEMCPY_ASYNC",
        "EVENT_RECORD",
        "EVENT_WAIT",
        "PROFILING_ENABLE",
        "PROFILING_DISABLE",
        "Notify Wait",
        "Notify Record",
        "SDMA",
        "Write Value",
        "Notify_Wait",
        "Notify_Record",
    }
)


# Tasks the profiler itself puts on the device when it starts and stops: no part of the run's timeline.
PROFILER_MARKER_TASKS = frozenset({"PROFILING_ENABLE", "PROFILING_DISABLE"})


def is_operator_task(task_type: str, name: str) -> bool:
    """Whether a device task of trace_view.json's Ascend Hardware process is an operator (computing)."""
    if task_type in COMPUTE_TASK_TYPES:
        return True
    return task_type not in RUNTIME_TASK_TYPES and name not in RUNTIME_TASK_NAMES


COMMUNICATION_THREAD = re.compile(r"Communication$")
# kernel_details.csv: the HCCL rows' accelerator core; "N/A" where a profiler level records no op type (level0).
HCCL_CORE = "HCCL"
NOT_RECORDED = "N/A"
# An HCCL collective's name is its type and a call id: hcom_allReduce__868_0_1 is an hcom_allReduce_ (the db's
# COMMUNICATION_OP.opType and kernel_details' Type at level1 and above).
HCOM_CALL = re.compile(r"^(hcom_[A-Za-z]+_)_\d+(?:_\d+)*$")


def collective_type(name: str) -> str:
    """The collective an HCCL op name stands for (its type without the call id), or the name itself."""
    m = HCOM_CALL.match(name)
    return m.group(1) if m else name


# Raw, not yet parsed collection inside a *_ascend_pt directory (profile_analysis: false).
RAW_DIRS = ("FRAMEWORK",)
RAW_DIR_PREFIX = "PROF_"


def offline_parse_command(path: str) -> str:
    """The exact command MindSpeed-RL's docs give to parse a profile_save_path after the run."""
    return f"python -c \"import torch_npu; torch_npu.profiler.profiler.analyse(profiler_path='{path}')\""


# ---- the db schema (documented: "Data in ascend_pytorch_profiler_{Rank_ID}.db", msprof db reference) ----
# Ids of ENUM_API_TYPE (PYTORCH_API.type: torch ops, torch_npu's task queue, Python trace, mstx),
# MSTX_EVENTS.eventType.
API_TYPE_OP, API_TYPE_QUEUE, API_TYPE_TRACE, API_TYPE_MSTX = 50001, 50002, 50003, 50004
MSTX_RANGE = 2  # start/end range (mstx.range_start / range_end)
MSTX_MARK = 3
# Tables the reader needs; a db without TASK or STRING_IDS holds no device timeline.
REQUIRED_TABLES = ("STRING_IDS", "TASK")

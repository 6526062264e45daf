"""verl as data: its profiler config surface and the names of what its profiler writes.

Facts from verl 0.9.1 and its head, 0.10.0.dev at 1dda039 (`verl/utils/profiler/config.py`, `profile.py`, `torch_profile.py`, `mstx_profile.py`,
`workers/engine_workers.py`, the generated trainer YAMLs) and, where it differs, 0.9.0. Read by config/
(the verl dialect) and by analyze/ (verl's own trace files); nothing here imports torch or verl.
"""

from __future__ import annotations

import re

CURRENT_VERSION = "0.10.0.dev"  # verl-project/verl @1dda039: verl/version/version
VERSIONS = ("0.9.0", "0.9.1", "0.10.0.dev")
# Since 0.9.1 the rollout's `ranks` are global GPU ranks, mapped to the replica that holds them.
GLOBAL_ROLLOUT_RANKS = ("0.9.1", "0.10.0.dev")
# The generated trainer YAML's torch_memory block lost memory_snapshot_num_steps after 0.9.1
# (verl/trainer/config/_generated_ppo_trainer.yaml @1dda039): a whole YAML that has it is 0.9.1.
KEYS_UNTIL_0_9_1 = ("memory_snapshot_num_steps",)
# Stages that run on the driver (RayPPOTrainer.fit: compute_advantage, verl/trainer/ppo/ray_trainer.py @1dda039),
# outside every worker's profiler: no verl trace holds them.
DRIVER_STAGES = ("advantage_compute",)

# ---- config -----------------------------------------------------------------------------------
TOOLS = ("nsys", "npu", "torch", "torch_memory", "precision_debugger")
# Tools rlprof has no backend for: resolved and shown, never collected (one warning each).
FOREIGN_TOOLS = {"precision_debugger": "verl's msprobe precision dump (numerics, not timing)"}

ROLE_BLOCKS = {
    "actor": "actor_rollout_ref.actor.profiler",
    "rollout": "actor_rollout_ref.rollout.profiler",
    "ref": "actor_rollout_ref.ref.profiler",
    "critic": "critic.profiler",
    "reward": "reward_model.profiler",
}
# ProfilerConfig fields (a role's `profiler` block); global_profiler has the same dataclass plus steps.
ROLE_KEYS = (
    "tool",
    "enable",
    "all_ranks",
    "ranks",
    "save_path",
    "tool_config",
    "global_tool_config",
    "relocate_results",
    "finish_hook_cmd",
    "finish_hook_all_ranks",
    "finish_hook_ranks",
)
GLOBAL_KEYS = (
    "tool",
    "steps",
    "profile_continuous_steps",
    "save_path",
    "relocate_results",
    "finish_hook_cmd",
    "finish_hook_all_ranks",
    "finish_hook_ranks",
    "global_tool_config",
    "enable",
    "all_ranks",
    "ranks",
    "tool_config",
)
# A whole trainer config (generated, or Hydra's own `--cfg job` dump) is a structured config: its global_profiler
# carries the dataclass target. Hydra refuses a plain override of a key it does not hold ("Key not in struct");
# `+key=value` adds it, and verl's dataclasses ignore what they lack (omega_conf_to_dataclass).
STRUCTURED_MARKER = "global_profiler._target_"
# Present in 0.9.1's generated YAMLs, absent from 0.9.0's: a whole trainer YAML without them is 0.9.0.
KEYS_SINCE_0_9_1 = ("relocate_results", "finish_hook_cmd", "finish_hook_all_ranks", "finish_hook_ranks")

# Every field of each tool's dataclass (`name` included: every tool config carries one).
TOOL_CONFIG_KEYS = {
    "nsys": ("discrete", "name"),
    "npu": ("discrete", "contents", "level", "analysis", "profile_token_start", "profile_token_end", "name"),
    "torch": ("contents", "discrete", "profile_token_start", "profile_token_end", "schedule", "name"),
    "torch_memory": ("trace_alloc_max_entries", "stack_depth", "memory_snapshot_num_steps", "name"),
    "precision_debugger": ("name", "config_path", "steps", "stages", "strict"),
}
SCHEDULE_KEYS = ("skip_first", "wait", "warmup", "active", "repeat", "name")
GLOBAL_TOOL_CONFIG_KEYS = {
    "nsys": ("discrete", "name", "controller_nsight_options", "worker_nsight_options"),
    "torch_memory": (
        "trace_alloc_max_entries",
        "stack_depth",
        "memory_snapshot_num_steps",
        "context",
        "stacks",
        "kw_args",
        "name",
    ),
    "precision_debugger": TOOL_CONFIG_KEYS["precision_debugger"],
}
TORCH_MEMORY_CHOICES = {"context": ("alloc", "state", "all"), "stacks": ("python", "cpp", "all")}
CONTENTS = {
    "torch": ("cuda", "cpu", "memory", "shapes", "stack"),
    "npu": ("npu", "cpu", "memory", "shapes", "module", "stack"),
}
LEVELS = ("level_none", "level0", "level1", "level2")
# the stage names precision_debugger takes
PRECISION_STAGES = (
    "actor_update",
    "actor_compute_log_prob",
    "ref_compute_log_prob",
    "compute_values",
    "critic_update",
    "compute_rm_score",
)

# The schedule samples update mini-batches (DistProfiler.step() once per mini-batch of these stages).
SCHEDULE_UNIT = "mini_batch"
SCHEDULED_STAGES = ("actor_update", "critic_update")
# The token window samples rollout decode steps [start, end).
TOKEN_WINDOW_UNIT = "decode_step"

# Rollout replica size: replica = global rank // (tp * dp * pp) (build_rollout_dist_profiler, 0.9.1).
ROLLOUT_PARALLEL_KEYS = (
    "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "actor_rollout_ref.rollout.data_parallel_size",
    "actor_rollout_ref.rollout.pipeline_model_parallel_size",
)
ROLLOUT_MODE_KEY = "actor_rollout_ref.rollout.mode"

# The rollout runs in verl's agent-loop server processes, which build a profiler for these tools only and switch
# it off for any other (verl-project/verl @1dda039 and v0.9.0: vllm_async_server.py ~172-176,
# async_sglang_server.py ~194-201: "agent loop only support torch and npu profiler").
ROLLOUT_SERVER_TOOLS = ("torch", "npu")
# Those servers never run the finish hook: only the training workers do (vllm_async_server.py ~870-884,
# docs/perf/torch_profiling.md @1dda039).
ROLLOUT_RUNS_FINISH_HOOK = False
# precision_debugger leaves rank selection to msprobe's config.json: DistProfiler opens its rank gate on every rank
# when the tool is enabled (utils/profiler/profile.py ~136-139 @1dda039).
ALL_RANKS_TOOLS = ("precision_debugger",)

# What DistProfiler._run_finish_command exports to the hook's shell.
FINISH_HOOK_ENV = (
    "VERL_PROFILE_SAVE_PATH",
    "VERL_PROFILE_TOOL",
    "VERL_PROFILE_RANK",
    "VERL_PROFILE_PID",
    "VERL_PROFILE_ROLE",
)

# What verl does with what rlprof refuses (said in the refusal's line). An unknown tool gets DistProfiler's no-op
# profiler (utils/profiler/profile.py ~176-178 @1dda039); RayPPOTrainer profiles a global step (1, 2, ...) only when
# `global_profiler.steps` lists it (trainer/ppo/ray_trainer.py ~1459).
RUNS_UNKNOWN_TOOL = "verl would run this config and profile nothing (an unknown tool gets its no-op profiler)"
RUNS_BAD_STEPS = "verl would run this config and profile no such step (global steps count from 1)"

# ---- legacy (seed-era) config: trainer.profile_steps ---------------------------------------------
LEGACY_ROLE_BLOCKS = ROLE_BLOCKS  # v0.4.1: one block per role, where 0.9 has them; v0.5: one for the group
LEGACY_GROUP_BLOCKS = {
    "actor_rollout_ref.profiler": ("actor", "rollout", "ref"),
    "critic.profiler": ("critic",),
    "reward_model.profiler": ("reward",),
}
LEGACY_BLOCK_KEYS = ("discrete", "all_ranks", "ranks")

# ---- output --------------------------------------------------------------------------------------
# Stage annotations (DistProfiler.annotate role=..., else the method name) -> canonical stages.
STAGE_ANNOTATIONS = {
    "actor_compute_log_prob": "actor_compute_log_prob",
    "compute_log_prob": "actor_compute_log_prob",
    "ref_compute_log_prob": "ref_compute_log_prob",
    "compute_ref_log_prob": "ref_compute_log_prob",
    "actor_update": "actor_update",
    "update_actor": "actor_update",
    "critic_update": "critic_update",
    "update_critic": "critic_update",
    "compute_values": "critic_compute_values",
    "critic_compute_values": "critic_compute_values",
    "compute_rm_score": "reward_compute",
    "generate_sequences": "rollout_generate",
    "rollout_generate": "rollout_generate",
}
# Ranges inside a stage: one per update mini-batch (`mini_batch{i}`, TrainingWorker.train_mini_batch),
# and the TrainingWorker's own per-mini-batch `train_batch` annotation.
MINI_BATCH_RANGE = re.compile(r"^mini_batch(\d+)$")
TRAIN_BATCH = "train_batch"
E2E_SCOPES = ("train", "e2e")  # the `role` verl passes to start_profile for the whole-step window

# save_file_prefix (worker role or model type, sanitised: "_" -> "-") -> the role whose update it runs.
WORKER_ROLES = {
    "actor-rollout-ref": "actor",
    "actor-rollout": "actor",
    "actor": "actor",
    "language-model": "actor",
    "ref": "ref",
    "rollout": "rollout",
    "critic": "critic",
    "value-model": "critic",
    "reward-model": "reward",
}
UPDATE_STAGE_OF_ROLE = {"actor": "actor_update", "critic": "critic_update"}

# torch tool: {prefix}_{scope}_step{N}_rank{R}[-of-{W}][_tp..-pp..-dp..-cp..]_pid{P}_{ts}[_mbA[-B]|_partK].json.gz
TORCH_TRACE_NAME = re.compile(
    r"^(?:(?P<head>(?!step\d|rank\d)[0-9A-Za-z.=+-]+(?:_(?!step\d|rank\d)[0-9A-Za-z.=+-]+)?)_)??(?:step(?P<step>\d+)_)?"
    r"rank(?P<rank>\d+)(?:-of-(?P<world>\d+))?(?:_(?P<parallel>(?:tp|pp|dp|cp)\d+(?:-(?:tp|pp|dp|cp)\d+)*))?"
    r"_pid(?P<pid>\d+)_(?P<ts>\d{14,20})(?:_mb(?P<mb_first>\d+)(?:-(?P<mb_last>\d+))?|_part(?P<part>\d+))?"
    r"\.json(?:\.gz)?$"
)
# relocate_rollout_traces: rollout-replica{r}[-globalrank{g}]_{engine's own file name}
RELOCATED_ROLLOUT = re.compile(r"^rollout-replica(?P<replica>\d+)(?:-globalrank(?P<global_rank>\d+))?_(?P<rest>.+)$")
# rollout_trace_dir: {save_path}/agent_loop_rollout_replica_{r}/
ROLLOUT_REPLICA_DIR = re.compile(r"^agent_loop_rollout_replica_(?P<replica>\d+)$")
# npu tool: {save_path}/{scope}/{host}_{pid}_{ts}_ascend_pt (scope: "train" or the stage annotation)
ASCEND_DIR_SUFFIX = "_ascend_pt"


def stage_of_annotation(name: str) -> str | None:
    return STAGE_ANNOTATIONS.get(name.replace("-", "_"))


def parse_trace_name(name: str) -> dict | None:
    """Step, role, stage, rank, world size, parallel ranks and mini-batch window of a verl torch trace,
    or None when the name is not one verl's torch profiler writes."""
    m = TORCH_TRACE_NAME.match(name)
    if m is None:
        return None
    parts = m.group("head").split("_") if m.group("head") else []
    prefix = scope = None
    if len(parts) == 2:
        prefix, scope = parts
    elif len(parts) == 1:
        if parts[0] in E2E_SCOPES or stage_of_annotation(parts[0]):
            scope = parts[0]
        else:
            prefix = parts[0]
    role = WORKER_ROLES.get(prefix) if prefix else None
    stage = unit = None
    if scope == TRAIN_BATCH.replace("_", "-"):  # a TrainingWorker's discrete train_batch: one mini-batch a file
        stage, unit = UPDATE_STAGE_OF_ROLE.get(role or ""), SCHEDULE_UNIT
        if stage is None:
            return None
    elif scope and scope not in E2E_SCOPES:
        stage = stage_of_annotation(scope)
        if stage is None:
            return None  # a scope verl never writes: not one of its files
    out = {
        "framework": "verl",
        "step": int(m.group("step")) if m.group("step") else None,
        "rank": int(m.group("rank")),
        "world_size": int(m.group("world")) if m.group("world") else None,
        "worker": prefix,
        "role": role,
        "stage": stage,
        "mode": "discrete" if stage else "e2e",
        "pid": int(m.group("pid")),
    }
    if m.group("parallel"):
        out["parallel"] = {p[:2]: int(p[2:]) for p in m.group("parallel").split("-")}
    if m.group("mb_first") is not None:
        first = int(m.group("mb_first"))
        out["mini_batches"] = (first, int(m.group("mb_last") or first))
    if m.group("part") is not None:
        out["window"] = int(m.group("part"))
    if unit is not None:
        out["unit"] = unit
    return out


# verl's per-stage timers (ray_trainer.py marked_timer names, logged as timing_s/<name> in seconds) -> rlprof's
# stages. `step` is the whole step; testing, checkpoints and profiler start/stop are not stages of training.
TIMING_STAGES = {
    "gen": "rollout_generate",
    "reward": "reward_compute",
    "old_log_prob": "actor_compute_log_prob",
    "ref": "ref_compute_log_prob",
    "values": "critic_compute_values",
    "adv": "advantage_compute",
    "update_critic": "critic_update",
    "update_actor": "actor_update",
    "update_weights": "weight_sync",
}
TIMING_PREFIX = "timing_s/"
RESPONSE_LENGTH_KEY = "response_length/mean"

# ---- rlprof inside verl's workers (integrations/verl/; `rlprof plan` says when it is what collects) ---------
# verl imports, on `import verl` in every process, each entry point of this group (verl/__init__.py, 0.9.0 on; errors
# hidden at debug log level), unless VERL_USE_EXTERNAL_PLUGINS is "none" or a list of names without rlprof's.
PLUGIN_GROUP = "verl.plugins"
PLUGIN_NAME = "rlprof"
PLUGIN_MODULE = "rlprof.integrations.verl.loader"
PLUGINS_POLICY_ENV = "VERL_USE_EXTERNAL_PLUGINS"
# verl 0.7.x has no plugin group; it imports the modules listed here on `import verl` (Ray's runtime_env carries the
# variable to every worker). Its `actor_rollout_ref.model.external_lib` is imported only in the worker's init_model,
# after the worker's __init__ has built its profiler's tool config, which refuses a key it lacks (`schedule`).
EXTERNAL_MODULES_ENV = "VERL_USE_EXTERNAL_MODULES"
RUNTIME_ENV_VARS = "ray_kwargs.ray_init.runtime_env.env_vars"  # main_ppo merges it into every worker's environment
ENTRY_POINT_RELEASES = ("0.9", "0.10")  # major.minor whose `import verl` loads the group
PLUGIN_RELEASES = ("0.7", "0.9", "0.10")  # major.minor whose layout the plugin knows (below)
# What the plugin samples: micro-batches of the stages that run them, each stage call a window of its own.
PLUGIN_UNIT = "micro_batch"
MICRO_BATCH_STAGES = (
    "actor_compute_log_prob",
    "ref_compute_log_prob",
    "actor_update",
    "critic_compute_values",
    "critic_update",
)
MICRO_BATCH_RANGE = re.compile(r"^micro_batch(\d+)$")  # FSDPEngine.forward_backward_batch's record_function (0.9.1 on)
# Where the micro-batch loops live. verl 0.9.x and head (1dda039): FSDPEngine.forward_backward_batch iterates what
# the module's prepare_micro_batches returns (one `micro_batch{k}` range per item: forward, then its backward),
# called once per log-prob pass and once per update mini-batch. verl 0.7.x: DataParallelPPOActor / -Critic call
# _forward_micro_batch once per micro-batch (the backward follows in the loop) and _optimizer_step after a
# mini-batch's last. tests/data/verl/layout.json records these facts for 0.9.1 and head.
ENGINE_LAYOUT = {
    "module": "verl.workers.engine.fsdp.transformer_impl",
    "class": "FSDPEngine",
    "method": "forward_backward_batch",
    "source": "prepare_micro_batches",
}
# What verl's own mfu divides by, per layout: the calls its Timer wraps (engine_workers.py's train_batch / eval_batch
# timers around the engine's train_batch / infer_batch; 0.7.x fsdp_workers' update_policy timer).
ENGINE_TIMED = {"module": "verl.workers.engine.base", "class": "BaseEngine", "methods": ("train_batch", "infer_batch")}
DP_LAYOUTS = (
    {
        "module": "verl.workers.actor.dp_actor",
        "class": "DataParallelPPOActor",
        "forward": "_forward_micro_batch",
        "stages": ("compute_log_prob", "update_policy"),
        "boundary": "_optimizer_step",
    },
    {
        "module": "verl.workers.critic.dp_critic",
        "class": "DataParallelPPOCritic",
        "forward": "_forward_micro_batch",
        "stages": ("compute_values", "update_critic"),
        "boundary": "_optimizer_step",
    },
)
# The classes of verl's profiler config the plugin teaches rlprof's keys (verl.utils.profiler.config): the
# schedule's `unit`, and a `schedule` for tools whose verl config has none (torch before 0.9, npu).
SCHEDULE_CLASSES = {
    "TorchProfilerScheduleConfig": ("unit",),
    "TorchProfilerToolConfig": ("schedule",),
    "NPUToolConfig": ("schedule",),
}


# What verl alone does with `unit` in a schedule (hydra instantiates the dataclass with every key given).
def refuses_unit(release: str) -> str:
    """What verl alone does with rlprof's schedule key when it builds its workers (hydra instantiates the dataclass
    with every key given): 0.7.x has no schedule at all."""
    cls, key = (
        ("TorchProfilerToolConfig", "schedule")
        if release.startswith("0.7.")
        else ("TorchProfilerScheduleConfig", "unit")
    )
    return f"verl alone refuses the key when it builds its workers ({cls} got an unexpected keyword argument '{key}')"


# verl's torch trace stem (build_trace_basename, 0.9.1): what the plugin names its files when verl has no such helper.
STEM_PART = re.compile(r"[^0-9A-Za-z.=+-]+")


def trace_stem(
    rank: int, scope: str | None, prefix: str | None, step: int | None, world_size: int | None, pid: int, timestamp: str
) -> str:
    """`{prefix}_{scope}_step{N}_rank{R}-of-{W}_pid{P}_{timestamp}`, each label made file-name safe as verl does."""
    clean = lambda text: STEM_PART.sub("-", str(text)).strip("-")  # noqa: E731
    parts = [clean(p) for p in (prefix, scope) if p]
    if step is not None:
        parts.append(f"step{clean(step)}")
    parts.append(f"rank{rank}" + (f"-of-{world_size}" if world_size else ""))
    return "_".join(parts + [f"pid{pid}", timestamp])

"""The config keys that act on each cause of a slow RL step, per framework (data, keyed by the cause's name in
analyze/diagnosis/causes.py, the registry of causes, which refers to them).

They stay here, not in the registry, because they are facts about verl's, MindSpeed-RL's and rlprof's configs, as
the rest of frameworks/ is, and this layer sits below analyze.

A lever is a key of the framework's own config, the value or direction to turn it, and why it acts on the
cause. Keys are checked against each framework's real config (tests/test_levers.py): verl's generated trainer
YAML at 1dda039, MindSpeed-RL's config classes at 05a90d7, rlprof's TrainConfig. A dialect with no entry for
a cause has no key known to act on it; a finding says so rather than invent one.

`stages` restricts a lever to the stages it acts on (a log-prob micro-batch size does nothing for the update).
`value` names the setting the run's own measures give a "raise"/"lower" lever (analyze/diagnosis/savings.py computes it:
the cap, the size, the workers), so that `rlprof advise --fix` writes a value, not a direction; `also` are keys
written with it (a token budget beside the switch that uses it), each a literal or a `{setting}`.
"""

from __future__ import annotations

from dataclasses import dataclass

DIALECTS = ("verl", "mindspeed", "rlprof")


@dataclass(frozen=True)
class Lever:
    key: str
    set: str  # the value to set, or a direction: "raise", "lower"
    why: str
    stages: tuple[str, ...] = ()  # empty: every stage the cause is found in
    value: str | None = None  # the setting (analyze/diagnosis/savings.py) a "raise"/"lower" lever is set to by --fix
    also: tuple[tuple[str, str], ...] = ()  # (key, literal or "{setting}") written with it by --fix

    def text(self) -> str:
        turn = f"{self.key}={self.set}" if self.set not in ("raise", "lower") else f"{self.set} {self.key}"
        return f"{turn} ({self.why})"


UPDATE = ("actor_update",)
OLD_LOG_PROB = ("actor_compute_log_prob",)
REF_LOG_PROB = ("ref_compute_log_prob",)
VA = "actor_rollout_ref."

LEVERS: dict[str, dict[str, tuple[Lever, ...]]] = {
    "rollout_tail": {
        "verl": (
            Lever(
                "data.max_response_length",
                "lower",
                "caps the longest response the batch waits for",
                value="max_new_tokens",
            ),
        ),
        "mindspeed": (
            Lever(
                "generate_config.sampling_config.max_tokens",
                "lower",
                "caps the longest response the batch waits for",
                value="max_new_tokens",
            ),
            Lever(
                "rl_config.partial_rollout_max_split",
                "raise",
                "partial rollout: a long response is continued in the next step instead of held for",
            ),
        ),
        "rlprof": (
            Lever(
                "rollout.max_new_tokens",
                "lower",
                "caps the longest response the batch waits for",
                value="max_new_tokens",
            ),
        ),
    },
    "padding": {
        "verl": (
            Lever(VA + "model.use_remove_padding", "True", "packs the real tokens, no pad computed"),
            Lever(
                VA + "actor.use_dynamic_bsz",
                "True",
                "micro-batches by token budget (ppo_max_token_len_per_gpu), rows of like length together",
            ),
        ),
        "mindspeed": (
            Lever("rl_config.use_remove_padding", "true", "packs the real tokens, no pad computed"),
            Lever("rl_config.use_dynamic_bsz", "true", "micro-batches by token budget (max_packing_token_size)"),
        ),
        "rlprof": (
            Lever(
                "actor.use_dynamic_bsz",
                "true",
                "micro-batches by token budget (actor.max_token_len), rows of like length together",
                also=(("actor.max_token_len", "{max_token_len}"),),
            ),
        ),
    },
    "small_units": {
        "verl": (
            Lever(
                VA + "actor.ppo_micro_batch_size_per_gpu",
                "raise",
                "fewer, fuller update passes",
                UPDATE,
                value="micro_batch_size",
            ),
            Lever(
                VA + "rollout.log_prob_micro_batch_size_per_gpu",
                "raise",
                "fewer, fuller old-log-prob passes",
                OLD_LOG_PROB,
                value="micro_batch_size",
            ),
            Lever(
                VA + "ref.log_prob_micro_batch_size_per_gpu",
                "raise",
                "fewer, fuller reference passes",
                REF_LOG_PROB,
                value="micro_batch_size",
            ),
            Lever(VA + "actor.use_dynamic_bsz", "True", "micro-batches filled to a token budget instead"),
        ),
        "mindspeed": (
            Lever(
                "actor_config.micro_batch_size",
                "raise",
                "fewer, fuller update passes",
                UPDATE,
                value="micro_batch_size",
            ),
            Lever(
                "rl_config.actor_forward_micro_batch_size",
                "raise",
                "fewer, fuller old-log-prob passes",
                OLD_LOG_PROB,
                value="micro_batch_size",
            ),
            Lever(
                "rl_config.ref_forward_micro_batch_size",
                "raise",
                "fewer, fuller reference passes",
                REF_LOG_PROB,
                value="micro_batch_size",
            ),
            Lever("rl_config.use_dynamic_bsz", "true", "micro-batches filled to a token budget instead"),
        ),
        "rlprof": (
            Lever("actor.micro_batch_size", "raise", "fewer, fuller update passes", UPDATE, value="micro_batch_size"),
            Lever(
                "actor.log_prob_micro_batch_size",
                "raise",
                "fewer, fuller log-prob passes",
                OLD_LOG_PROB + REF_LOG_PROB,
                value="micro_batch_size",
            ),
            Lever("actor.use_dynamic_bsz", "true", "micro-batches filled to a token budget instead"),
        ),
    },
    "unused_reference": {
        # verl's need_reference_policy: use_kl_in_reward or actor.use_kl_loss (verl/trainer/ppo/utils.py)
        "verl": (
            Lever(
                VA + "actor.use_kl_loss",
                "False",
                "with algorithm.use_kl_in_reward=False verl builds no reference policy and skips the pass",
            ),
        ),
        "rlprof": (Lever("actor.use_kl_loss", "false", "the reference pass is skipped"),),
    },
    "slow_reward": {
        "verl": (
            Lever(
                "reward.num_workers",
                "raise",
                "scores the batch in that many reward-loop workers at once",
                value="workers",
            ),
        ),
        "mindspeed": (
            Lever("rl_config.verifier_parallel", "raise", "runs the rule verifiers in parallel", value="workers"),
        ),
        "rlprof": (Lever("reward.workers", "raise", "scores the batch in that many threads at once", value="workers"),),
    },
    "weight_sync": {
        "verl": (
            Lever(
                VA + "rollout.checkpoint_engine.update_weights_bucket_megabytes",
                "raise",
                "fewer, larger transfers to the rollout engine",
            ),
        ),
        "rlprof": (
            Lever(
                "rollout.share_actor_weights",
                "true",
                "rollout reads the actor's shards: no full copy (each decode step gathers them instead)",
            ),
        ),
    },
    "exposed_comm": {
        "verl": (
            Lever(
                VA + "actor.fsdp_config.forward_prefetch",
                "True",
                "issues the next layer's all-gather before the current forward ends",
            ),
            Lever(
                VA + "actor.fsdp_config.reshard_after_forward",
                "False",
                "keeps gathered weights from forward to backward: no second all-gather (more memory)",
            ),
        ),
        "mindspeed": (
            Lever(
                "megatron_training.overlap_param_gather", "true", "overlaps the parameter all-gather with the forward"
            ),
            Lever("megatron_training.overlap_grad_reduce", "true", "overlaps the gradient reduce with the backward"),
        ),
        "rlprof": (
            Lever(
                "actor.reshard_after_forward",
                "false",
                "keeps gathered weights from forward to backward: no second all-gather (more memory)",
            ),
        ),
    },
    "slow_rank": {
        "verl": (
            Lever(
                "trainer.balance_batch",
                "True",
                "balances tokens across data-parallel ranks (a rank with longer sequences is slower)",
            ),
        ),
        "rlprof": (
            Lever(
                "trainer.debug.slow_rank",
                "null",
                "the reference trainer's only source of a slow rank is this injected slowdown",
            ),
        ),
    },
    "launch_bound": {
        "verl": (
            Lever(
                VA + "rollout.enforce_eager",
                "False",
                "CUDA graphs replay decode kernels without launches",
                ("rollout_generate",),
            ),
            Lever(VA + "actor.ppo_micro_batch_size_per_gpu", "raise", "more work per launch", UPDATE),
            Lever(VA + "actor.use_torch_compile", "True", "fused kernels: fewer launches"),
        ),
        "mindspeed": (
            Lever(
                "generate_config.enforce_eager",
                "false",
                "graph mode replays decode without launches",
                ("rollout_generate",),
            ),
        ),
        "rlprof": (
            Lever(
                "rollout.engine",
                "vllm",
                "vLLM replays each decode step from a CUDA graph (with rollout.enforce_eager=false): no launch per kernel",
                ("rollout_generate",),
                also=(("rollout.enforce_eager", "false"),),
            ),
            Lever("actor.micro_batch_size", "raise", "more work per launch", UPDATE),
            Lever("actor.log_prob_micro_batch_size", "raise", "more work per launch", OLD_LOG_PROB + REF_LOG_PROB),
        ),
    },
    "slow_tools": {
        "verl": (
            Lever(VA + "rollout.multi_turn.max_parallel_calls", "raise", "a turn's tool calls run at once"),
            Lever(VA + "rollout.multi_turn.max_tool_response_length", "lower", "shorter tool answers to read back"),
        ),
        "mindspeed": (
            Lever("rl_config.max_parallel_calls", "raise", "a turn's tool calls run at once"),
            Lever("rl_config.max_tool_response_length", "lower", "shorter tool answers to read back"),
        ),
    },
    "preemption": {
        "verl": (
            Lever(VA + "rollout.gpu_memory_utilization", "raise", "more KV-cache memory: fewer samples evicted"),
            Lever(VA + "rollout.max_num_seqs", "lower", "fewer samples at once share the KV cache"),
            Lever(VA + "rollout.enable_prefix_caching", "True", "a group's shared prompt cached once"),
        ),
        "mindspeed": (
            Lever("generate_config.gpu_memory_utilization", "raise", "more KV-cache memory: fewer samples evicted"),
            Lever("generate_config.max_num_seqs", "lower", "fewer samples at once share the KV cache"),
        ),
    },
    "queued": {
        "verl": (
            Lever(VA + "rollout.agent.num_workers", "raise", "more agent-loop workers send samples at once"),
            Lever(VA + "rollout.max_num_seqs", "raise", "more samples run at once in the engine"),
        ),
        "mindspeed": (Lever("generate_config.max_num_seqs", "raise", "more samples run at once in the engine"),),
        "rlprof": (Lever("rollout.replicas", "raise", "async rollout: more replicas take requests at once"),),
    },
    "memory_headroom": {
        "verl": (
            Lever(
                VA + "actor.ppo_max_token_len_per_gpu",
                "raise",
                "with use_dynamic_bsz: more tokens per micro-batch in the memory left",
                UPDATE,
            ),
            Lever(VA + "actor.ppo_micro_batch_size_per_gpu", "raise", "larger micro-batches fit", UPDATE),
            Lever(
                VA + "rollout.gpu_memory_utilization",
                "raise",
                "a larger KV cache for the engine",
                ("rollout_generate",),
            ),
        ),
        "mindspeed": (
            Lever("actor_config.micro_batch_size", "raise", "larger micro-batches fit", UPDATE),
            Lever(
                "generate_config.gpu_memory_utilization",
                "raise",
                "a larger KV cache for the engine",
                ("rollout_generate",),
            ),
        ),
        "rlprof": (
            Lever("actor.micro_batch_size", "raise", "larger micro-batches fit", UPDATE),
            Lever("actor.log_prob_micro_batch_size", "raise", "larger micro-batches fit", OLD_LOG_PROB + REF_LOG_PROB),
        ),
    },
    "host_sync": {
        "rlprof": (
            Lever(
                "rollout.ignore_eos",
                "true",
                "rlprof's decode loop stops asking each token whether every row has ended (a host sync a token); "
                "every response then runs rollout.max_new_tokens long, which changes the experiment",
                ("rollout_generate",),
            ),
        )
    },
    "data_transfer": {
        "verl": (
            Lever(
                "transfer_queue.enable",
                "True",
                "batches move between roles through TransferQueue's storage units, not each through the driver",
            ),
        )
    },
    "host_wait": {
        "verl": (Lever("reward.num_workers", "raise", "more reward-loop workers wait at once", ("reward_compute",)),),
        "mindspeed": (
            Lever("rl_config.verifier_parallel", "raise", "more verifiers wait at once", ("reward_compute",)),
        ),
        "rlprof": (Lever("reward.workers", "raise", "more scoring threads wait at once", ("reward_compute",)),),
    },
    "garbage_collection": {
        "rlprof": (
            Lever(
                "trainer.gc_freeze",
                "true",
                "gc.freeze() once the models are built: the collector stops rescanning the long-lived objects",
            ),
        )
    },
}


def levers_for(cause: str, dialect: str, stage: str | None = None) -> list[Lever]:
    """The levers of `cause` in `dialect` that act on `stage`, first lever first."""
    return [lv for lv in LEVERS[cause].get(dialect, ()) if not lv.stages or stage in lv.stages]


def levers(cause: str, stage: str | None = None) -> dict[str, list[dict]]:
    """{dialect: [{key, set, why, text}]} for a cause found in `stage` (dialects with no lever left out)."""
    out = {}
    for dialect in DIALECTS:
        found = levers_for(cause, dialect, stage)
        if found:
            out[dialect] = [{"key": lv.key, "set": lv.set, "why": lv.why, "text": lv.text()} for lv in found]
    return out

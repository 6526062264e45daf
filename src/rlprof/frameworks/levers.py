"""The config keys that act on each cause of a slow RL step, per framework (data, keyed by the cause's name in
analyze/diagnosis/causes.py, the registry of causes, which refers to them).

They stay here, not in the registry, because they are facts about verl's, MindSpeed-RL's and rlprof's configs, as
the rest of frameworks/ is, and this layer sits below analyze.

A lever is a key of the framework's own config, the value or direction to turn it, and why it acts on the
cause. Keys are checked against each framework's real config (tests/test_diagnosis.py): verl's generated trainer
YAML at 1dda039, MindSpeed-RL's config classes at 05a90d7, rlprof's TrainConfig. A dialect with no entry for
a cause has no key known to act on it; a finding says so rather than invent one.

`stages` restricts a lever to the stages it acts on (a log-prob micro-batch size does nothing for the update).
`value` names the setting the run's own measures give a "raise"/"lower" lever (analyze/diagnosis/savings.py computes it:
the cap, the size, the workers), so that `rlprof advise --fix` writes a value, not a direction; `also` are keys
written with it (a token budget beside the switch that uses it), each a literal or a `{setting}`.
`changes_result`: the lever changes what the run learns, not only how fast (a response cap cuts responses and
changes their reward); such a lever comes after those that change no result, in every cause and dialect
(tests/test_plan.py). `effect`: its side effect where it has one (more memory held, an older policy's tokens),
said with it. `needs`: what the key needs besides the framework's main trainer (verl's fully-async trainer), said
with it; its key is checked against that trainer's config.

One key is never pulled two ways: across every cause, a key is raised or lowered in one direction and set to one
value (tests/test_plan.py checks every pair of causes), so that the levers of one run's findings make one
consistent config.

Over 400 lines because it is data: every cause's levers in three dialects, each with why, its side effect and
what it needs.
"""

from __future__ import annotations

from dataclasses import dataclass

DIALECTS = ("verl", "mindspeed", "rlprof")
FULLY_ASYNC = "verl's fully-async trainer (verl.experimental.fully_async_policy)"


@dataclass(frozen=True)
class Lever:
    key: str
    set: str  # the value to set, or a direction: "raise", "lower"
    why: str
    stages: tuple[str, ...] = ()  # empty: every stage the cause is found in
    value: str | None = None  # the setting (analyze/diagnosis/savings.py) a "raise"/"lower" lever is set to by --fix
    also: tuple[tuple[str, str], ...] = ()  # (key, literal or "{setting}") written with it by --fix
    changes_result: bool = False  # what the run learns changes, not only its speed (ranked after those that do not)
    effect: str = ""  # its side effect, where it has one
    needs: str = ""  # what the key needs besides the framework's main trainer

    def text(self) -> str:
        turn = f"{self.key}={self.set}" if self.set not in ("raise", "lower") else f"{self.set} {self.key}"
        notes = "".join(f"; {note}" for note in (self.effect, f"needs {self.needs}" if self.needs else "") if note)
        return f"{turn} ({self.why}{notes})"


# side effects said with the levers
PARTIAL = (
    "a long response's later tokens are sampled by a newer policy than its first (off-policy by the steps it spans)"
)
CAP = "responses longer than the cap are cut and their reward changes: the cap is offered at or above a high "
CAP += "percentile of the sampled lengths and says what it cuts"
FILLED = "the batch keeps the first pass's informative groups and fills with filtered ones (zero advantage)"
KV_MORE = "more of the device's memory held by the engine's KV cache"
TOOL_CUT = "the policy reads the tools' answers cut: what it learns from them changes"
LARGER = "more memory a micro-batch (its activations grow with its rows)"
UPDATE = ("actor_update",)
OLD_LOG_PROB = ("actor_compute_log_prob",)
REF_LOG_PROB = ("ref_compute_log_prob",)
VA = "actor_rollout_ref."

# The engine's KV cache cannot hold the samples it runs (vLLM's scheduler: requests wait with the cache full, or are
# preempted and recomputed): more memory for the cache, the weights sharded to make room, a group's prompt held once.
KV_MEMORY: dict[str, tuple[Lever, ...]] = {
    "verl": (
        Lever(
            VA + "rollout.gpu_memory_utilization",
            "raise",
            "more KV-cache memory: the batch runs at once, none evicted",
            effect=KV_MORE,
        ),
    ),
    "mindspeed": (
        Lever(
            "generate_config.gpu_memory_utilization",
            "raise",
            "more KV-cache memory: the batch runs at once, none evicted",
            effect=KV_MORE,
        ),
    ),
    "rlprof": (
        Lever(
            "rollout.kv_cache_memory_bytes",
            "raise",
            "more KV-cache memory: the batch runs at once, none evicted (rollout.engine=vllm)",
            value="kv_cache_memory_bytes",
            effect=KV_MORE,
        ),
    ),
}
SHARDED = "more devices per engine (fewer engines), a collective per layer"
KV_LEVERS: dict[str, tuple[Lever, ...]] = {
    "verl": KV_MEMORY["verl"]
    + (
        Lever(
            VA + "rollout.tensor_model_parallel_size",
            "raise",
            "the weights sharded over more devices leave each more memory for the KV cache",
            effect=SHARDED,
        ),
        Lever(VA + "rollout.enable_prefix_caching", "True", "a group's shared prompt held once in the KV cache"),
    ),
    "mindspeed": KV_MEMORY["mindspeed"]
    + (
        Lever(
            "generate_config.infer_tensor_parallel_size",
            "raise",
            "the weights sharded over more devices leave each more memory for the KV cache",
            effect=SHARDED,
        ),
        Lever("generate_config.enable_prefix_caching", "true", "a group's shared prompt held once in the KV cache"),
    ),
    "rlprof": KV_MEMORY["rlprof"],
}

LEVERS: dict[str, dict[str, tuple[Lever, ...]]] = {
    "rollout_tail": {
        "verl": (
            Lever(
                "async_training.partial_rollout",
                "True",
                "partial rollout: the step goes on with the responses that finished, a long one is carried on",
                effect=PARTIAL,
                needs=FULLY_ASYNC,
            ),
            Lever(
                "data.max_response_length",
                "lower",
                "caps the longest response the batch waits for",
                value="max_new_tokens",
                changes_result=True,
                effect=CAP,
            ),
        ),
        "mindspeed": (
            Lever(
                "rl_config.partial_rollout_max_split",
                "raise",
                "partial rollout: a long response is continued in the next step instead of held for",
                effect=PARTIAL,
            ),
            Lever(
                "generate_config.sampling_config.max_tokens",
                "lower",
                "caps the longest response the batch waits for",
                value="max_new_tokens",
                changes_result=True,
                effect=CAP,
            ),
        ),
        "rlprof": (
            Lever(
                "rollout.max_new_tokens",
                "lower",
                "caps the longest response the batch waits for",
                value="max_new_tokens",
                changes_result=True,
                effect=CAP,
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
                effect=LARGER,
            ),
            Lever(
                VA + "rollout.log_prob_micro_batch_size_per_gpu",
                "raise",
                "fewer, fuller old-log-prob passes",
                OLD_LOG_PROB,
                value="micro_batch_size",
                effect=LARGER,
            ),
            Lever(
                VA + "ref.log_prob_micro_batch_size_per_gpu",
                "raise",
                "fewer, fuller reference passes",
                REF_LOG_PROB,
                value="micro_batch_size",
                effect=LARGER,
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
                effect=LARGER,
            ),
            Lever(
                "rl_config.actor_forward_micro_batch_size",
                "raise",
                "fewer, fuller old-log-prob passes",
                OLD_LOG_PROB,
                value="micro_batch_size",
                effect=LARGER,
            ),
            Lever(
                "rl_config.ref_forward_micro_batch_size",
                "raise",
                "fewer, fuller reference passes",
                REF_LOG_PROB,
                value="micro_batch_size",
                effect=LARGER,
            ),
            Lever("rl_config.use_dynamic_bsz", "true", "micro-batches filled to a token budget instead"),
        ),
        "rlprof": (
            Lever(
                "actor.micro_batch_size",
                "raise",
                "fewer, fuller update passes",
                UPDATE,
                value="micro_batch_size",
                effect=LARGER,
            ),
            Lever(
                "actor.log_prob_micro_batch_size",
                "raise",
                "fewer, fuller log-prob passes",
                OLD_LOG_PROB + REF_LOG_PROB,
                value="micro_batch_size",
                effect=LARGER,
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
            Lever(VA + "actor.ppo_micro_batch_size_per_gpu", "raise", "more work per launch", UPDATE, effect=LARGER),
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
            Lever("actor.micro_batch_size", "raise", "more work per launch", UPDATE, effect=LARGER),
            Lever(
                "actor.log_prob_micro_batch_size",
                "raise",
                "more work per launch",
                OLD_LOG_PROB + REF_LOG_PROB,
                effect=LARGER,
            ),
        ),
    },
    "slow_tools": {
        "verl": (
            Lever(VA + "rollout.multi_turn.max_parallel_calls", "raise", "a turn's tool calls run at once"),
            Lever(
                VA + "rollout.multi_turn.max_tool_response_length",
                "lower",
                "shorter tool answers to read back",
                changes_result=True,
                effect=TOOL_CUT,
            ),
        ),
        "mindspeed": (
            Lever("rl_config.max_parallel_calls", "raise", "a turn's tool calls run at once"),
            Lever(
                "rl_config.max_tool_response_length",
                "lower",
                "shorter tool answers to read back",
                changes_result=True,
                effect=TOOL_CUT,
            ),
        ),
    },
    # a queue inside the engine and preemption: KV-cache memory, the engine's slots, or the two not told apart
    "kv_cache": KV_LEVERS,
    "preemption": KV_LEVERS,  # preemption is the KV cache's: the engine evicts for want of its blocks
    "engine_queue": KV_MEMORY,  # KV or slots not told apart: more KV memory, which a slot-bound queue cannot worsen
    "slot_bound": {
        "verl": (
            Lever(
                VA + "rollout.max_num_seqs",
                "raise",
                "more samples run at once in the engine (its KV cache has room: they wait for a slot)",
                value="max_num_seqs",
            ),
            Lever(
                VA + "rollout.max_num_batched_tokens",
                "raise",
                "more tokens an engine iteration may schedule (a prompt waits for the token budget)",
            ),
        ),
        "mindspeed": (
            Lever(
                "generate_config.max_num_seqs",
                "raise",
                "more samples run at once in the engine (its KV cache has room: they wait for a slot)",
                value="max_num_seqs",
            ),
            Lever(
                "generate_config.max_num_batched_tokens",
                "raise",
                "more tokens an engine iteration may schedule (a prompt waits for the token budget)",
            ),
        ),
        "rlprof": (
            Lever(
                "rollout.max_num_seqs",
                "raise",
                "more samples run at once in the engine (rollout.engine=vllm; its KV cache has room)",
                value="max_num_seqs",
            ),
        ),
    },
    "queued": {  # before the engine: the samples wait for a worker or replica to send them
        "verl": (Lever(VA + "rollout.agent.num_workers", "raise", "more agent-loop workers send samples at once"),),
        "rlprof": (Lever("rollout.replicas", "raise", "async rollout: more replicas take requests at once"),),
    },
    "dynamic_sampling": {
        "verl": (
            Lever(
                "algorithm.filter_groups.max_inflight_gen_batches",
                "raise",
                "v1 trainer: refill prompts dispatched while the first batch generates, not after it",
            ),
            Lever(
                "data.gen_batch_size",
                "raise",
                "legacy trainer: more prompts in each generation batch: fewer refill batches needed",
            ),
            Lever(
                "algorithm.filter_groups.max_num_gen_batches",
                "lower",
                "legacy trainer: fewer generation batches per step",
                changes_result=True,
                effect=FILLED,
            ),
        ),
        "mindspeed": (
            Lever(
                "rl_config.filter_groups_max_batches",
                "lower",
                "fewer refill generation batches per step",
                changes_result=True,
                effect=FILLED,
            ),
            Lever(
                "rl_config.filter_groups_train_batch_size",
                "lower",
                "fewer informative groups needed per step: fewer refills",
                changes_result=True,
                effect="each step trains on fewer groups",
            ),
        ),
        "rlprof": (
            Lever("dapo.max_sampling_retries", "0", "no refill pass", changes_result=True, effect=FILLED),
            Lever(
                "rollout.n",
                "raise",
                "more samples per prompt: fewer groups whose rewards are all equal",
                changes_result=True,
                effect="larger groups: each sample's advantage is against more of its group, and the step costs more",
            ),
        ),
    },
    "rollout_outside": {
        "verl": (
            Lever(
                VA + "rollout.free_cache_engine",
                "False",
                "the engine keeps its weights and KV cache between steps: no sleep after the rollout, no wake-up before "
                "the next (more memory held)",
            ),
        )
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
                "rlprof's decode loop stops asking each token whether every row has ended (a host sync a token)",
                ("rollout_generate",),
                changes_result=True,
                effect="every response then runs rollout.max_new_tokens long: the responses and their rewards change",
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
    """{dialect: [{key, set, why, text, changes_result, [effect], [needs]}]} for a cause found in `stage` (dialects
    with no lever left out)."""
    out = {}
    for dialect in DIALECTS:
        found = levers_for(cause, dialect, stage)
        if found:
            out[dialect] = [lever_record(lv) for lv in found]
    return out


def lever_record(lv: Lever) -> dict:
    """A lever as the document says it."""
    out = {"key": lv.key, "set": lv.set, "why": lv.why, "text": lv.text(), "changes_result": lv.changes_result}
    out.update({k: v for k, v in (("effect", lv.effect), ("needs", lv.needs)) if v})
    return out


def pulled_both_ways(entries: list[tuple[str, str]]) -> dict[str, set[str]]:
    """key -> the ways it is turned, for the keys of (key, set) pairs turned more than one way: raised and lowered,
    or set to two values (a direction beside a value is one way: --fix writes the value)."""
    ways: dict[str, set[str]] = {}
    for key, turn in entries:
        ways.setdefault(key, set()).add(turn)
    return {k: v for k, v in ways.items() if {"raise", "lower"} <= v or len(v - {"raise", "lower"}) > 1}

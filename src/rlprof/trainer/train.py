"""The GRPO / DAPO training loop, instrumented with rlprof at every stage and unit.

One step: (weight_sync) -> rollout_generate -> reward_compute [-> DAPO refill] ->
ref_compute_log_prob -> actor_compute_log_prob -> advantage_compute -> actor_update.

Over 400 lines because it is one job: the trainer's setup and its step, stage by stage, with the step's metrics.
"""

from __future__ import annotations

import copy
import gc
import json
import math
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from ..collect import Profiler
from ..collect.cpu_wait import current_thread_wait_ms, sample, since
from ..warn_once import warn_once
from .actor import batched_log_probs, policy_update
from .algorithms import group_advantages, informative_groups, overlong_penalty
from .config import TrainConfig
from .data import PromptBatch, SumMod10Task
from .model import build_model, build_tokenizer
from .reward import close_pools, exact_match, verify
from .rollout import Rollout, generate
from .sample_records import TrainerSamples
from .step_log import StepLog

SYNC_ROLES = ("actor", "rollout", "ref", "reward")
ASYNC_DRIVER_ROLES = ("actor", "ref", "reward")  # rollout profiles itself in the replicas


def _repeat(batch: PromptBatch, n: int) -> PromptBatch:
    """Each prompt n times, consecutively: the n samples of a group sit next to each other."""
    return PromptBatch(
        batch.input_ids.repeat_interleave(n, 0),
        batch.attention_mask.repeat_interleave(n, 0),
        [a for a in batch.answers for _ in range(n)],
    )


def _shard(model, reshard_after_forward: bool = True) -> None:
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer, reshard_after_forward=reshard_after_forward)
    fully_shard(model, reshard_after_forward=reshard_after_forward)


class Trainer:
    def __init__(self, cfg: TrainConfig, plan, *, rank: int = 0, world_size: int = 1, run_id: str | None = None):
        self.cfg, self.plan, self.rank, self.world_size = cfg, plan, rank, world_size
        self.device = torch.device(cfg.trainer.device)
        self.distributed = world_size > 1
        self.is_async = cfg.rollout.mode == "async"
        seed = cfg.trainer.seed
        self.tok = build_tokenizer(cfg.model)
        self.task = SumMod10Task(self.tok, seed + 7919 * rank)
        self.actor = build_model(cfg.model, self.tok.vocab_size, seed).to(self.device)
        self.ref = copy.deepcopy(self.actor).eval().requires_grad_(False)
        self.rollout_model = None  # a separate copy only where rollout holds its own weights
        if self.distributed:
            if not cfg.rollout.share_actor_weights:
                self.rollout_model = copy.deepcopy(self.actor).eval()
            _shard(self.actor, cfg.actor.reshard_after_forward)
            _shard(self.ref)
        shape = getattr(self.actor, "config", None)  # a checkpoint's own width and depth (model.path)
        width = getattr(shape, "hidden_size", None) or cfg.model.hidden_size
        depth = getattr(shape, "num_hidden_layers", None) or cfg.model.num_layers
        self.lr, self.lr_from = cfg.actor_lr(int(width), int(depth))
        self.optimizer = torch.optim.AdamW(self.actor.parameters(), lr=self.lr, weight_decay=cfg.actor.weight_decay)
        # Adam's first updates are sign-like (m / sqrt(v) is +-1 at step 1), however small the gradient: ramp them
        warmup = cfg.actor.lr_warmup_steps
        self.lr_schedule = (
            torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda k: min(1.0, (k + 1) / warmup)) if warmup else None
        )
        self.sample_gen = torch.Generator(device=self.device).manual_seed(seed * 1000 + rank)
        self.shuffle_gen = torch.Generator().manual_seed(seed + rank)
        roles = ASYNC_DRIVER_ROLES if self.is_async else SYNC_ROLES
        self.prof = Profiler(plan, rank=rank, world_size=world_size, role=roles, run_id=run_id)
        self.engine = None
        if self.is_async:
            from .async_rollout import AsyncRollout

            self.engine = AsyncRollout(cfg, self.tok.vocab_size, plan, self.prof.run_id, host=self.prof)
        elif cfg.rollout.engine == "vllm":
            from .vllm_rollout import VllmRollout

            self.engine = VllmRollout(cfg, self.actor, self.tok, self.prof)
        self.samples = TrainerSamples(self.prof, cfg, rank, "async" if self.is_async else cfg.rollout.engine)
        self.slow_ms = cfg.trainer.debug.slow_ms if cfg.trainer.debug.slow_rank == rank else 0.0
        inject = cfg.trainer.debug.inject_slowdown
        self.inject = inject if inject.from_step is not None and inject.rank in (None, rank) else None
        self.step_now = 0
        self.timings: dict[str, float] = {}
        if cfg.trainer.gc_freeze:  # the models, optimizer and engine built: their objects leave the collector's scans
            gc.collect()
            gc.freeze()

    # ---- helpers ----------------------------------------------------------------------------
    @contextmanager
    def stage(self, name: str):
        t0 = time.perf_counter()
        with self.prof.stage(name):
            yield
            if self.inject is not None and name == self.inject.stage and self.step_now >= self.inject.from_step:
                time.sleep(self.inject.seconds)  # the test aid trainer.debug.inject_slowdown
        self.timings[name] = self.timings.get(name, 0.0) + (time.perf_counter() - t0) * 1e3

    def unit(self, name: str):
        return lambda **held: self.prof.unit(name, **held)

    def _gen_params(self) -> dict:
        r = self.cfg.rollout
        return dict(
            max_new_tokens=r.max_new_tokens,
            eos_id=self.tok.eos_id,
            pad_id=self.tok.pad_id,
            temperature=r.temperature,
            top_p=r.top_p,
            ignore_eos=r.ignore_eos,
            hold_tokens=self.cfg.trainer.debug.long_sample.tokens,  # a test aid: the long sample's tokens
        )

    def _mean_across_ranks(self, values: list[float]) -> list[float]:
        if not self.distributed:
            return values
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t)
        return (t / self.world_size).tolist()

    # ---- stages -----------------------------------------------------------------------------
    def weight_sync(self, step: int) -> None:
        if self.engine is not None:
            with self.stage("weight_sync"):
                self.engine.push_weights(self.actor)
        elif self.rollout_model is not None:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            with self.stage("weight_sync"):
                full = get_model_state_dict(self.actor, options=StateDictOptions(full_state_dict=True))
                self.rollout_model.load_state_dict(full)

    def sample(self, step: int, prompts: PromptBatch) -> tuple[Rollout, torch.Tensor, torch.Tensor, list[str]]:
        """Generate n samples per prompt and score them (DAPO: refill with informative groups)."""
        cfg, n = self.cfg, self.cfg.rollout.n
        batch = _repeat(prompts, n)
        rollout, rewards, scores = self._generate_and_score(step, batch)
        answers = batch.answers
        if cfg.trainer.algorithm != "dapo" or not cfg.dapo.dynamic_sampling:
            return rollout, rewards, scores, answers
        want = prompts.input_ids.shape[0]
        keep = informative_groups(scores, n)
        pools = [(rollout, rewards, scores, answers, keep)]
        for _ in range(cfg.dapo.max_sampling_retries):
            if sum(int(k.sum()) for *_, k in pools) >= want:
                break
            extra = _repeat(self.task.sample(want), n)
            r2, rw2, s2 = self._generate_and_score(step, extra)
            pools.append((r2, rw2, s2, extra.answers, informative_groups(s2, n)))
        # informative groups first; fill up with the others (zero advantage) so every rank keeps its shape
        chosen = [(p, g) for p, (*_, k) in enumerate(pools) for g in range(len(k)) if k[g]]
        chosen += [(p, g) for p, (*_, k) in enumerate(pools) for g in range(len(k)) if not k[g]]
        chosen = chosen[:want]
        self.kept_groups = sum(1 for p, g in chosen if pools[p][4][g])
        rows = lambda g: torch.arange(g * n, (g + 1) * n)  # noqa: E731
        parts = [
            (pools[p][0].select(rows(g)), pools[p][1][rows(g)], pools[p][2][rows(g)], pools[p][3][g * n : (g + 1) * n])
            for p, g in chosen
        ]
        width = max(x[0].response_ids.shape[1] for x in parts)
        pad = self.tok.pad_id
        f = torch.nn.functional.pad
        engine_lp = (
            None
            if any(x[0].engine_log_probs is None for x in parts)
            else torch.cat(
                [f(x[0].engine_log_probs, (0, width - x[0].engine_log_probs.shape[1]), value=0.0) for x in parts]
            )
        )
        rollout = Rollout(
            torch.cat([x[0].prompt_ids for x in parts]),
            torch.cat([x[0].prompt_mask for x in parts]),
            torch.cat([f(x[0].response_ids, (0, width - x[0].response_ids.shape[1]), value=pad) for x in parts]),
            torch.cat([f(x[0].response_mask, (0, width - x[0].response_mask.shape[1]), value=0) for x in parts]),
            engine_lp,
        )
        return (
            rollout,
            torch.cat([x[1] for x in parts]),
            torch.cat([x[2] for x in parts]),
            [a for x in parts for a in x[3]],
        )

    def _generate_and_score(self, step: int, batch: PromptBatch):
        cfg = self.cfg
        ids, mask = batch.input_ids.to(self.device), batch.attention_mask.to(self.device)
        rollout_pass, first, hold = self.samples.begin_pass(step, ids.shape[0])
        timing = [] if self.samples.wanted(step) else None  # where the engine keeps what the records need
        with self.stage("rollout_generate"):
            if self.engine is not None:
                rollout = self.engine.generate(step, ids.cpu(), mask.cpu(), self._gen_params(), timing, hold)
                rollout = rollout.to(self.device)
            else:
                model = self.rollout_model or self.actor
                rollout = generate(
                    model,
                    ids,
                    mask,
                    generator=self.sample_gen,
                    decode_step=self.unit("decode_step"),
                    clock=timing,
                    hold_eos=hold,
                    **self._gen_params(),
                )
        reward_ns = None if timing is None else []
        with self.stage("reward_compute"):
            rewards = verify(
                rollout.response_ids.cpu(),
                rollout.response_mask.cpu(),
                batch.answers,
                self.tok,
                cost_ms=cfg.reward.cost_ms,
                workers=cfg.reward.workers,
                timings=reward_ns,
            )
            scores = rewards.clone()
            if cfg.trainer.algorithm == "dapo":
                lengths = rollout.response_mask.sum(1).cpu()
                scores = scores + overlong_penalty(
                    lengths, cfg.rollout.max_new_tokens, cfg.dapo.overlong_buffer, cfg.dapo.overlong_penalty
                )
        dynamic = cfg.trainer.algorithm == "dapo" and cfg.dapo.dynamic_sampling
        filtered = (~informative_groups(scores, cfg.rollout.n)).tolist() if dynamic and timing is not None else None
        self.samples.end_pass(step, rollout_pass, first, rollout, timing, reward_ns, filtered)
        return rollout, rewards, scores

    def train_step(self, step: int) -> dict:
        cfg = self.cfg
        self.timings = {}
        self.step_now = step
        self.kept_groups = None
        t0 = time.perf_counter()
        threads_at_start = sample()
        own_wait_at_start = current_thread_wait_ms()  # the training thread: it runs every stage
        with self.prof.step(step):
            self.weight_sync(step)
            prompts = self.task.sample(cfg.data.prompts_per_step // self.world_size)
            rollout, rewards, scores, answers = self.sample(step, prompts)
            mb, a = cfg.log_prob_micro_batch_size, cfg.actor
            packing = dict(dynamic=a.use_dynamic_bsz, max_tokens=a.max_token_len)
            ref_lp = None
            if cfg.uses_reference():
                with self.stage("ref_compute_log_prob"):
                    ref_lp = batched_log_probs(
                        self.ref, rollout, mb, cfg.rollout.temperature, self.unit("micro_batch"), **packing
                    )
            with self.stage("actor_compute_log_prob"):
                old_lp = batched_log_probs(
                    self.actor, rollout, mb, cfg.rollout.temperature, self.unit("micro_batch"), **packing
                )
            with self.stage("advantage_compute"):
                advantages = group_advantages(scores, cfg.rollout.n).to(self.device)
            with self.stage("actor_update"):
                stats = policy_update(
                    self.actor,
                    self.optimizer,
                    rollout,
                    old_lp,
                    ref_lp,
                    advantages,
                    cfg=cfg,
                    generator=self.shuffle_gen,
                    mini_batch=self.unit("mini_batch"),
                    micro_batch=self.unit("micro_batch"),
                    slow_ms=self.slow_ms,
                    lr_schedule=self.lr_schedule,
                )
        lengths = rollout.response_mask.sum(1).float()
        acc = exact_match(rollout.response_ids.cpu(), rollout.response_mask.cpu(), answers, self.tok)
        waits = since(threads_at_start)
        own_wait = current_thread_wait_ms() - own_wait_at_start if own_wait_at_start is not None else None
        reward, acc, length, kl, clip, ent, wait_mean = self._mean_across_ranks(
            [
                float(rewards.mean()),
                acc,
                float(lengths.mean()),
                stats["kl"],
                stats["clip_frac"],
                stats["entropy"],
                own_wait or 0.0,
            ]
        )
        metrics = {
            "step": step,
            "reward_mean": reward,
            "accuracy": acc,
            "response_length": length,
            "kl": kl,
            "clip_frac": clip,
            "entropy": ent,
            "grad_norm": stats["grad_norm"],
            "pg_loss": stats["pg_loss"],
            "lr": stats["lr"],
            "micro_batches": stats["micro_batches"],
            "step_ms": (time.perf_counter() - t0) * 1e3,
            "stage_ms": dict(self.timings),
            **waits,
            # a profiled step pays the profiler's collection and export: metrics-first advice leaves it out
            "profiled": any(r.enabled and step in (r.steps or ()) for r in self.plan.roles),
        }
        if own_wait is not None:  # the training thread's wait, summed over the ranks: each holds the others up
            metrics["run_wait_train_ms"] = wait_mean * self.world_size
        if self.kept_groups is not None:
            metrics["informative_groups"] = self.kept_groups
        if rollout.engine_log_probs is not None:  # the engine's sampling against the trainer's recompute of it
            m = rollout.response_mask.float()
            gap = ((rollout.engine_log_probs - old_lp).abs() * m).sum() / m.sum().clamp(min=1)
            metrics["rollout_log_prob_gap"] = self._mean_across_ranks([float(gap)])[0]
        return metrics

    def close(self) -> dict | None:
        replica_steps = self.engine.close() if self.engine is not None else None
        close_pools()
        self.samples.close()
        self.prof.close()
        return replica_steps


def run_training(
    cfg: TrainConfig,
    plan,
    *,
    rank: int = 0,
    world_size: int = 1,
    on_step=None,
    run_id: str | None = None,
    metrics_dir: Path | None = None,
    console=None,
) -> tuple[list[dict], Trainer]:
    """Train; with `metrics_dir`, rank 0 appends each step's metrics to `<metrics_dir>/<run id>/metrics.jsonl` as
    the step ends (`trainer.metrics_path`): a job preempted at step 900 keeps its 899 steps; and sends them with
    rlprof's measures of the step to the trackers `trainer.logger` names (step_log.py; `console`: where the console
    tracker's lines go)."""
    trainer = Trainer(cfg, plan, rank=rank, world_size=world_size, run_id=run_id)
    log = None
    if metrics_dir is not None and rank == 0:
        log = StepLog(cfg, trainer.prof, Path(metrics_dir), console=console)
    trainer.metrics_path = log.path if log is not None else None
    history = []
    try:
        for step in range(1, cfg.trainer.steps + 1):
            metrics = trainer.train_step(step)
            history.append(metrics)
            if log is not None:  # on disk before the step is said done: a signal between them loses no said step
                log.append(metrics)
            if on_step is not None:
                on_step(metrics)
            why = diverging(metrics)
            if why and rank == 0:
                warn_once(
                    "diverging",
                    "rlprof train: the run diverges at step %d: %s; lr %.3g (%s): set a lower actor.lr (docs/trainer.md)",
                    step,
                    why,
                    trainer.lr,
                    trainer.lr_from,
                )
    finally:
        if log is not None:
            log.close()
        trainer.replica_steps = trainer.close()
    return history, trainer


KL_DIVERGED = 10.0  # nats per token from the reference: far beyond any run that trains (the defaults stay below 1)


def diverging(m: dict) -> str | None:
    """Why a step's numbers say the run diverges, or None: its loss or KL not finite, or its KL exploding."""
    for key in ("pg_loss", "kl", "entropy"):
        if not math.isfinite(m[key]):
            return f"{key} is {m[key]}"
    if m["kl"] > KL_DIVERGED:
        return f"KL from the reference {m['kl']:.4g} per token (above {KL_DIVERGED:g})"
    return None


def write_metrics(history: list[dict], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "metrics.jsonl"
    with open(path, "w") as f:
        for m in history:
            f.write(json.dumps(m) + "\n")
    return path


def write_run_config(cfg: TrainConfig, dirs, threads: dict | None = None, lr: dict | None = None, model=None) -> None:
    """The settings a diagnosis needs beside the traces (the KL term on and its weight, the threads and why, the actor's
    learning rate and its source, the model in Hugging Face's terms), as `trainer_config.json` in each run directory
    that exists: the whole config and what it implies."""
    import dataclasses

    text = json.dumps(
        {
            "framework": "rlprof",
            "config": dataclasses.asdict(cfg),
            "reference_pass": cfg.uses_reference(),
            "kl_coef": cfg.kl_coef(),
            "threads": threads,
            "lr": lr,
            "model": model,
        },
        indent=1,
    )
    for d in dirs:
        if Path(d).is_dir():
            (Path(d) / "trainer_config.json").write_text(text)

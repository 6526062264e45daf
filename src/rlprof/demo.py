"""A small, real RL-shaped loop instrumented with rlprof (the host used by tests and `rlprof demo`).

Every stage of an RL step runs real torch work on a tiny policy: token-by-token sampling (one
decode_step per token), reward, reference and old log-probs over micro-batches, advantages, and
an update over mini- and micro-batches with gradient accumulation; under torchrun, gradients are
all-reduced over gloo so collectives appear in the traces.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # quiet Kineto's per-window info lines; read when torch loads

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from .collect import Profiler  # noqa: E402


@dataclass
class DemoShape:
    steps: int = 3
    batch: int = 8  # sequences per step
    decode_steps: int = 64
    mini_batches: int = 2
    micro_batches: int = 4  # per mini-batch
    vocab: int = 64
    hidden: int = 64
    seed: int = 0


class TinyPolicy(torch.nn.Module):
    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.mix = torch.nn.Linear(hidden, hidden)
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        h = torch.cumsum(h, dim=1) / torch.arange(1, tokens.shape[1] + 1, device=tokens.device)[None, :, None]
        return self.head(torch.tanh(self.mix(h)))


def _log_probs(model: TinyPolicy, seqs: torch.Tensor) -> torch.Tensor:
    logits = model(seqs[:, :-1])
    return torch.gather(F.log_softmax(logits, -1), 2, seqs[:, 1:, None]).squeeze(-1)


def _chunks(x: torch.Tensor, n: int):
    return torch.chunk(x, n, dim=0)


@torch.no_grad()
def _batched_log_probs(prof: Profiler, model: TinyPolicy, seqs: torch.Tensor, n_micro: int) -> torch.Tensor:
    parts = []
    for part in _chunks(seqs, n_micro):
        with prof.unit("micro_batch"):
            parts.append(_log_probs(model, part))
    return torch.cat(parts)


def run_demo(prof: Profiler, shape: DemoShape = DemoShape()) -> list[float]:
    """Run the loop; returns the mean reward per step."""
    torch.manual_seed(shape.seed)
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    actor = TinyPolicy(shape.vocab, shape.hidden)
    ref = TinyPolicy(shape.vocab, shape.hidden)
    ref.load_state_dict(actor.state_dict())
    ref.requires_grad_(False)
    opt = torch.optim.AdamW(actor.parameters(), lr=1e-2)
    target = shape.vocab // 2  # reward: fraction of generated tokens in the upper half of the vocabulary
    rewards_per_step = []
    n_micro = shape.mini_batches * shape.micro_batches
    for step in range(1, shape.steps + 1):
        with prof.step(step):
            with prof.stage("rollout_generate"), torch.no_grad():
                seqs = torch.zeros(shape.batch, 1, dtype=torch.long)
                for _ in range(shape.decode_steps):
                    with prof.unit("decode_step"):
                        logits = actor(seqs)[:, -1]
                        nxt = torch.multinomial(F.softmax(logits, -1), 1)
                        seqs = torch.cat([seqs, nxt], dim=1)
            with prof.stage("reward_compute"):
                rewards = (seqs[:, 1:] >= target).float().mean(dim=1)
            with prof.stage("ref_compute_log_prob"):
                ref_lp = _batched_log_probs(prof, ref, seqs, n_micro)
            with prof.stage("actor_compute_log_prob"):
                old_lp = _batched_log_probs(prof, actor, seqs, n_micro)
            with prof.stage("advantage_compute"):
                adv = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
            with prof.stage("actor_update"):
                for mini in range(shape.mini_batches):
                    with prof.unit("mini_batch"):
                        idx = torch.arange(mini, shape.batch, shape.mini_batches)
                        opt.zero_grad(set_to_none=True)
                        for part in _chunks(idx, shape.micro_batches):
                            with prof.unit("micro_batch"):
                                lp = _log_probs(actor, seqs[part])
                                ratio = torch.exp(lp - old_lp[part])
                                clipped = torch.clamp(ratio, 0.8, 1.2)
                                a = adv[part, None]
                                kl = torch.exp(ref_lp[part] - lp) - (ref_lp[part] - lp) - 1
                                loss = -(torch.minimum(ratio * a, clipped * a)).mean() + 0.01 * kl.mean()
                                (loss / shape.micro_batches).backward()
                        if distributed:
                            for p in actor.parameters():
                                torch.distributed.all_reduce(p.grad)
                                p.grad /= torch.distributed.get_world_size()
                        opt.step()
            rewards_per_step.append(float(rewards.mean()))
    return rewards_per_step


def run_module(config: str | None, overrides: list[str]) -> int:
    from .config import load_plan

    plan = load_plan(config, overrides)  # validated before any process group starts
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo")
    try:
        prof = Profiler(plan)
        steps = int(os.environ.get("RLPROF_DEMO_STEPS", "3"))
        with prof:
            run_demo(prof, DemoShape(steps=steps))
        if torch.distributed.is_initialized():
            torch.distributed.barrier()  # leave together: gloo aborts a rank whose peer tears down mid-export
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m rlprof.demo [CONFIG] [overrides]` (also under torchrun)."""
    from .collect.shutdown import module_entry

    return module_entry(run_module, argv)


if __name__ == "__main__":
    raise SystemExit(main())

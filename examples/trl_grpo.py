"""TRL's GRPOTrainer on a tiny model, profiled by an rlprof YAML plan: nothing in TRL is edited.

    python examples/trl_grpo.py                                  # examples/configs/trl.yaml, 3 steps
    python examples/trl_grpo.py examples/configs/trl.yaml global_profiler.steps=[1,3]
    accelerate launch --num_processes 2 examples/trl_grpo.py     # ranks from the trainer's process index

The model (a 2-layer Qwen2) is built from a config and saved to a local directory with a character
tokenizer (TRL builds its reference model from that path); prompts are generated ("a+b=", answer
(a+b) mod 10); the reward is a rule. Runs on CPU in well under a minute.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHARS = list("0123456789+=") + ["<pad>", "<bos>", "<eos>"]


def build_checkpoint(path: Path, seed: int = 0) -> Path:
    """A tiny Qwen2 + a character-level fast tokenizer, saved as a local Hugging Face checkpoint."""
    from rlprof.trainer.model import build_char_checkpoint

    return build_char_checkpoint(path, CHARS, seed)


def prompts(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randrange(10), rng.randrange(10)
        out.append({"prompt": f"{a}+{b}=", "answer": str((a + b) % 10)})
    return out


def sum_mod_10_reward(completions, answer, **_) -> list[float]:
    """1 when the completion starts with the right digit, else 0."""
    return [1.0 if c.strip()[:1] == a else 0.0 for c, a in zip(completions, answer)]


def build_trainer(workdir: Path, steps: int, grad_accum: int, seed: int = 0):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model_dir = build_checkpoint(workdir / "tiny-qwen2", seed)
    args = GRPOConfig(output_dir=str(workdir / "trl_out"), max_steps=steps, per_device_train_batch_size=4,
                      gradient_accumulation_steps=grad_accum, num_generations=4, max_completion_length=4,
                      learning_rate=1e-3, beta=0.04, logging_steps=1, save_strategy="no", report_to=[],
                      use_cpu=True, seed=seed, temperature=1.0, disable_tqdm=True, dataloader_num_workers=0)
    return GRPOTrainer(model=str(model_dir), reward_funcs=sum_mod_10_reward, args=args,
                       train_dataset=Dataset.from_list(prompts(256, seed)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("args", nargs="*", help="[CONFIG.yaml] then key=value overrides of the profiling plan")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--grad-accum", type=int, default=4)
    ap.add_argument("--workdir", type=Path, default=Path("outputs/trl_example"))
    ap.add_argument("--no-profile", action="store_true", help="train without installing rlprof (bench baseline)")
    opts = ap.parse_args(argv)
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    config, overrides = (opts.args[0], opts.args[1:]) if opts.args and "=" not in opts.args[0] else \
        (str(HERE / "configs" / "trl.yaml"), opts.args)
    trainer = build_trainer(opts.workdir, opts.steps, opts.grad_accum)
    hooks = None
    if not opts.no_profile:
        import rlprof.integrations.trl as rltrl

        hooks = rltrl.profile(trainer, (config, overrides))
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    print(f"trl GRPO: {trainer.state.global_step} steps in {seconds:.1f} s, reward per step: "
          + ", ".join(f"{r:.2f}" for r in rewards))
    if hooks is not None and hooks.prof.windows_written:
        print(f"profile: {hooks.prof.run_dir('actor')}  (rlprof analyze / rlprof report on it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

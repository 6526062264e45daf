"""The reference trainer where a user turns it: the learning rate scales with the square of the model's width and with
its depth (with a warm-up), and the KL loss bounds the drift from the reference, so a bigger model or a longer run
trains rather than diverges; a run that diverges says so in one line. The long runs (a 512-wide model at seeds 0-4 for
30 steps) are bench/trainer_stability.py's."""

import json

import pytest

from conftest import run_cli
from helpers import stays_near_its_reference

from rlprof.trainer.config import TrainConfig, scaled_lr

SIZE_512 = (
    "model.hidden_size=512",
    "model.num_layers=4",
    "model.num_heads=8",
    "model.num_kv_heads=4",
    "model.intermediate_size=2048",
)


def train(tmp_path, *overrides):
    proc = run_cli(
        "train", f"trainer.output_dir={tmp_path}/train", "global_profiler.tool=null", *overrides, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = [p for p in (tmp_path / "train").iterdir() if p.is_dir()]
    history = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return proc, history, json.loads((run / "trainer_config.json").read_text())


def test_the_rule_keeps_the_tiny_default_and_scales_with_the_square_of_the_width_and_the_depth():
    assert scaled_lr(64, 2) == 5e-3  # the tiny default's rate, as before the rule
    assert scaled_lr(512, 4) == pytest.approx(5e-3 / 128) and scaled_lr(1024, 8) == pytest.approx(5e-3 / 1024)
    assert TrainConfig().actor_lr(512, 4)[0] == scaled_lr(512, 4)


def one_update_kl(width: int, layers: int, lr: float) -> float:
    """KL per response token between the policy before and after one AdamW step at `lr` (the first: sign-like) on a
    GRPO loss of one rollout of 8 prompts x 8 samples, the model `width` wide (intermediate 4x, head size 64) and
    `layers` deep; the tiny default's own shape at width 64."""
    import torch

    from rlprof.trainer.actor import response_log_probs
    from rlprof.trainer.algorithms import group_advantages
    from rlprof.trainer.config import ModelConfig
    from rlprof.trainer.data import CharTokenizer, SumMod10Task
    from rlprof.trainer.model import build_model
    from rlprof.trainer.rollout import generate
    from rlprof.trainer.train import _repeat

    tiny = width == 64
    shape = ModelConfig(
        hidden_size=width,
        num_layers=layers,
        intermediate_size=2 * width if tiny else 4 * width,
        num_heads=4 if tiny else width // 64,
        num_kv_heads=2 if tiny else width // 128,
    )
    tok = CharTokenizer()
    model = build_model(shape, tok.vocab_size, seed=1)
    batch = _repeat(SumMod10Task(tok, 1).sample(8), 8)
    with torch.no_grad():
        rollout = generate(
            model,
            batch.input_ids,
            batch.attention_mask,
            generator=torch.Generator().manual_seed(0),
            max_new_tokens=6,
            eos_id=tok.eos_id,
            pad_id=tok.pad_id,
            temperature=1.0,
            top_p=1.0,
            ignore_eos=False,
        )
    mask = rollout.response_mask.float()
    advantages = group_advantages(torch.randn(64, generator=torch.Generator().manual_seed(2)), 8)
    before, _ = response_log_probs(model, rollout, 1.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    (-(before * advantages[:, None] * mask).sum() / mask.sum()).backward()
    optimizer.step()
    with torch.no_grad():
        after, _ = response_log_probs(model, rollout, 1.0)
        d = before.detach() - after  # k3 of KL(before || after) on the tokens `before` sampled
        return float(((torch.exp(-d) + d - 1) * mask).sum() / mask.sum())


def test_one_update_at_the_scaled_rate_moves_a_wide_model_within_a_few_times_the_tiny_defaults():
    """What the rule is for: Adam's first update at the scaled rate moves a 512-wide 4-layer policy within a few times
    as far as it moves the tiny default's at 5e-3 (2.8-4.1x over three draws of the advantages). At the old 1/width
    rule's rate the same update moved it 15-28x as far (KL 0.9-1.3 against 0.05), which is how seeds 1 and 3 passed
    KL 1 at step 2."""
    tiny = one_update_kl(64, 2, scaled_lr(64, 2))
    wide = one_update_kl(512, 4, scaled_lr(512, 4))
    old = one_update_kl(512, 4, 5e-3 * 64 / 512 * 2 / 4)  # the old rule's rate: the case the new one fixes
    assert wide < 5 * tiny < old / 2, (tiny, wide, old)


def test_a_512_wide_4_layer_model_stays_near_its_reference_in_its_first_steps(tmp_path):
    """The issue's size on the CPU, at the seed whose KL passed 1 at step 2 under the 1/width rule (1.56): scaled by
    the square of the width, the KL of steps 1-4 stays below 1 (its highest of seeds 0-4 over 30 steps is in
    bench/results/trainer_stability_cpu.json) and nothing is said of divergence."""
    proc, history, config = train(tmp_path, *SIZE_512, "trainer.steps=4", "trainer.seed=3")
    kl = [m["kl"] for m in history]
    assert len(kl) == 4 and all(0 <= k < 1 for k in kl), kl
    assert "diverges" not in proc.stderr
    assert config["lr"]["lr"] == pytest.approx(5e-3 / 128) and "hidden size" in config["lr"]["from"]
    # two updates a step (64 sequences, mini-batches of 32), warming up over 10: each step's last at 2, 4, 6, 8 tenths
    assert [m["lr"] for m in history] == pytest.approx([5e-3 / 128 * k / 10 for k in (2, 4, 6, 8)])


@pytest.mark.slow
def test_a_hundred_steps_of_48_token_responses_stay_near_the_reference_and_learn(tmp_path):
    """The issue's long run: 100 steps at rollout.max_new_tokens=48 diverged at step 56 (KL 17.22) with the KL weight
    0.01; the entropy fell to 0.07."""
    proc, history, _ = train(tmp_path, "rollout.max_new_tokens=48", "trainer.steps=100")
    assert len(history) == 100
    stays_near_its_reference(history, proc)


def test_a_diverging_run_says_so_in_one_line(tmp_path):
    """The old behaviour asked for explicitly (5e-3 at 512 wide, no warm-up): the warning comes once, on one line,
    naming the step, the KL and the rate."""
    proc, history, _ = train(tmp_path, *SIZE_512, "trainer.steps=2", "actor.lr=5e-3", "actor.lr_warmup_steps=0")
    assert history[0]["kl"] > 10
    said = [line for line in proc.stderr.splitlines() if "diverges" in line]
    assert len(said) == 1, proc.stderr[-2000:]
    assert said[0].startswith("rlprof train: the run diverges at step 1: KL from the reference")
    assert "lr 0.005 (actor.lr)" in said[0] and "set a lower actor.lr" in said[0]

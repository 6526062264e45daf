"""The reference trainer at a user's size: the learning rate scales with the model's width and depth (with a warm-up),
so a bigger model trains rather than diverges; a run that diverges says so in one line."""

import json

import pytest

from conftest import run_cli

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


def test_the_rule_keeps_the_tiny_default_and_scales_inversely_with_width_and_depth():
    assert scaled_lr(64, 2) == 5e-3  # the tiny default's rate, as before the rule
    assert scaled_lr(512, 4) == pytest.approx(5e-3 / 16) and scaled_lr(1024, 8) == pytest.approx(5e-3 / 64)
    assert TrainConfig().actor_lr(512, 4)[0] == scaled_lr(512, 4)


def test_a_512_wide_4_layer_model_stays_near_its_reference_in_its_first_steps(tmp_path):
    """The issue's size on the CPU: with 5e-3 for every size its KL was 93 at step 1 and 204 at step 2; scaled, the
    KL of steps 1-3 stays below 1 and nothing is said of divergence."""
    proc, history, config = train(tmp_path, *SIZE_512, "trainer.steps=3")
    kl = [m["kl"] for m in history]
    assert len(kl) == 3 and all(0 < k < 1 for k in kl), kl
    assert "diverges" not in proc.stderr
    assert config["lr"]["lr"] == pytest.approx(5e-3 / 16) and "hidden size" in config["lr"]["from"]
    # two updates a step (64 sequences, mini-batches of 32), warming up over 10: each step's last at 2, 4, 6 tenths
    assert [m["lr"] for m in history] == pytest.approx([5e-3 / 16 * k / 10 for k in (2, 4, 6)])


def test_a_diverging_run_says_so_in_one_line(tmp_path):
    """The old behaviour asked for explicitly (5e-3 at 512 wide, no warm-up): the warning comes once, on one line,
    naming the step, the KL and the rate."""
    proc, history, _ = train(tmp_path, *SIZE_512, "trainer.steps=2", "actor.lr=5e-3", "actor.lr_warmup_steps=0")
    assert history[0]["kl"] > 10
    said = [line for line in proc.stderr.splitlines() if "diverges" in line]
    assert len(said) == 1, proc.stderr[-2000:]
    assert said[0].startswith("rlprof train: the run diverges at step 1: KL from the reference")
    assert "lr 0.005 (actor.lr)" in said[0] and "set a lower actor.lr" in said[0]

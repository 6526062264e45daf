"""The reference trainer's defaults where a user turns them: does it still train like a real run? For each run, `rlprof
train` with profiling off and nothing set but what the run names: the README's main job (30 steps), the main job at
100 steps with 48-token responses, and a 512-wide 4-layer model at seeds 0-4 (30 steps each); then the settings a user
forces (the old KL weight and rate) to show the divergence line still comes where a run diverges.

Per run: the largest KL from the reference per token and its step, the mean reward of the first and last five steps,
the entropy at the first step, its lowest and its last, the largest clip fraction, and whether `rlprof train` said
the run diverges. `stable` is what docs/trainer.md promises of the defaults: KL below 1 at every step, the last five
steps' reward above the first five's, the entropy never below half of its start, no divergence line.

    python3 bench/trainer_stability.py [--only main m48 w512_s0 ...] [--out bench/results/trainer_stability_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

W512 = [
    "model.hidden_size=512",
    "model.num_layers=4",
    "model.num_heads=8",
    "model.num_kv_heads=4",
    "model.intermediate_size=2048",
]
RUNS = {
    "main": [],
    "m48": ["rollout.max_new_tokens=48", "trainer.steps=100"],
    **{f"w512_s{seed}": [*W512, f"trainer.seed={seed}"] for seed in range(5)},
}
# Settings a user forces: the old KL weight and rate at 48 tokens (diverged at step 56 before the defaults changed)
FORCED = {"m48_forced": ["rollout.max_new_tokens=48", "trainer.steps=100", "actor.kl_coef=0.01", "actor.lr=5e-3"]}
KL_BOUND = 1.0  # nats per token from the reference
ENTROPY_FLOOR = 0.5  # of the first step's entropy


def summary(history: list[dict], stderr: str) -> dict:
    kl = [m["kl"] for m in history]
    reward = [m["reward_mean"] for m in history]
    entropy = [m["entropy"] for m in history]
    first, last = sum(reward[:5]) / 5, sum(reward[-5:]) / 5
    out = {
        "steps": len(history),
        "max_kl": max(kl),
        "max_kl_step": history[kl.index(max(kl))]["step"],
        "reward_first5": first,
        "reward_last5": last,
        "entropy_first": entropy[0],
        "entropy_min": min(entropy),
        "entropy_last": entropy[-1],
        "max_clip_frac": max(m["clip_frac"] for m in history),
        "lr": history[-1]["lr"],
        "diverges_line": next((line for line in stderr.splitlines() if "diverges" in line), None),
    }
    out["stable"] = (
        out["max_kl"] < KL_BOUND
        and last > first
        and out["entropy_min"] > ENTROPY_FLOOR * entropy[0]
        and out["diverges_line"] is None
    )
    return out


def run(name: str, overrides: list[str], work: Path) -> dict:
    out = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=work))
    args = [sys.executable, "-m", "rlprof.cli", "train", "global_profiler.tool=null", f"trainer.output_dir={out}/train"]
    started = time.perf_counter()
    proc = subprocess.run(
        [*args, *overrides],
        capture_output=True,
        text=True,
        cwd=out,
        timeout=3600,
        env=dict(os.environ, KINETO_LOG_LEVEL="5"),
    )
    if proc.returncode != 0:
        raise SystemExit(f"{name}: train failed: {proc.stderr[-2000:]}")
    (metrics,) = (out / "train").glob("*/metrics.jsonl")
    history = [json.loads(line) for line in metrics.read_text().splitlines()]
    return {"overrides": overrides, "seconds": round(time.perf_counter() - started, 1), **summary(history, proc.stderr)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--only", nargs="*", help="run names (default: all)")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    runs = {**RUNS, **FORCED}
    chosen = args.only or list(runs)
    unknown = [n for n in chosen if n not in runs]
    if unknown:
        raise SystemExit(f"unknown runs {unknown}; allowed: {', '.join(runs)}")
    with tempfile.TemporaryDirectory(prefix="rlprof-stability-") as tmp:
        results = {}
        for name in chosen:
            results[name] = run(name, runs[name], Path(tmp))
            print(json.dumps({name: results[name]}), file=sys.stderr, flush=True)
    report = {
        "defaults_stable": all(r["stable"] for n, r in results.items() if n in RUNS),
        "forced_diverges": {n: r["diverges_line"] is not None for n, r in results.items() if n in FORCED},
        "runs": results,
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()

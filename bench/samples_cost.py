"""What recording the rollout's samples costs (collect/samples.py, trainer/sample_records.py), measured two ways:

- `trainer`: the reference trainer with the watch on (a trigger that never fires: every step judged, none captured),
  its sample records on for every other step and off for the steps between, in one process, so that each "on" step
  has its "off" neighbours on the same machine at the same moment (side by side, interleaved step by step); each
  round a new process, the parity of the "on" steps swapped from round to round. Per round: the median step of the
  "on" steps and of the "off" steps (steps after the first 3), and their ratio; then the median over rounds of both,
  their ratio, and the spread of the per-round ratios. ignore_eos: every step decodes max_new_tokens, so neighbouring
  steps do the same work.
- `records_us`: the records' own work per step, timed directly: the clock kept during a 64-row generation pass and
  the scoring times (both against the same pass without them), then building the 64 records and their one write
  (median of many passes).

Prints one JSON object; the result on this machine is kept in results/samples_cost_cpu.json.

    python3 bench/samples_cost.py                     # 5 rounds x 40 steps
    python3 bench/samples_cost.py --rounds 2 --steps 8 --passes 20     # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
sys.path.insert(0, str(SRC))
R = "actor_rollout_ref.rollout.profiler"
T = "global_profiler.trigger"
TRAIN = ["rollout.max_new_tokens=12", "rollout.ignore_eos=true"]


def worker(steps: int, on_parity: int, out: Path) -> dict:
    """One trainer run, in this process: sample records on where step % 2 == on_parity, off elsewhere."""
    from rlprof.collect.watching import Watching
    from rlprof.config import load_plan
    from rlprof.trainer.config import parse_train_config
    from rlprof.trainer.train import run_training

    wanted = Watching.samples_wanted
    Watching.samples_wanted = property(
        lambda self: self._step is not None and self._step % 2 == on_parity and wanted.fget(self)
    )
    overrides = [
        "global_profiler.tool=torch",
        "global_profiler.steps=null",
        f"global_profiler.save_path={out}/p",
        f"{R}.enable=true",
        f"{T}.slow.factor=50.0",
        f"{T}.straggler.factor=50.0",
    ]
    plan = load_plan(None, overrides)
    cfg = parse_train_config({"trainer": {"steps": steps, "output_dir": str(out / "train")}, **_nested(TRAIN)})
    history, trainer = run_training(cfg, plan)
    recorded = sorted({json.loads(x)["step"] for f in (out / "p").rglob("rlprof_rank*.jsonl") for x in f.open()})
    ms = {m["step"]: m["step_ms"] for m in history}
    on = [ms[s] for s in ms if s > 3 and s % 2 == on_parity]
    off = [ms[s] for s in ms if s > 3 and s % 2 != on_parity]
    return {
        "on_ms": statistics.median(on),
        "off_ms": statistics.median(off),
        "recorded_steps": recorded,
        "on_steps": [s for s in ms if s % 2 == on_parity],
    }


def _nested(overrides: list[str]) -> dict:
    out: dict = {}
    for item in overrides:
        key, value = item.split("=", 1)
        section, name = key.split(".")
        out.setdefault(section, {})[name] = json.loads(value) if value in ("true", "false") else int(value)
    return out


def records_us(passes: int = 300) -> dict:
    """The records' own work for one 64-row pass: clock + reward timings + records + one write."""
    import torch

    from rlprof.collect.samples import SampleWriter
    from rlprof.trainer.config import TrainConfig
    from rlprof.trainer.model import build_model, build_tokenizer
    from rlprof.trainer.reward import verify
    from rlprof.trainer.rollout import generate
    from rlprof.trainer.sample_records import engine_records

    cfg = TrainConfig()
    tok = build_tokenizer(cfg.model)
    model = build_model(cfg.model, tok.vocab_size, 0).eval()
    ids = torch.randint(3, tok.vocab_size, (64, 8))
    mask = torch.ones_like(ids)
    answers = ["1"] * 64
    gen = dict(max_new_tokens=12, eos_id=tok.eos_id, pad_id=tok.pad_id, ignore_eos=True)

    def one_pass(record: bool, writer) -> float:
        clock = [] if record else None
        timings = [] if record else None
        t = time.perf_counter_ns()
        with torch.no_grad():
            out = generate(model, ids, mask, clock=clock, generator=torch.Generator().manual_seed(0), **gen)
        verify(out.response_ids, out.response_mask, answers, tok, timings=timings)
        if record:
            writer.write(
                engine_records(
                    step=1,
                    rollout_pass=0,
                    first_sample=0,
                    prompt_tokens=out.prompt_mask.sum(1).tolist(),
                    response_tokens=out.response_mask.sum(1).tolist(),
                    clock=clock,
                    reward_ns=timings,
                    rank=0,
                )
            )
        return (time.perf_counter_ns() - t) / 1e3

    with tempfile.TemporaryDirectory() as tmp:
        writer = SampleWriter(Path(tmp), "rlprof", rank=0)
        on, off = [], []
        for _ in range(passes // 10):  # warm-up
            one_pass(True, writer), one_pass(False, writer)
        for _ in range(passes):
            on.append(one_pass(True, writer))
            off.append(one_pass(False, writer))
        # the records alone: built and written from a kept pass
        clock = []
        with torch.no_grad():
            out = generate(model, ids, mask, clock=clock, **gen)
        prompt, response = out.prompt_mask.sum(1).tolist(), out.response_mask.sum(1).tolist()
        build = []
        for _ in range(passes):
            t = time.perf_counter_ns()
            writer.write(
                engine_records(
                    step=1,
                    rollout_pass=0,
                    first_sample=0,
                    prompt_tokens=prompt,
                    response_tokens=response,
                    clock=clock,
                    reward_ns=[1000] * 64,
                    rank=0,
                )
            )
            build.append((time.perf_counter_ns() - t) / 1e3)
        writer.close()
    pass_on, pass_off = statistics.median(on), statistics.median(off)
    return {
        "pass_on_us": round(pass_on, 1),
        "pass_off_us": round(pass_off, 1),
        "pass_ratio": round(pass_on / pass_off, 4),
        "build_and_write_64_us": round(statistics.median(build), 1),
        "build_share_of_pass": round(statistics.median(build) / pass_off, 4),
        "passes": passes,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--passes", type=int, default=300, help="generation passes timed for records_us")
    ap.add_argument("--worker", type=int, choices=(0, 1), help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        print(json.dumps(worker(args.steps, args.worker, Path(args.out))))
        return
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.rounds):
            out = Path(tmp) / f"round{k}"
            proc = subprocess.run(
                [sys.executable, __file__, "--worker", str(k % 2), "--out", str(out), "--steps", str(args.steps)],
                capture_output=True,
                text=True,
                env=dict(os.environ, PYTHONPATH=str(SRC), KINETO_LOG_LEVEL="5"),
                timeout=1200,
            )
            if proc.returncode:
                raise RuntimeError(proc.stderr[-2000:])
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            assert got["recorded_steps"] == got["on_steps"], got  # records on exactly the "on" steps
            rounds.append(got)
    on = statistics.median(r["on_ms"] for r in rounds)
    off = statistics.median(r["off_ms"] for r in rounds)
    ratios = [r["on_ms"] / r["off_ms"] for r in rounds]
    result = {
        "trainer": {
            "on_ms": [round(r["on_ms"], 2) for r in rounds],
            "off_ms": [round(r["off_ms"], 2) for r in rounds],
            "median_on_ms": round(on, 2),
            "median_off_ms": round(off, 2),
            "ratio": round(on / off, 4),
            "ratio_per_round": [round(x, 4) for x in ratios],
            "ratio_spread": round(max(ratios) - min(ratios), 4),
            "steps": args.steps,
            "rounds": args.rounds,
            "config": TRAIN + ["watch on (slow, straggler factors 50)"],
        },
        "records_us": records_us(args.passes),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

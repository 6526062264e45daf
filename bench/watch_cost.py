"""What catching the slow step costs (collect/watch.py, collect/trigger.py), measured in one run:

- `boundary_ns`: one `with prof.stage(...)` that nothing selected, with the watch on against off (the same
  Profiler API; median of 7 rounds of 200,000 boundaries each, inside an open step);
- `step_end_us`: one step's begin and end with the watch on (the machine-load sample, the 176-byte timeline record,
  the decision) and off, single process;
- `decision_us_2_ranks`: the per-step cross-rank decision on 2 ranks under torchrun (gloo): the all_gather of
  every rank's vector inside the step end, median per step, beside a bare all_gather of the same vector;
- `trainer`: the reference trainer's median step time (steps 4..N, from its metrics.jsonl) with everything off,
  with the watch and trigger on and nothing captured (slow and straggler factors 50: judged every step, never
  over), and with `keep: slow_only` on actor_update (a torch window every step, none kept), runs interleaved
  round by round; each median beside the off run's, and the spread of the off runs.
- `held_clock` (`--part held_clock`): the reference trainer on 2 ranks under torchrun, the watch and the slow rule on
  (factor 50) with and without the straggler rule (factor 50), which starts each rank's held-off clock
  (collect/cpu_wait.py: a thread waking every 10 ms); rank 0's median step time (steps 4..N, metrics.jsonl), runs
  interleaved round by round, and the spread of the runs without it; and, each round, side by side in one run: 2
  ranks' steps of small products, gloo all-reduces and Python with the clock on every other step (`side_by_side`:
  the medians with and without it, their ratio per round).
Prints one JSON object.

    python3 bench/watch_cost.py                   # 3 rounds x 30 steps
    python3 bench/watch_cost.py --rounds 1 --steps 12
    python3 bench/watch_cost.py --part held_clock  # results/watch_cost_held_clock_cpu.json
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
A = "actor_rollout_ref.actor.profiler"
T = "global_profiler.trigger"


def _plan(tmp: str, watch: bool):
    from rlprof.config import load_plan

    extra = [f"{T}.slow.factor=50.0", f"{T}.straggler.factor=50.0"] if watch else []
    return load_plan(
        None,
        [
            "global_profiler.tool=torch",
            "global_profiler.steps=null",
            f"global_profiler.save_path={tmp}",
            f"{A}.enable=true",
            *extra,
        ],
    )


def boundary_ns(watch: bool, n: int = 200_000, rounds: int = 7) -> float:
    from rlprof.collect import Profiler

    with tempfile.TemporaryDirectory() as tmp:
        prof = Profiler(_plan(tmp, watch), run_id="bench")
        out = []
        with prof.step(1):
            for _ in range(rounds):
                stage = prof.stage
                t = time.perf_counter_ns()
                for _ in range(n):
                    with stage("actor_update"):
                        pass
                out.append((time.perf_counter_ns() - t) / n)
        prof.close()
    return statistics.median(out)


def step_us(watch: bool, n: int = 2000) -> float:
    from rlprof.collect import Profiler

    with tempfile.TemporaryDirectory() as tmp:
        prof = Profiler(_plan(tmp, watch), run_id="bench")
        t = time.perf_counter_ns()
        for step in range(1, n + 1):
            with prof.step(step):
                pass
        per = (time.perf_counter_ns() - t) / n / 1e3
        prof.close()
    return per


def two_rank_worker() -> None:
    """Run under torchrun: the decision's all_gather per step, and a bare all_gather beside it."""
    import torch
    import torch.distributed as dist

    from rlprof.collect import Profiler
    from rlprof.collect.trigger import WIDTH

    dist.init_process_group("gloo")
    with tempfile.TemporaryDirectory() as tmp:
        prof = Profiler(_plan(tmp if dist.get_rank() == 0 else tmp, True), run_id=f"bench{dist.get_rank()}")
        steps = 300
        per_step = []
        for step in range(1, steps + 1):
            with prof.step(step):
                with prof.stage("actor_update"):
                    pass
            per_step.append(prof._exchange.last_us)
        prof.close()
    bare = []
    vec = torch.zeros(WIDTH, dtype=torch.float64)
    for _ in range(300):
        parts = [torch.empty_like(vec) for _ in range(2)]
        t = time.perf_counter_ns()
        dist.all_gather(parts, vec)
        bare.append((time.perf_counter_ns() - t) / 1e3)
    if dist.get_rank() == 0:
        print(
            json.dumps(
                {
                    "decision_us": statistics.median(per_step[10:]),
                    "bare_all_gather_us": statistics.median(bare[10:]),
                    "steps": steps,
                }
            )
        )
    dist.destroy_process_group()


def held_clock_worker(steps: int) -> None:
    """Run under torchrun: a rank's step of small products, their gradients all-reduced over gloo and some Python,
    with the held-off clock running on every other step (the parity swapped every 20 steps), so that each step with
    it has neighbours without it on the same machine at the same moment; rank 0 prints both medians."""
    import torch
    import torch.distributed as dist

    from rlprof.collect.cpu_wait import HeldOffClock

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
    x = torch.randn(64, 256)
    ms: dict = {"with": [], "without": []}
    for step in range(steps):
        on = step % 2 == (step // 20) % 2
        clock = HeldOffClock().start() if on else None
        t0 = time.perf_counter()
        for _ in range(30):
            model(x).sum().backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            sum(float(v) for v in range(300))
        took = (time.perf_counter() - t0) * 1e3
        if clock is not None:
            clock.stop()
        if step >= 4:
            ms["with" if on else "without"].append(took)
    if dist.get_rank() == 0:
        print(json.dumps({k: statistics.median(v) for k, v in ms.items()}))
    dist.destroy_process_group()


def two_ranks(*worker: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(Path(__file__).resolve()),
            *(worker or ("--worker",)),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    line = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    return json.loads(line[-1]) if line else {"error": proc.stderr[-500:]}


CONFIGS = {
    "off": [],
    "watch": [f"{T}.slow.factor=50.0", f"{T}.straggler.factor=50.0"],
    "slow_only": [
        f"{T}.slow.factor=50.0",
        f"{T}.keep=slow_only",
        f"{T}.stages=[actor_update]",
        f"{A}.tool_config.torch.discrete=true",
    ],
}


def _run_args(out: Path, steps: int, extra: list[str]) -> list[str]:
    """The trainer's overrides of one measured run, its files under `out`."""
    return [
        f"trainer.steps={steps}",
        f"trainer.output_dir={out}/train",
        "global_profiler.tool=torch",
        "global_profiler.steps=null",
        f"global_profiler.save_path={out}/p",
        f"{A}.enable=true",
        *extra,
    ]


def _median_step_ms(out: Path) -> float:
    """The run's median step (rank 0's metrics.jsonl), steps 4..N."""
    metrics = next((out / "train").glob("*/metrics.jsonl"))
    return statistics.median([json.loads(x)["step_ms"] for x in metrics.read_text().splitlines()][3:])


def trainer_step_ms(name: str, steps: int, tmp: Path) -> tuple[float, str]:
    out = tmp / f"{name}-{time.monotonic_ns()}"
    cmd = [sys.executable, "-m", "rlprof.cli", "train", *_run_args(out, steps, CONFIGS[name])]
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(SRC), KINETO_LOG_LEVEL="5"),
        timeout=900,
    )
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    printed = [x for x in proc.stdout.splitlines() if "keep: slow_only" in x]
    return _median_step_ms(out), (printed[0] if printed else "")


TWO_RANKS = {
    "no_clock": [f"{T}.slow.factor=50.0"],
    "held_clock": [f"{T}.slow.factor=50.0", f"{T}.straggler.factor=50.0"],
}


def two_rank_trainer_ms(name: str, steps: int, tmp: Path) -> float:
    out = tmp / f"{name}-{time.monotonic_ns()}"
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd = [*launch, "-m", "rlprof.trainer", *_run_args(out, steps, TWO_RANKS[name])]
    env = dict(os.environ, PYTHONPATH=str(SRC), KINETO_LOG_LEVEL="5", OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    return _median_step_ms(out)


def held_clock(rounds: int, steps: int) -> dict:
    runs: dict = {name: [] for name in TWO_RANKS}
    side_by_side = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(rounds):
            for name in TWO_RANKS:
                runs[name].append(two_rank_trainer_ms(name, steps, Path(tmp)))
            side_by_side.append(two_ranks("--held-clock-worker"))
    base = statistics.median(runs["no_clock"])
    ratios = [r["with"] / r["without"] for r in side_by_side if "with" in r]
    return {
        "side_by_side": {
            "per_round_ms": [{k: round(v, 2) for k, v in r.items()} if "with" in r else r for r in side_by_side],
            "per_round_ratio": [round(x, 3) for x in ratios],
            "median_ratio": round(statistics.median(ratios), 3) if ratios else None,
        },
        "step_ms": {k: [round(x, 2) for x in v] for k, v in runs.items()},
        "median_ms": {k: round(statistics.median(v), 2) for k, v in runs.items()},
        "ratio": round(statistics.median(runs["held_clock"]) / base, 3),
        "no_clock_spread": round((max(runs["no_clock"]) - min(runs["no_clock"])) / base, 3),
        "steps": steps,
        "rounds": rounds,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--part", choices=("all", "held_clock"), default="all")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--held-clock-worker", action="store_true")
    args = ap.parse_args()
    if args.worker:
        return two_rank_worker()
    if args.held_clock_worker:
        return held_clock_worker(60)
    if args.part == "held_clock":
        print(json.dumps({"held_clock": held_clock(args.rounds, args.steps)}))
        return
    result = {
        "boundary_ns": {"off": boundary_ns(False), "watch": boundary_ns(True)},
        "step_end_us": {"off": step_us(False), "watch": step_us(True)},
        "decision_us_2_ranks": two_ranks(),
    }
    runs = {name: [] for name in CONFIGS}
    said = ""
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for name in CONFIGS:
                ms, line = trainer_step_ms(name, args.steps, Path(tmp))
                runs[name].append(ms)
                said = line or said
    off = statistics.median(runs["off"])
    result["trainer"] = {
        "step_ms": {k: [round(x, 2) for x in v] for k, v in runs.items()},
        "median_ms": {k: round(statistics.median(v), 2) for k, v in runs.items()},
        "ratio_to_off": {k: round(statistics.median(v) / off, 3) for k, v in runs.items()},
        "off_spread": round((max(runs["off"]) - min(runs["off"])) / off, 3),
        "slow_only_said": said,
        "steps": args.steps,
        "rounds": args.rounds,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""What rlprof's per-step measures cost in the trackers (analyze/over_time/step_measures.py; docs/trackers.md), against
the step they describe. Prints one JSON object.

- `trainer`: the reference trainer, watched, `trainer.logger=[tensorboard]`, in this process: per step, the time of
  rank 0's whole tracker call (`StepLog.log`: the run directory's new records read, the measures computed, the step's
  GRPO metrics and rlprof's measures written to TensorBoard) and of its rlprof part alone (the read and the
  measures), each as a share of the step (its `step_ms`), median over the steps after the first;
- `main_ppo`: a run directory main_ppo's driver wrote (bench/verl_job.py, watched, `trainer.logger=[console,
  tensorboard]`) replayed as it grew: its timeline records and sample lines appended step by step to a fresh copy,
  and after each step the driver's own call (`integrations/verl/step_log.py` StepLog.add: the new records read,
  the measures computed, added to the step's metrics dict) timed, then verl's own tensorboard logger
  (`verl.utils.tracking._TensorboardAdapter`, torch's SummaryWriter) and console line (`LocalLogger`) given those
  measures, timed; against the job's own step time (`timing_s/step` in verl's console log). Run it with the verl
  job's venv: `bench/.venv-verljob/bin/python bench/tracker_cost.py --main-ppo WORKDIR` (a WORKDIR bench/verl_job.py
  ran in, its main_ppo.log and its profile/<run id>).

    python3 bench/tracker_cost.py --steps 30                       (needs rlprof[tracking])
    bench/.venv-verljob/bin/python bench/tracker_cost.py --main-ppo WORKDIR --skip-trainer
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
A = "actor_rollout_ref.actor.profiler"


def trainer(steps: int) -> dict:
    from rlprof.analyze.over_time import step_measures
    from rlprof.config import load_config, resolve_plan, with_default_profile
    from rlprof.trainer import step_log
    from rlprof.trainer.config import parse_train_config
    from rlprof.trainer.train import run_training

    spent: dict[str, list[float]] = {"log": [], "read": []}

    def timed(fn, key):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[key].append(time.perf_counter() - t0)

        return wrapper

    step_log.StepLog.log = timed(step_log.StepLog.log, "log")
    reads = []
    read, measures = step_measures.RunReader.read, step_measures.RunReader.measures
    step_measures.RunReader.read = lambda self: reads.append(_clock(read, self))
    step_measures.RunReader.measures = lambda self, *a: _timed_value(measures, reads, self, *a)
    with tempfile.TemporaryDirectory() as work:
        data = load_config(
            None,
            [
                f"trainer.steps={steps}",
                "trainer.logger=[tensorboard]",
                f"trainer.output_dir={work}/train",
                "global_profiler.tool=torch",
                f"global_profiler.save_path={work}/p",
                f"{A}.enable=true",
                "+global_profiler.trigger.slow.factor=50.0",
            ],
        )
        cfg = parse_train_config(data)
        history, _ = run_training(cfg, resolve_plan(with_default_profile(data)), metrics_dir=Path(work) / "train")
    # per step: the reader's read and measures (two entries per step, in order), the whole call
    rlprof_s = [reads[i] + reads[i + 1] for i in range(0, len(reads), 2)]
    step_s = [m["step_ms"] / 1e3 for m in history]
    kept = range(1, len(history))
    return {
        "steps": len(history),
        "median_step_s": statistics.median(step_s[i] for i in kept),
        "median_tracker_call_ms": statistics.median(spent["log"][i] * 1e3 for i in kept),
        "median_rlprof_measures_ms": statistics.median(rlprof_s[i] * 1e3 for i in kept),
        "median_share_of_step_tracker_call": statistics.median(spent["log"][i] / step_s[i] for i in kept),
        "median_share_of_step_rlprof_measures": statistics.median(rlprof_s[i] / step_s[i] for i in kept),
        "max_share_of_step_tracker_call": max(spent["log"][i] / step_s[i] for i in kept),
    }


def _clock(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def _timed_value(fn, sink: list, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    sink.append(time.perf_counter() - t0)
    return out


def main_ppo(workdir: Path) -> dict:
    """The driver's per-step work replayed on the run directory main_ppo wrote, as it grew."""
    import numpy as np
    from verl.utils.logger import LocalLogger
    from verl.utils.tracking import _TensorboardAdapter

    from rlprof.analyze.inputs.samples_file import sample_files
    from rlprof.analyze.inputs.timeline_file import DTYPE, TIMELINE_DIR, timeline_ranks
    from rlprof.integrations.verl.step_log import StepLog

    (run_dir,) = [p.parent for p in (workdir / "profile").glob("*/rlprof_live.json")]
    log_text = (workdir / "main_ppo.log").read_text(errors="replace")
    step_s = {
        int(m.group(1)): float(m.group(2))
        for m in re.finditer(r"step:(\d+) - .*? - timing_s/step:([-0-9.e]+)", log_text)
    }
    (rank0,) = [p for r, p in timeline_ranks(run_dir) if r == 0]
    records = np.fromfile(rank0, dtype=DTYPE)
    lines = [(p.relative_to(run_dir), p.read_bytes().splitlines(keepends=True)) for p in sample_files(run_dir)]
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "run"
        (copy / TIMELINE_DIR).mkdir(parents=True)
        (copy / TIMELINE_DIR / "columns.json").write_bytes((run_dir / TIMELINE_DIR / "columns.json").read_bytes())
        log = StepLog(copy)
        os.environ["TENSORBOARD_DIR"] = str(Path(tmp) / "tb")  # verl's variable: its logger writes here
        board = _TensorboardAdapter("bench", "bench")
        console = LocalLogger(print_to_console=True)
        for rec in records:
            n = int(rec["step"])
            with open(copy / TIMELINE_DIR / "rank0.bin", "ab") as f:
                f.write(rec.tobytes())
            for rel, rows in lines:
                (copy / rel).parent.mkdir(parents=True, exist_ok=True)
                with open(copy / rel, "ab") as f:
                    f.writelines(r for r in rows if json.loads(r).get("step") == n)
            metrics: dict = {}
            t0 = time.perf_counter()
            log.add(None, metrics, n, [])
            driver_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            board.log(metrics, n)
            board_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                console.log(metrics, n)
            console_s = time.perf_counter() - t0
            total = driver_s + board_s + console_s
            out.append(
                {
                    "step": n,
                    "keys": len(metrics),
                    "driver_ms": driver_s * 1e3,
                    "verl_tensorboard_ms": board_s * 1e3,
                    "verl_console_ms": console_s * 1e3,
                    "step_s": step_s.get(n),
                    "share_of_step": total / step_s[n] if step_s.get(n) else None,
                }
            )
        board.finish()
    shares = [s["share_of_step"] for s in out if s["share_of_step"] is not None]
    return {
        "run_dir_steps": len(out),
        "per_step": out,
        "median_share_of_step": statistics.median(shares),
        "max_share_of_step": max(shares),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--main-ppo", type=Path, help="a WORKDIR bench/verl_job.py ran a watched job in")
    parser.add_argument("--skip-trainer", action="store_true")
    args = parser.parse_args()
    out = {}
    if not args.skip_trainer:
        out["trainer"] = trainer(args.steps)
    if args.main_ppo:
        out["main_ppo"] = main_ppo(args.main_ppo)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

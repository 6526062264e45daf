"""Does installing rlprof on TRL's GRPOTrainer cost time when profiling is off (steps null)?

The same run (examples/trl_grpo.py: tiny Qwen2, same seed, same data) trains with and without
`rlprof.integrations.trl.profile(trainer, ...)` installed, alternating, in fresh processes; the
per-step time is TRL's own `step_time` metric (first step dropped as warm-up). Prints one JSON object:
medians per variant, their difference, and the run-to-run noise of the baseline for scale.

    python3 bench/trl_overhead.py            # 3 pairs x 20 steps
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import json, sys
sys.argv = ["trl_grpo"] + sys.argv[1:]
sys.path.insert(0, {examples!r})
import trl_grpo
trainer_holder = {{}}
orig = trl_grpo.build_trainer
def keep(*a, **k):
    trainer_holder["t"] = orig(*a, **k)
    return trainer_holder["t"]
trl_grpo.build_trainer = keep
trl_grpo.main()
times = [h["step_time"] for h in trainer_holder["t"].state.log_history if "step_time" in h]
print("STEP_TIMES " + json.dumps(times))
"""


def one_run(workdir: Path, steps: int, installed: bool) -> list[float]:
    args = [
        str(ROOT / "examples" / "configs" / "trl.yaml"),
        "global_profiler.steps=null",
        f"global_profiler.save_path={workdir}/p",
        "--steps",
        str(steps),
        "--workdir",
        str(workdir),
    ]
    if not installed:
        args.append("--no-profile")
    code = CHILD.format(examples=str(ROOT / "examples"))
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env={"KINETO_LOG_LEVEL": "5", "OMP_NUM_THREADS": "1", **__import__("os").environ},
    )
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    line = next(x for x in proc.stdout.splitlines() if x.startswith("STEP_TIMES "))
    return json.loads(line.split(" ", 1)[1])[1:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--pairs", type=int, default=3)
    args = ap.parse_args()
    with_times, without_times, run_medians = [], [], []
    with tempfile.TemporaryDirectory(prefix="rlprof-trl-") as tmp:
        for i in range(args.pairs):
            for installed in (False, True) if i % 2 == 0 else (True, False):
                times = one_run(Path(tmp), args.steps, installed)
                (with_times if installed else without_times).extend(times)
                if not installed:
                    run_medians.append(statistics.median(times))
    base, inst = statistics.median(without_times), statistics.median(with_times)
    print(
        json.dumps(
            {
                "steps_per_run": args.steps,
                "pairs": args.pairs,
                "without_ms_per_step": round(base * 1e3, 2),
                "with_ms_per_step": round(inst * 1e3, 2),
                "diff_ms_per_step": round((inst - base) * 1e3, 3),
                "diff_pct": round(100 * (inst - base) / base, 2),
                "baseline_run_to_run_spread_ms": round((max(run_medians) - min(run_medians)) * 1e3, 3),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The reference trainer on a busy machine, side by side in one run: its steady step time with the machine as it
is, and with `--hogs` busy loops (plain `while True: pass` processes) holding cores, with the trainer's own thread
choice (`trainer.threads: null`: the free cores of its affinity, sampled at start) and with torch's default of one
thread per core (`trainer.threads=<cores>`, what the trainer did before).

Each run is `rlprof train` with profiling off, `--steps` steps; its steady step time is the median `step_ms` of
the steps after the first two (compilation and warm-up). The configurations run interleaved, `--pairs` rounds, so
that the machine's drift falls on all of them. Prints one JSON object (and writes it with --out).

    python3 bench/busy.py [--pairs 3] [--steps 12] [--hogs 1] [--out bench/results/busy_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

OFF = ["global_profiler.tool=torch", "global_profiler.steps=[]"]  # a plan that collects nothing (said in one line)


def run(steps: int, threads: int | None, work: Path) -> dict:
    out = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    args = [
        sys.executable,
        "-m",
        "rlprof.cli",
        "train",
        *OFF,
        f"trainer.steps={steps}",
        f"trainer.output_dir={out}/train",
    ]
    if threads is not None:
        args.append(f"trainer.threads={threads}")
    proc = subprocess.run(
        args, capture_output=True, text=True, cwd=out, timeout=1800, env=dict(os.environ, KINETO_LOG_LEVEL="5")
    )
    if proc.returncode != 0:
        raise SystemExit(f"train failed: {proc.stderr[-2000:]}")
    (metrics,) = (out / "train").glob("*/metrics.jsonl")
    history = [json.loads(line) for line in metrics.read_text().splitlines()]
    chosen = json.loads((metrics.parent / "trainer_config.json").read_text())["threads"]
    steady = [m["step_ms"] for m in history[2:]]
    waits = [m["run_wait_ms"] / (m["cpu_ms"] + m["run_wait_ms"]) for m in history[2:] if m.get("cpu_ms")]
    return {
        "steady_step_ms": statistics.median(steady),
        "threads": chosen["threads"],
        "why": chosen["why"],
        "run_wait_share": statistics.median(waits) if waits else None,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--hogs", type=int, default=1)
    p.add_argument("--out")
    args = p.parse_args()
    cores = len(os.sched_getaffinity(0))
    work = Path(tempfile.mkdtemp(prefix="rlprof-busy-"))
    configs = {
        "as_is/auto": (0, None),
        f"{args.hogs}_busy/auto": (args.hogs, None),
        "as_is/one_per_core": (0, cores),
        f"{args.hogs}_busy/one_per_core": (args.hogs, cores),
    }
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    for _ in range(args.pairs):
        for name, (hogs, threads) in configs.items():
            loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs)]
            try:
                runs[name].append(run(args.steps, threads, work))
            finally:
                for h in loops:
                    h.kill()
                    h.wait()
    med = {name: statistics.median(r["steady_step_ms"] for r in rs) for name, rs in runs.items()}
    out = {
        "machine": f"{cores} cores in affinity; load at the end {os.getloadavg()}",
        "hogs": args.hogs,
        "steps": args.steps,
        "pairs": args.pairs,
        "steady_step_ms": med,
        "busy_over_as_is": {
            "auto": med[f"{args.hogs}_busy/auto"] / med["as_is/auto"],
            "one_per_core": med[f"{args.hogs}_busy/one_per_core"] / med["as_is/one_per_core"],
        },
        "runs": runs,
    }
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()

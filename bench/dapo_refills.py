"""DAPO's dynamic sampling, its lever checked by applying it (bench/levers.py's way): the reference trainer with
`trainer.algorithm=dapo` and 32-token responses, its steps 2 and 3 profiled (their samples recorded, each with its
generation pass and whether the filter dropped its group); `rlprof analyze` finds the refill passes' share of the
rollout (`dynamic_sampling`) and predicts what its first lever saves; `rlprof advise RUN --fix --cause
dynamic_sampling` writes that lever (`dapo.max_sampling_retries=0`); the trainer runs again with it. Before and after
runs interleaved, pooled medians of the steady unprofiled steps (step time less the training thread's run-queue wait,
and the rollout stage), as bench/levers.py measures them; the prediction held against the measured saving, and the
refill share before and after. The lever changes the experiment (the batch keeps the first pass's informative
groups, filtered ones filling it): the informative groups per step are kept beside.

    python3 bench/dapo_refills.py [--pairs 3] [--steps 12] [--out bench/results/dapo_refills_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import levers  # noqa: E402

CAUSE = "dynamic_sampling"
BASE = ("trainer.algorithm=dapo", "rollout.max_new_tokens=32", "actor.micro_batch_size=32")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    from rlprof.analyze.pipeline import analyze

    with tempfile.TemporaryDirectory(prefix="rlprof-dapo-") as tmp:
        work = Path(tmp)
        before, after, fix, predicted, measures = [], [], None, None, {}
        for k in range(args.pairs):
            run = levers.train(f"before{k}", work, 1, list(BASE), steps=args.steps)
            before.append(run)
            doc = analyze(run["run_dir"], workers=1)
            measures.setdefault("before", []).append(levers.cause_measure(doc, CAUSE, ["rollout_generate"]))
            if fix is None:
                found = [f for f in doc["findings"] if f["kind"] == CAUSE]
                if not found:
                    raise SystemExit(f"{CAUSE} not found in the first run: {[f['kind'] for f in doc['findings']]}")
                predicted = found[0]
                fix = levers.advise_fix(run["run_dir"], CAUSE, work / "fix.yaml")
                if not fix["written"]:
                    raise SystemExit(f"advise --fix wrote nothing: {fix['stdout']}")
            run = levers.train(f"after{k}", work, 1, list(BASE), config=work / "fix.yaml", steps=args.steps)
            after.append(run)
            doc = analyze(run["run_dir"], workers=1)
            measures.setdefault("after", []).append(levers.cause_measure(doc, CAUSE, ["rollout_generate"]))
        times = {
            side: [levers.step_times(r["metrics"]) for r in runs]
            for side, runs in (("before", before), ("after", after))
        }
        pooled = {
            side: {
                "quiet_ms": statistics.median(t for r in runs for t in _quiet(r)),
                "rollout_ms": statistics.median(
                    m["stage_ms"].get("rollout_generate", 0.0) for r in runs for m in _steady(r["metrics"])
                ),
                "informative_groups": statistics.median(
                    m.get("informative_groups", 0) for r in runs for m in _steady(r["metrics"])
                ),
            }
            for side, runs in (("before", before), ("after", after))
        }
        saving = predicted["saving"]
        measured = pooled["before"]["quiet_ms"] - pooled["after"]["quiet_ms"]
        report = {
            "cause": CAUSE,
            "finding": predicted["text"],
            "fix": fix.get("fix"),
            "predicted_saving_ms": saving.get("saving_ms"),
            "predicted_rollout_saving_ms": (saving.get("by_stage_ms") or {}).get("rollout_generate"),
            "measured_saving_ms": measured,
            "measured_rollout_saving_ms": pooled["before"]["rollout_ms"] - pooled["after"]["rollout_ms"],
            "within": abs(measured - saving["saving_ms"]) <= levers.CRITERION * saving["saving_ms"]
            if saving.get("saving_ms")
            else None,
            "pooled": pooled,
            "per_run": times,
            "refill_share": {side: [m["value"] for m in ms] for side, ms in measures.items()},
        }
    text = json.dumps(report, indent=1, default=str)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


def _steady(metrics: list[dict]) -> list[dict]:
    return [m for m in metrics if m["step"] > max(levers.PROFILED) and not m.get("profiled")]


def _quiet(run: dict) -> list[float]:
    return [m["step_ms"] - levers._wait(m) for m in _steady(run["metrics"])]


if __name__ == "__main__":
    main()

"""How much smaller selective collection makes a trace: the actor_update stage of one step, collected
whole, as its first micro-batch only, and as markers. One JSON object, measured in one run."""

from __future__ import annotations

import gzip
import json
import os
import sys
import tempfile
from pathlib import Path

A = "actor_rollout_ref.actor.profiler"
COMMON = [
    "trainer.steps=2",
    "global_profiler.steps=[2]",
    f"{A}.enable=true",
    f"{A}.stages=[actor_update]",
    "actor_rollout_ref.rollout.profiler.enable=false",
    "actor_rollout_ref.ref.profiler.enable=false",
    "actor.mini_batch_size=32",
    "actor.micro_batch_size=4",
]  # 64 sequences: 2 mini-batches x 8 micro


def collect(tmp: Path, name: str, overrides: list[str]) -> tuple[int, int]:
    from rlprof.trainer.launch import main as train

    save = tmp / name
    train(
        None, COMMON + [f"global_profiler.save_path={save}", f"trainer.output_dir={tmp}/train"] + overrides, quiet=True
    )
    (run,) = [p for p in save.iterdir() if p.is_dir()]
    (path,) = list(run.glob("step2_actor_actor_update_rank0*.json.gz"))
    with gzip.open(path, "rt") as f:
        events = sum(1 for e in json.load(f)["traceEvents"] if e.get("ph") != "M")
    return path.stat().st_size, events


def main() -> int:
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    with tempfile.TemporaryDirectory(prefix="rlprof-volume-") as tmp:
        tmp = Path(tmp)
        torch_discrete = ["global_profiler.tool=torch", f"{A}.tool_config.torch.discrete=true"]
        full = collect(tmp, "full", torch_discrete)
        micro = collect(
            tmp, "micro", torch_discrete + [f"{A}.tool_config.torch.schedule={{unit: micro_batch, active: 1}}"]
        )
        markers = collect(tmp, "markers", ["global_profiler.tool=markers", f"{A}.tool_config.markers.discrete=true"])
    out = {
        "micro_batches_per_update": 8,
        "full_stage_bytes": full[0],
        "micro_batch_bytes": micro[0],
        "markers_bytes": markers[0],
        "full_stage_events": full[1],
        "micro_batch_events": micro[1],
        "markers_events": markers[1],
        "ratio": round(full[0] / micro[0], 2),
        "events_ratio": round(full[1] / micro[1], 2),
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

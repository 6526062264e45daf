"""torchrun with 2 CPU processes (gloo): rank selection and one shared save_path."""

import os
import subprocess
import sys

import pytest

from helpers import A, load_trace, rows

pytestmark = pytest.mark.slow


def torchrun(tmp_path, *overrides, run_id=None):
    env = dict(os.environ, RLPROF_DEMO_STEPS="2", KINETO_LOG_LEVEL="5", OMP_NUM_THREADS="1")
    env.pop("RLPROF_RUN_ID", None)
    if run_id:
        env["RLPROF_RUN_ID"] = run_id
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "rlprof.demo",
        "global_profiler.tool=torch",
        "global_profiler.steps=[2]",
        f"global_profiler.save_path={tmp_path}",
        f"{A}.enable=true",
        *overrides,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs  # every rank agreed on one run directory
    return runs[0]


def test_only_listed_rank_writes(tmp_path):
    d = torchrun(tmp_path, f"{A}.ranks=[1]")
    listed = rows(d)
    assert [(r["rank"], r["world_size"], r["step"]) for r in listed] == [(1, 2, 2)]
    assert sorted(p.name for p in d.glob("*.json.gz")) == ["step2_actor_e2e_rank1.pt.trace.json.gz"]


def test_all_ranks_share_one_save_path_without_collision(tmp_path):
    d = torchrun(tmp_path, f"{A}.all_ranks=true", f"{A}.tool_config.torch.discrete=true", f"{A}.stages=[actor_update]")
    listed = rows(d)
    assert sorted((r["rank"], r["role"], r["stage"]) for r in listed if r["role"] == "actor") == [
        (0, "actor", "actor_update"),
        (1, "actor", "actor_update"),
    ]
    assert len({r["path"] for r in listed}) == len(listed)  # no two rows share a file
    assert sorted(p.name for p in d.glob("*.json.gz")) == sorted(r["path"] for r in listed)
    assert len({r["run_id"] for r in listed}) == 1
    for r in listed:
        trace = load_trace(d / r["path"])
        assert trace["rlprof"]["rank"] == r["rank"] and trace["rlprof"]["world_size"] == 2
        if r["stage"] == "actor_update":  # gradients are all-reduced over gloo inside the update
            assert any("all_reduce" in e.get("name", "") for e in trace["traceEvents"])
    # the analysis gives one row per (step, role, stage, rank) and counts gloo as communication
    proc = subprocess.run(
        [sys.executable, "-m", "rlprof.cli", "analyze", str(d), "--json"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    import json

    doc = json.loads(proc.stdout)
    stage_rows = [r for r in doc["rows"] if r["unit"] is None]
    assert sorted((r["step"], r["role"], r["stage"], r["rank"]) for r in stage_rows) == sorted(
        (2, r["role"], r["stage"], r["rank"]) for r in listed
    )
    update_rows = [r for r in stage_rows if r["stage"] == "actor_update"]
    assert len(update_rows) == 2 and all(r["comm_ms"] + r["overlap_ms"] > 0 for r in update_rows)
    assert {c["name"] for c in doc["collectives"]} & {"gloo:all_reduce", "c10d::allreduce_"}
    update_micro = [r for r in doc["rows"] if r["unit"] == "micro_batch" and r["stage"] == "actor_update"]
    assert len(update_micro) == 2 * 8  # 8 micro-batches per update, per rank


def test_run_id_from_environment(tmp_path):
    d = torchrun(tmp_path, f"{A}.all_ranks=true", run_id="job-42")
    assert d.name == "job-42"
    assert sorted(r["rank"] for r in rows(d)) == [0, 1]

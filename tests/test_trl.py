"""rlprof on TRL's GRPOTrainer (examples/trl_grpo.py): discrete, e2e, micro-batch schedule, version pin."""

import json
import subprocess
import sys

import pytest

from conftest import ROOT, run_cli
from helpers import load_trace, names, rows, unit_args

pytest.importorskip("trl")
pytestmark = pytest.mark.slow
EXAMPLE = ROOT / "examples" / "trl_grpo.py"
CONFIG = ROOT / "examples" / "configs" / "trl.yaml"
A = "actor_rollout_ref.actor.profiler"
TRL_STAGES = {"rollout_generate", "reward_compute", "ref_compute_log_prob", "actor_update"}


def run_example(tmp_path, *overrides, grad_accum=4):
    tmp_path.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        str(EXAMPLE),
        str(CONFIG),
        f"global_profiler.save_path={tmp_path}/p",
        *overrides,
        "--workdir",
        str(tmp_path / "w"),
        "--grad-accum",
        str(grad_accum),
    ]
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
        env={**__import__("os").environ, "KINETO_LOG_LEVEL": "5"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trl GRPO: 3 steps" in proc.stdout
    (run_dir,) = list((tmp_path / "p").iterdir())
    return run_dir


def test_discrete_windows_per_stage_of_step_2_and_analysis(tmp_path):
    d = run_example(tmp_path)
    manifest = rows(d)
    assert {r["step"] for r in manifest} == {2}
    assert sorted(r["stage"] for r in manifest) == sorted(TRL_STAGES)  # one window each
    assert all(r["mode"] == "discrete" and r["status"] == "complete" and r["rank"] == 0 for r in manifest)
    by_stage = {r["stage"]: r["role"] for r in manifest}
    assert by_stage == {
        "rollout_generate": "rollout",
        "reward_compute": "reward",
        "ref_compute_log_prob": "ref",
        "actor_update": "actor",
    }
    proc = run_cli("analyze", d, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    stage_rows = {(r["step"], r["role"], r["stage"]) for r in doc["rows"] if r["unit"] is None}
    assert stage_rows == {(2, role, stage) for stage, role in by_stage.items()}
    micro = [r for r in doc["rows"] if r["unit"] == "micro_batch"]
    assert sorted(r["index"] for r in micro) == [0, 1, 2, 3]  # gradient accumulation 4


def test_e2e_one_window_with_stage_ranges(tmp_path):
    d = run_example(
        tmp_path, f"{A}.tool_config.torch.discrete=false", "reward_model.profiler.tool_config.torch.discrete=false"
    )
    (row,) = rows(d)
    assert (row["step"], row["stage"], row["mode"]) == (2, "e2e", "e2e")
    trace = load_trace(d / row["path"])
    stages = [e["name"].split(":")[-1] for e in trace["traceEvents"] if e.get("name", "").startswith("rlprof:stage:")]
    assert set(stages) == TRL_STAGES
    assert trace["rlprof"]["step"] == 2


def _count(trace, name):
    return sum(1 for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("name") == name)


def test_micro_batch_schedule_holds_one_of_four(tmp_path):
    one = run_example(
        tmp_path / "one",
        f"{A}.stages=[actor_update]",
        f"{A}.tool_config.torch.schedule={{unit: micro_batch, active: 1}}",
    )
    full = run_example(tmp_path / "full", f"{A}.stages=[actor_update]")
    [t_one] = [load_trace(one / r["path"]) for r in rows(one) if r["stage"] == "actor_update"]
    [t_full] = [load_trace(full / r["path"]) for r in rows(full) if r["stage"] == "actor_update"]
    assert names(t_one, "rlprof:micro_batch:") == ["rlprof:micro_batch:0"]
    # the micro-batch says what it holds, read from GRPO's prompt and completion masks
    (held,) = unit_args(t_one, "rlprof:micro_batch:")
    assert (
        set(held) == {"seqs", "tokens", "real_tokens", "query_key_pairs"} and 0 < held["real_tokens"] <= held["tokens"]
    )
    # each row's length squared, summed: at least what rows of equal length would make, at most the padded width's
    assert held["real_tokens"] ** 2 / held["seqs"] <= held["query_key_pairs"] <= held["tokens"] ** 2 / held["seqs"]
    assert held["tokens"] % held["seqs"] == 0
    assert _count(t_full, "aten::embedding") == 4 * _count(t_one, "aten::embedding") > 0  # one forward of four


def test_profiling_off_installs_and_collects_nothing(tmp_path):
    cmd = [
        sys.executable,
        str(EXAMPLE),
        str(CONFIG),
        f"global_profiler.save_path={tmp_path}/p",
        "global_profiler.steps=null",
        "--workdir",
        str(tmp_path / "w"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (tmp_path / "p").exists()


def test_unsupported_trl_version_is_one_clear_line():
    from rlprof.integrations.trl import IntegrationError, check_version

    assert check_version("1.16.0") == "1.16.0"
    for bad in ("0.29.1", "1.15.0", "2.0.0"):
        with pytest.raises(IntegrationError) as err:
            check_version(bad)
        msg = str(err.value)
        assert "\n" not in msg and f"trl {bad} is not supported" in msg and "allowed: trl 1.16.x" in msg


def test_under_torchrun_ranks_come_from_the_process_index(tmp_path):
    import os

    env = dict(os.environ, KINETO_LOG_LEVEL="5", OMP_NUM_THREADS="1")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(EXAMPLE),
        str(CONFIG),
        f"global_profiler.save_path={tmp_path}/p",
        f"{A}.ranks=[1]",
        f"{A}.all_ranks=false",
        "--workdir",
        str(tmp_path / "w"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (d,) = list((tmp_path / "p").iterdir())  # one run directory: the ranks share torchrun's run id
    got = {(r["role"], r["rank"], r["world_size"]) for r in rows(d)}
    # the actor collects on rank 1 only; reward (all_ranks in the file) on both; rollout/ref follow the actor
    assert ("actor", 1, 2) in got and ("actor", 0, 2) not in got
    assert {("reward", 0, 2), ("reward", 1, 2)} <= got
    assert ("rollout", 0, 2) not in got and ("rollout", 1, 2) in got

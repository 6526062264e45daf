"""rlprof's per-step measures in the experiment trackers users watch: `rlprof train trainer.logger=[...]` (verl's key)
and `rlprof export RUN --to ...`, read back with each tracker's own reader (tests/tracker_readers.py), against what
the run directory holds (every rank's timeline records, the sample records, the manifest's trigger rows) read here
with the files' own readers. verl's main_ppo is tests/test_verl_job.py's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, run_cli
from tracker_readers import mlflow_scalars, tensorboard_scalars, tensorboard_text, wandb_scalars

from rlprof.analyze.inputs.samples_file import read_samples
from rlprof.analyze.inputs.timeline_file import JUDGED, WARMUP, read_rank, stage_names, timeline_ranks
from rlprof.analyze.over_time.step_measures import KEYS, key_pattern

RECORDED = ROOT / "tests/data/samples/long_sample"  # rlprof's trainer, watched (tests/data/samples/SOURCES.md)

A = "actor_rollout_ref.actor.profiler"
STEPS = 4
TRAIN = [
    f"trainer.steps={STEPS}",
    "global_profiler.tool=torch",
    f"{A}.enable=true",
    "data.prompts_per_step=4",
    "rollout.n=2",
    "actor.mini_batch_size=2",
    "actor.micro_batch_size=2",
    "rollout.max_new_tokens=4",
    "+global_profiler.trigger.slow.factor=2.0",
    "+global_profiler.trigger.warmup_steps=1",
    "+global_profiler.trigger.baseline=true",  # a capture at step 2 whatever the timing: its cause is logged
]
ENV = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "KINETO_LOG_LEVEL": "5", "OMP_NUM_THREADS": "1"}


def close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))  # TensorBoard keeps float32


@pytest.fixture(scope="module")
def two_ranks(trackers, tmp_path_factory):
    """rlprof's trainer on two ranks (torchrun), watched, logging to all four trackers."""
    work = tmp_path_factory.mktemp("trackers")
    env = {k: v for k, v in os.environ.items() if k not in ("TENSORBOARD_DIR", "MLFLOW_TRACKING_URI")} | ENV
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "rlprof.trainer"]
        + TRAIN
        + [
            f"trainer.output_dir={work}/train",
            f"global_profiler.save_path={work}/p",
            "trainer.logger=[console,tensorboard,wandb,mlflow]",
            "trainer.project_name=trackers",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=work,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = [p for p in (work / "p").iterdir() if p.is_dir()]
    return proc, work, run_dir


def from_run_dir(run_dir: Path) -> dict[int, dict[str, float]]:
    """What the tracker must hold, from the run directory's files: each step's slowest rank per stage and the spread,
    its samples' count and spread of times and lengths, the trigger's verdict, the capture's reason."""
    recs = {rank: read_rank(path) for rank, path in timeline_ranks(run_dir)}
    names = ["step", *stage_names(run_dir)]
    out: dict[int, dict[str, float]] = defaultdict(dict)
    for step in sorted({int(s) for r in recs.values() for s in r["step"]}):
        rows = {rank: r[r["step"] == step][0] for rank, r in recs.items()}
        table = np.array([[row["step_s"], *row["stage_s"]] for row in rows.values()], dtype=float)
        for j, name in enumerate(names):
            col = table[:, j]
            if np.isnan(col).all():
                continue
            out[step][f"rlprof/time/{name}/max_s"] = np.nanmax(col)
            out[step][f"rlprof/time/{name}/spread"] = np.nanmax(col) / np.nanmedian(col)
            out[step][f"rlprof/time/{name}/slowest_rank"] = list(rows)[int(np.nanargmax(col))]
        flags = int(np.bitwise_or.reduce([int(row["flags"]) for row in rows.values()]))
        out[step]["rlprof/trigger/judged"] = float(bool(flags & JUDGED))
        if flags & WARMUP:
            out[step]["rlprof/trigger/not_judged/warmup"] = 1.0
    by_step = defaultdict(list)
    for r in read_samples(run_dir):
        by_step[r["step"]].append(r)
    for step, rows in by_step.items():
        ms = [(r["end_us"] - r["start_us"]) / 1e3 for r in rows]
        out[step]["rlprof/rollout/samples"] = float(len(rows))
        out[step]["rlprof/rollout/sample_ms/p90"] = float(np.percentile(ms, 90))
        out[step]["rlprof/rollout/sample_ms/max"] = max(ms)
        out[step]["rlprof/rollout/response_tokens/max"] = float(max(r["response_tokens"] for r in rows))
    for line in (run_dir / "manifest.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("trigger"):
            out[row["step"]][f"rlprof/capture/{row['trigger']['reason']}"] = 1.0
            out[row["step"]]["rlprof/capture/seen_step"] = float(row["trigger"]["step"])
    return out


def rlprof_only(scalars: dict) -> dict:
    return {k: v for k, v in scalars.items() if k.startswith("rlprof/")}


def assert_holds(scalars: dict[str, dict[int, float]], expected: dict[int, dict[str, float]]) -> None:
    for step, values in expected.items():
        for key, value in values.items():
            assert key in scalars and step in scalars[key], (key, step)
            assert close(scalars[key][step], value), (key, step, scalars[key][step], value)


def test_trainer_logs_every_steps_measures_to_tensorboard_equal_to_the_run_directory(two_ranks):
    proc, work, run_dir = two_ranks
    (logdir,) = (work / "train" / "tensorboard_log" / "trackers").iterdir()
    scalars = tensorboard_scalars(logdir)
    expected = from_run_dir(run_dir)
    assert sorted(expected) == list(range(1, STEPS + 1))
    assert_holds(scalars, expected)
    # two ranks: each stage's spread and slowest rank; every step's samples (4 prompts x 2, over both ranks)
    assert {v for v in scalars["rlprof/time/actor_update/slowest_rank"].values()} <= {0.0, 1.0}
    assert scalars["rlprof/rollout/samples"] == {n: 8.0 for n in range(1, STEPS + 1)}
    assert scalars["rlprof/trigger/not_judged/warmup"] == {1: 1.0}
    assert scalars["rlprof/capture/baseline"] == {2: 1.0} and scalars["rlprof/capture/stage/step"] == {2: 1.0}
    # the trainer's own GRPO metrics beside them, as metrics.jsonl has them
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(close(scalars["reward_mean"][m["step"]], m["reward_mean"]) for m in metrics)
    assert set(scalars["timing_ms/actor_update"]) == set(range(1, STEPS + 1))
    # every key is one KEYS names (docs/verl.md lists them)
    assert {key_pattern(k) for k in rlprof_only(scalars)} <= set(KEYS)
    # the console's line holds them too
    line = next(x for x in proc.stdout.splitlines() if x.startswith("step:3 - "))
    assert "rlprof/rollout/samples:8 " in line + " " and "rlprof/time/step/max_s:" in line


def test_trainer_logs_the_same_to_wandb_offline_and_mlflows_local_store(two_ranks):
    _, work, run_dir = two_ranks
    (logdir,) = (work / "train" / "tensorboard_log" / "trackers").iterdir()
    board = rlprof_only(tensorboard_scalars(logdir))
    history, _ = wandb_scalars(work / "train")
    stored, _ = mlflow_scalars(f"sqlite:///{work / 'train' / 'mlflow.db'}")
    for scalars in (history, stored):
        assert set(rlprof_only(scalars)) == set(board)
        for key, steps in board.items():
            assert set(scalars[key]) == set(steps) and all(close(v, scalars[key][s]) for s, v in steps.items()), key
        assert "reward_mean" in scalars and set(scalars["reward_mean"]) == set(range(1, STEPS + 1))


def test_export_writes_the_same_scalars_to_each_tracker(two_ranks, tmp_path):
    _, work, run_dir = two_ranks
    (logdir,) = (work / "train" / "tensorboard_log" / "trackers").iterdir()
    live = tensorboard_scalars(logdir)
    for to in ("tensorboard", "wandb", "mlflow"):
        out = run_cli("export", run_dir, "--to", to, tmp_path / to, env={"WANDB_SILENT": "true"})
        assert out.returncode == 0, out.stderr
        assert f"wrote {STEPS} steps" in out.stdout
        if to == "tensorboard":
            scalars = tensorboard_scalars(tmp_path / to)
            assert "| kind | cause |" in tensorboard_text(tmp_path / to, "rlprof/findings")
        elif to == "wandb":
            scalars, summary = wandb_scalars(tmp_path / to)
            assert "| kind | cause |" in summary["rlprof/findings"]
        else:
            scalars, _ = mlflow_scalars(f"sqlite:///{tmp_path / to / 'mlflow.db'}")
        # the live run's measures and its metrics, at the same steps (the analysis's findings besides)
        for key, steps in live.items():
            assert key in scalars, (to, key)
            assert all(close(v, scalars[key][s]) for s, v in steps.items()), (to, key)
        assert {k for k in scalars if k.startswith("rlprof/") and k not in live} <= {
            k for k in scalars if k.startswith(("rlprof/finding/", "rlprof/capture/cause/"))
        }


def test_export_of_a_crashed_run_keeps_its_whole_steps(two_ranks, tmp_path):
    """A process killed mid-write leaves a cut timeline record and a cut sample line: the steps before them export
    whole, the cut step's record is left out."""
    import shutil

    _, _, run_dir = two_ranks
    crashed = tmp_path / "crashed"
    shutil.copytree(run_dir, crashed)
    for p in (crashed / "timeline").glob("rank*.bin"):
        p.write_bytes(p.read_bytes()[:-10])  # the last step's record cut on every rank
    samples = next((crashed / "samples").glob("*.jsonl"))
    samples.write_bytes(samples.read_bytes()[:-25])
    (crashed / "metrics.jsonl").unlink()  # the trainer writes it beside the traces at its end only
    out = run_cli("export", crashed, "--to", "tensorboard", tmp_path / "tb")
    assert out.returncode == 0, out.stderr
    scalars = tensorboard_scalars(tmp_path / "tb")
    assert set(scalars["rlprof/time/step/max_s"]) == set(range(1, STEPS))
    whole = from_run_dir(run_dir)
    assert_holds(scalars, {n: {k: v for k, v in whole[n].items() if "/time/" in k} for n in range(1, STEPS)})


def test_export_refuses_bad_input_in_one_line(trackers, tmp_path):
    (tmp_path / "empty").mkdir()
    for args, said in (
        ((tmp_path / "nothing", "--to", "tensorboard", tmp_path / "o"), "is not a directory"),
        ((tmp_path / "empty", "--to", "tensorboard", tmp_path / "o"), "no watch timeline"),
        ((tmp_path / "empty", "--to", "swanlab", tmp_path / "o"), "allowed: tensorboard, wandb, mlflow"),
    ):
        out = run_cli("export", *args)
        assert out.returncode == 2 and said in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def blocked(module: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    """`rlprof ...` in a Python where `module` cannot be imported (as where it is not installed)."""
    code = f"import sys; sys.modules[{module!r}] = None; sys.argv = ['rlprof', *{list(argv)!r}]; from rlprof.cli import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=300, env=dict(os.environ, **ENV)
    )


def test_a_tracker_not_installed_is_one_line_and_training_goes_on(trackers, tmp_path):
    proc = blocked(
        "wandb",
        "train",
        "trainer.steps=2",
        "data.prompts_per_step=2",
        "rollout.n=2",
        "actor.mini_batch_size=2",
        "actor.micro_batch_size=2",
        "rollout.max_new_tokens=4",
        f"trainer.output_dir={tmp_path}/train",
        "trainer.logger=[tensorboard,wandb]",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if "wandb logger" in line]
    assert len(said) == 1 and "needs wandb, which is not installed" in said[0] and "training goes on" in said[0]
    (logdir,) = (tmp_path / "train" / "tensorboard_log" / "rlprof").iterdir()
    assert set(tensorboard_scalars(logdir)["reward_mean"]) == {1, 2}
    # rlprof export names the tracker it cannot write to, in one line, exit 2
    out = blocked("mlflow", "export", str(RECORDED), "--to", "mlflow", str(tmp_path / "m"), cwd=tmp_path)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_samples_that_arrive_after_their_step_was_logged_go_to_their_own_step(trackers, tmp_path, caplog):
    """main_ppo's driver (integrations/verl/step_log.py), an async rollout's samples late: step 1's last samples
    reach the run directory after step 1 was logged. On the backends that take an earlier step (TensorBoard here,
    in verl's Tracking.logger shape: name -> backend) step 1's rollout measures are logged again over all its
    samples, at step 1; a backend that does not (W&B) hears nothing, and one line says so."""
    import logging
    import types

    from rlprof.collect.samples import SampleWriter, record
    from rlprof.integrations.verl.step_log import StepLog
    from rlprof.report.trackers import Console, TensorBoard

    run_dir = tmp_path / "run"
    writer = SampleWriter(run_dir, "verl", worker=0)

    def samples(step, first, n):
        writer.write(
            [
                record(
                    step=step,
                    sample=i,
                    worker=0,
                    start_us=0,
                    end_us=1000 * (i + 1),
                    response_tokens=10 + i,
                    source="verl",
                )
                for i in range(first, first + n)
            ]
        )

    said = []
    board = TensorBoard(tmp_path / "tb")
    tracking = types.SimpleNamespace(logger={"tensorboard": board, "wandb": Console(said.append)})
    trainer = types.SimpleNamespace(logger=tracking)
    log = StepLog(run_dir)
    samples(1, 0, 3)
    step1: dict = {}
    log.add(trainer, step1, 1, [])
    samples(1, 3, 2)  # late: step 1 was logged
    samples(2, 0, 4)
    step2: dict = {}
    with caplog.at_level(logging.WARNING, logger="rlprof"):
        log.add(trainer, step2, 2, [])
    board.close()
    assert step1["rlprof/rollout/samples"] == 3 and step2["rlprof/rollout/samples"] == 4
    scalars = tensorboard_scalars(tmp_path / "tb")  # only the late measures went to it directly (verl logs the rest)
    assert scalars["rlprof/rollout/samples"] == {1: 5.0}
    assert scalars["rlprof/rollout/sample_ms/max"] == {1: 5.0} and scalars["rlprof/rollout/response_tokens/max"] == {
        1: 14.0
    }
    assert said == []  # wandb takes no earlier step
    lines = [r.getMessage() for r in caplog.records if "after verl logged step 1" in r.getMessage()]
    assert len(lines) == 1 and "wandb takes no earlier step" in lines[0]

"""A busy machine: said, not hidden. The collector records each window's run-queue wait (the kernel's per-thread
scheduler statistics); a window whose threads waited for a core a large share of their runnable time carries a
finding and is left out of what ranks causes; the trainer chooses its threads from the cores that are free."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, run_cli
from rlprof.analyze.findings import THRESHOLDS, findings
from rlprof.analyze.step_metrics import BUSY_WAIT_SHARE, diagnose_steps
from rlprof.collect.cpu_wait import since, thread_times
from rlprof.trainer.threads import affinity, choose_threads, free_cores

RUNS = ROOT / "tests" / "data" / "runs"


def _row(file: str, stage: str, wall: float, step: int = 2) -> dict:
    return {"step": step, "role": "actor", "stage": stage, "rank": 0, "replica": None, "file": file, "unit": None,
            "index": None, "start_us": 0.0, "wall_ms": wall, "compute_ms": wall, "comm_ms": 0.0, "overlap_ms": 0.0,
            "memcpy_ms": 0.0, "idle_ms": 0.0}


def _doc(inputs: list[tuple[str, float, float]], rows: list[dict]) -> dict:
    return {"inputs": [{"path": f"/run/{f}", "cpu_ms": cpu, "run_wait_ms": wait, "step": 2} for f, cpu, wait in inputs],
            "rows": rows, "collectives": [], "launch": [], "memory": [], "run_config": None}


def test_the_busy_threshold_fires_just_above_and_not_below():
    share = THRESHOLDS["busy_wait_share"]
    wait = 100.0
    cpu_at = lambda s: wait * (1 - s) / s  # noqa: E731  cpu for a wait share s
    above = findings(_doc([("a.json.gz", cpu_at(share + 0.01), wait)], [_row("a.json.gz", "actor_update", 10)]))
    below = findings(_doc([("a.json.gz", cpu_at(share - 0.01), wait)], [_row("a.json.gz", "actor_update", 10)]))
    assert above[0]["kind"] == "busy_machine" and "every window was" in above[0]["text"]
    assert not any(f["kind"] == "busy_machine" for f in below)
    assert not any(f["kind"] == "busy_machine" for f in findings(_doc([("a.json.gz", 1.0, 3.0)], [])))  # < busy_wait_ms


def test_a_busy_window_is_left_out_of_what_ranks():
    """Two profiled steps; the one recorded under load makes reward_compute look dominant. The ranking comes from
    the quiet one alone, and the busy one is said first."""
    rows = [_row("busy.json.gz", "reward_compute", 900, step=2), _row("busy.json.gz", "actor_update", 100, step=2),
            _row("quiet.json.gz", "reward_compute", 10, step=3), _row("quiet.json.gz", "actor_update", 100, step=3)]
    doc = _doc([("busy.json.gz", 400.0, 600.0), ("quiet.json.gz", 900.0, 10.0)], rows)
    out = findings(doc)
    assert [f["kind"] for f in out][0] == "busy_machine" and "busy.json.gz" in out[0]["text"]
    assert "left out of the causes" in out[0]["text"]
    dominant = next(f for f in out if f["kind"] == "dominant_stage")
    assert dominant["stage"] == "actor_update"
    assert not any(f["kind"] == "slow_reward" for f in out)
    (reward,) = [m for m in doc["measures"] if m["measure"] == "reward_share"]
    assert reward["value"] == pytest.approx(10 / 110)


def test_busy_steps_are_said_and_left_out_of_metrics_first_advice():
    records = [{"step": k, "stages": {"actor_update": 1.0}, "step_s": 1.0, "response_length": 4,
                "run_wait_share": 0.0} for k in range(1, 9)]
    records[4].update(step_s=6.0, run_wait_share=BUSY_WAIT_SHARE + 0.1, stages={"actor_update": 6.0})
    out = diagnose_steps(records)
    assert out["busy"] == [{"step": 5, "run_wait_share": BUSY_WAIT_SHARE + 0.1}]
    assert out["outliers"] == []  # the slow step is the neighbour's, not the program's


def test_thread_times_count_this_process():
    start = thread_times()
    if start is None:
        pytest.skip("no /proc/self/task/*/schedstat here")
    x = 0
    for i in range(2_000_000):
        x += i
    got = since(start)
    assert got["cpu_ms"] > 0 and got["run_wait_ms"] >= 0


def test_the_trainer_takes_the_threads_it_is_given_or_the_free_cores():
    assert choose_threads(1, requested=3) == (3, "trainer.threads")
    threads, why = choose_threads(1)
    assert 1 <= threads <= len(affinity()) and "free" in why
    free = free_cores(affinity(), sample_s=0.05)
    assert free is None or 0.0 <= free <= len(affinity())
    assert choose_threads(len(affinity()) * 4)[0] == 1  # more local ranks than cores: one each


def test_trainer_threads_key_is_checked_and_recorded(tmp_path):
    proc = run_cli("train", "trainer.threads=0", cwd=tmp_path)
    assert proc.returncode == 2 and "trainer.threads = 0" in proc.stderr and "an integer >= 1, or null" in proc.stderr
    recorded = json.loads((RUNS / "healthy" / "trainer_config.json").read_text())
    assert recorded["threads"]["threads"] >= 1 and recorded["threads"]["why"]
    assert recorded["config"]["trainer"]["threads"] is None  # chosen, not given


@pytest.mark.slow
def test_a_window_recorded_under_load_carries_the_finding(tmp_path):
    """Made busy here: two busy loops per core beside a trainer told to use every core. Its profiled window says
    the machine was busy, first; the recorded quiet runs (tests/data/runs) say nothing of the kind."""
    cores = len(affinity())
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * cores)]
    try:
        proc = run_cli("train", "trainer.steps=2", f"trainer.threads={cores}", f"trainer.output_dir={tmp_path}/t",
                       "global_profiler.tool=torch", "global_profiler.steps=[2]", f"global_profiler.save_path={tmp_path}/p",
                       "actor_rollout_ref.actor.profiler.enable=true", cwd=tmp_path, timeout=900)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run_dir,) = (tmp_path / "p").iterdir()
    (row,) = [json.loads(line) for line in (run_dir / "manifest.jsonl").read_text().splitlines()]
    assert row["run_wait_ms"] / (row["cpu_ms"] + row["run_wait_ms"]) >= THRESHOLDS["busy_wait_share"]
    doc = json.loads(run_cli("analyze", run_dir, "--json").stdout)
    assert doc["findings"][0]["kind"] == "busy_machine"
    quiet = shutil.copytree(RUNS / "healthy", tmp_path / "healthy")
    doc = json.loads(run_cli("analyze", quiet, "--json").stdout)
    assert not any(f["kind"] == "busy_machine" for f in doc["findings"])

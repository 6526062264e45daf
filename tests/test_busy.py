"""A busy machine: said, not hidden. The collector records each window's run-queue wait (the kernel's per-thread
scheduler statistics); a window whose threads waited for a core a large share of their runnable time carries a
finding and is left out of what ranks causes; the trainer chooses its threads from the cores that are free."""

import json
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, run_cli
from rlprof.analyze.diagnosis.findings import diagnose, findings
from rlprof.analyze.inputs.busy_machine import EXTERNAL_SHARE, WAIT_SHARE, machine_load
from rlprof.analyze.inputs.step_metrics import read_step_metrics
from rlprof.analyze.over_time.step_trends import diagnose_steps
from rlprof.collect.cpu_wait import sample, since
from rlprof.trainer.threads import affinity, choose_threads, free_cores

RUNS = ROOT / "tests" / "data" / "runs"


def _row(file: str, stage: str, wall: float, step: int = 2) -> dict:
    return {
        "step": step,
        "role": "actor",
        "stage": stage,
        "rank": 0,
        "replica": None,
        "file": file,
        "unit": None,
        "index": None,
        "start_us": 0.0,
        "wall_ms": wall,
        "compute_ms": wall,
        "comm_ms": 0.0,
        "overlap_ms": 0.0,
        "memcpy_ms": 0.0,
        "idle_ms": 0.0,
    }


def _load(cpu: float, wait: float, external: float, span: float = 1000.0, cpus: int = 2) -> dict:
    """The collector's load fields for a window: its threads ran `cpu` and waited `wait` ms; other processes used
    `external` of the host's CPU capacity over `span` ms (the job itself used `cpu`)."""
    return {
        "cpu_ms": cpu,
        "run_wait_ms": wait,
        "span_ms": span,
        "host_cpus": cpus,
        "job_cpu_ms": cpu,
        "host_busy_ms": cpu + external * span * cpus,
    }


def _doc(inputs: list[tuple[str, dict]], rows: list[dict]) -> dict:
    return {
        "inputs": [{"path": f"/run/{f}", "step": 2, **load} for f, load in inputs],
        "rows": rows,
        "collectives": [],
        "launch": [],
        "memory": [],
        "run_config": None,
    }


def test_the_busy_rule_needs_both_a_wait_and_a_neighbour():
    """Busy: the threads waited for a core >= WAIT_SHARE of their runnable time and other processes used >=
    EXTERNAL_SHARE of the host's CPUs. Each condition alone is not enough: two ranks on two cores wait on each other
    (gloo's threads) with nothing else running, and a neighbour on idle cores takes nothing from this process."""
    wait = 100.0
    cpu_at = lambda s: wait * (1 - s) / s  # noqa: E731  the cpu that gives a wait share s
    judge = lambda w, e: machine_load(_load(cpu_at(w), wait, e))["busy"]  # noqa: E731
    assert judge(WAIT_SHARE + 0.01, EXTERNAL_SHARE + 0.01)
    assert not judge(WAIT_SHARE - 0.01, EXTERNAL_SHARE + 0.01)
    assert not judge(WAIT_SHARE + 0.01, EXTERNAL_SHARE - 0.01)
    assert not machine_load(_load(1.0, 3.0, 0.9))["busy"]  # a wait of 3 ms is timer noise
    assert machine_load({"cpu_ms": 1.0, "run_wait_ms": 1.0}) is None  # other tools' traces are not judged
    rows = [_row("a.json.gz", "actor_update", 10)]
    above = findings(_doc([("a.json.gz", _load(cpu_at(WAIT_SHARE + 0.01), wait, 0.5))], rows))
    assert above[0]["kind"] == "busy_machine" and "every window was" in above[0]["text"]
    assert "other processes used 50% of its CPUs" in above[0]["text"]
    below = findings(_doc([("a.json.gz", _load(cpu_at(WAIT_SHARE + 0.01), wait, 0.0))], rows))
    assert not any(f["kind"] == "busy_machine" for f in below)


def test_a_busy_window_is_left_out_of_what_ranks():
    """Two profiled steps; the one recorded under load makes reward_compute look dominant. The ranking comes from
    the quiet one alone, and the busy one is said first."""
    rows = [
        _row("busy.json.gz", "reward_compute", 900, step=2),
        _row("busy.json.gz", "actor_update", 100, step=2),
        _row("quiet.json.gz", "reward_compute", 10, step=3),
        _row("quiet.json.gz", "actor_update", 100, step=3),
    ]
    doc = _doc([("busy.json.gz", _load(400.0, 600.0, 0.5)), ("quiet.json.gz", _load(900.0, 10.0, 0.0))], rows)
    found_measures, out = diagnose(doc)
    assert [f["kind"] for f in out][0] == "busy_machine" and "busy.json.gz" in out[0]["text"]
    assert "left out of the causes" in out[0]["text"]
    dominant = next(f for f in out if f["kind"] == "dominant_stage")
    assert dominant["stage"] == "actor_update"
    assert not any(f["kind"] == "slow_reward" for f in out)
    (reward,) = [m for m in found_measures if m["measure"] == "reward_share"]
    assert reward["value"] == pytest.approx(10 / 110)


def test_busy_steps_are_said_and_left_out_of_metrics_first_advice(tmp_path):
    quiet, busy = _load(900.0, 10.0, 0.0), _load(400.0, 600.0, 0.5)
    lines = [
        {"step": k, "stage_ms": {"actor_update": 1000.0}, "step_ms": 1000.0, "response_length": 4, **quiet}
        for k in range(1, 9)
    ]
    lines[4].update(step_ms=6000.0, stage_ms={"actor_update": 6000.0}, **busy)
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    _, records = read_step_metrics(path)
    out = diagnose_steps(records)
    assert [b["step"] for b in out["busy"]] == [5] and out["busy"][0]["external_share"] == pytest.approx(0.5)
    assert out["outliers"] == []  # the slow step is the neighbour's, not the program's


def test_the_counters_count_this_process_and_the_host():
    start = sample()
    if start is None:
        pytest.skip("no /proc/self/task/*/schedstat here")
    x = 0
    for i in range(3_000_000):
        x += i
    got = since(start)
    assert got["cpu_ms"] > 0 and got["run_wait_ms"] >= 0 and got["span_ms"] > 0
    assert got["host_cpus"] >= 1 and got["host_busy_ms"] >= got["job_cpu_ms"] - 20  # clock ticks: 10 ms each
    assert got["job_cpu_ms"] > 0  # this process alone (not under torchrun)


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
        proc = run_cli(
            "train",
            "trainer.steps=2",
            f"trainer.threads={cores}",
            f"trainer.output_dir={tmp_path}/t",
            "global_profiler.tool=torch",
            "global_profiler.steps=[2]",
            f"global_profiler.save_path={tmp_path}/p",
            "actor_rollout_ref.actor.profiler.enable=true",
            cwd=tmp_path,
            timeout=900,
        )
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run_dir,) = (tmp_path / "p").iterdir()
    (row,) = [json.loads(line) for line in (run_dir / "manifest.jsonl").read_text().splitlines()]
    assert machine_load(row)["busy"], row
    doc = json.loads(run_cli("analyze", run_dir, "--json").stdout)
    assert doc["findings"][0]["kind"] == "busy_machine"
    quiet = shutil.copytree(RUNS / "healthy", tmp_path / "healthy")
    doc = json.loads(run_cli("analyze", quiet, "--json").stdout)
    assert not any(f["kind"] == "busy_machine" for f in doc["findings"])

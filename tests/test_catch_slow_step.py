"""Catching the slow step: the watch, the trigger, requests from `rlprof capture`, and the run over time."""

import json
import logging
import os
import subprocess
import sys
import time

import pytest

from conftest import run_cli
from helpers import rows
from rlprof.analyze.timeline_file import BUSY, read_rank, timeline_ranks
from rlprof.collect import Profiler
from rlprof.config import load_plan

A = "actor_rollout_ref.actor.profiler"
T = "global_profiler.trigger"


def plan(tmp_path, *overrides, discrete=True):
    return load_plan(None, ["global_profiler.tool=torch", f"global_profiler.save_path={tmp_path}/p", f"{A}.enable=true",
                            f"{A}.tool_config.torch.discrete={str(discrete).lower()}", *overrides])


def host(prof, steps, slow_from=None, slow_stage="actor_update", extra=0.15):
    """A hand-written loop over three stages; `extra` seconds of sleep in `slow_stage` from step `slow_from`."""
    with prof:
        for n in range(1, steps + 1):
            with prof.step(n):
                for stage in ("rollout_generate", "actor_compute_log_prob", "actor_update"):
                    with prof.stage(stage):
                        time.sleep(0.01 + (extra if slow_from and n >= slow_from and stage == slow_stage else 0))
    return tmp_run(prof)


def tmp_run(prof):
    return prof.watch_dir


def busy_steps(run_dir, rank=0):
    rec = read_rank(run_dir / "timeline" / f"rank{rank}.bin")
    return {int(s) for s, f in zip(rec["step"], rec["flags"]) if f & BUSY}


def first_judged(onset, busy):
    """The first step at or after the onset the trigger may judge: busy steps never trigger."""
    step = onset
    while step in busy:
        step += 1
    return step


# ---- configuration ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("override, key", [
    (f"{T}.slow.factor=0.5", f"{T}.slow.factor"),
    (f"{T}.keep=sometimes", f"{T}.keep"),
    (f"{T}.max_captures=0", f"{T}.max_captures"),
    (f"{T}.slow.facter=2", f"{T}.slow.facter"),
    (f"{T}.request=maybe", f"{T}.request"),
    (f"{T}.cooldown=-1", f"{T}.cooldown"),
])
def test_bad_trigger_config_is_one_line_naming_the_key(tmp_path, override, key):
    proc = run_cli("plan", "global_profiler.tool=torch", f"{A}.enable=true", override, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and key in proc.stderr and "Traceback" not in proc.stderr


def test_trigger_that_arms_nothing_is_refused(tmp_path):
    proc = run_cli("plan", "global_profiler.tool=torch", f"{A}.enable=true", f"{T}.max_captures=2", cwd=tmp_path)
    assert proc.returncode == 2 and T in proc.stderr and "arms nothing" in proc.stderr


def test_trigger_reads_in_the_integrated_dialect_too():
    p = load_plan(None, ["profiler_config.integrated.profile=true",
                         "profiler_config.integrated.trigger.slow.factor=3"])
    assert p.trigger.slow.factor == 3.0 and p.trigger.keep == "next"


# ---- the watch and the slow rule, in any host ---------------------------------------------------------------------
def test_slow_stage_is_captured_at_the_next_step_with_its_trigger_row(tmp_path):
    prof = Profiler(plan(tmp_path, f"{T}.slow.factor=2.0"), run_id="run")
    d = host(prof, 12, slow_from=8)
    judged = first_judged(8, busy_steps(d))
    captured = [r for r in rows(d) if r.get("trigger")]
    assert [(r["step"], r["stage"]) for r in captured] == [(judged + 1, "actor_update")]
    t = captured[0]["trigger"]
    assert t["reason"] == "slow" and t["step"] == judged and t["stage"] == "actor_update" and t["rank"] == 0
    assert t["seconds"] > 2 * t["baseline_seconds"] and t["seconds"] >= 0.15
    rec = read_rank(d / "timeline" / "rank0.bin")
    assert list(rec["step"]) == list(range(1, 13))
    update = rec["stage_s"][:, 6]  # actor_update's column
    assert all(update[7:] > 0.15) and all(update[3:7] < 0.1)
    assert (d / "timeline" / "columns.json").exists()


def test_control_captures_nothing_and_warm_up_never_triggers(tmp_path):
    # the first steps are the slow ones (a warm-up): the trigger must not take them
    prof = Profiler(plan(tmp_path, f"{T}.slow.factor=2.0", f"{T}.warmup_steps=3"), run_id="run")
    with prof:
        for n in range(1, 31):
            with prof.step(n):
                with prof.stage("actor_update"):
                    time.sleep(0.2 if n <= 3 else 0.01)
    assert [r for r in rows(prof.watch_dir) if r.get("trigger")] == []
    assert len(read_rank(prof.watch_dir / "timeline" / "rank0.bin")) == 30


def test_budget_and_cooldown_bound_the_captures(tmp_path):
    prof = Profiler(plan(tmp_path, f"{T}.slow.factor=2.0", f"{T}.max_captures=1", f"{T}.window=3"), run_id="run")
    with prof:
        for n in range(1, 21):
            with prof.step(n):
                with prof.stage("actor_update"):
                    time.sleep(0.2 if n in (6, 12, 18) else 0.01)  # three separate spikes
    assert len([r for r in rows(prof.watch_dir) if r.get("trigger")]) == 1


def test_fault_inside_the_watch_is_one_warning_and_training_goes_on(tmp_path, caplog):
    p = plan(tmp_path, f"{T}.slow.factor=2.0")
    run = tmp_path / "p" / "run"
    run.mkdir(parents=True)
    (run / "timeline").write_text("not a directory")  # the timeline cannot be written
    prof = Profiler(p, run_id="run")
    with caplog.at_level(logging.WARNING, logger="rlprof"):
        d = host(prof, 12, slow_from=8)
    faults = [r for r in caplog.records if "the watch failed" in r.getMessage()]
    assert len(faults) == 1 and "training goes on" in faults[0].getMessage()
    judged = first_judged(8, set())  # no timeline: the busy flags are not on disk; the decision still ran
    assert [r["step"] for r in rows(d) if r.get("trigger")] in ([judged + 1], [judged + 2], [judged + 3])


def test_keep_slow_only_keeps_only_the_slow_windows(tmp_path, capsys):
    prof = Profiler(plan(tmp_path, f"{T}.slow.factor=2.0", f"{T}.keep=slow_only", f"{T}.stages=[actor_update]"),
                    run_id="run")
    d = host(prof, 12, slow_from=9)
    kept = [r for r in rows(d) if r["stage"] == "actor_update"]
    assert kept and all(r["trigger"]["reason"] == "slow" and r["trigger"]["step"] == r["step"] for r in kept)
    assert min(r["step"] for r in kept) >= 9  # the fast windows were profiled, then dropped
    assert sorted(p.name for p in d.glob("*.json.gz")) == sorted(r["path"] for r in kept)
    assert "keep: slow_only profiled 9 stage windows" in capsys.readouterr().out  # steps 4..12

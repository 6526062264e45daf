"""Catching the slow step: the watch, the trigger, requests from `rlprof capture`, and the run over time."""

import json
import logging
import os
import subprocess
import sys
import time

import pytest

from conftest import run_cli
from helpers import first_judged, rows, timeline_said, trigger_steps, unjudged_steps
from rlprof.analyze.inputs.timeline_file import CONTENTION, JUDGED, PROFILED, SLOW, STRAGGLER, read_rank, timeline_ranks
from rlprof.collect import Profiler
from rlprof.config import load_plan

A = "actor_rollout_ref.actor.profiler"
T = "global_profiler.trigger"


def plan(tmp_path, *overrides, discrete=True):
    return load_plan(
        None,
        [
            "global_profiler.tool=torch",
            f"global_profiler.save_path={tmp_path}/p",
            f"{A}.enable=true",
            f"{A}.tool_config.torch.discrete={str(discrete).lower()}",
            *overrides,
        ],
    )


def host(prof, steps, slow_from=None, slow_stage="actor_update", extra=0.15):
    """A hand-written loop over three stages; `extra` seconds of sleep in `slow_stage` from step `slow_from`."""
    with prof:
        for n in range(1, steps + 1):
            with prof.step(n):
                for stage in ("rollout_generate", "actor_compute_log_prob", "actor_update"):
                    with prof.stage(stage):
                        time.sleep(0.01 + (extra if slow_from and n >= slow_from and stage == slow_stage else 0))
    return tmp_run(prof)


def updates(prof, steps, slow: dict[int, float]):
    """A loop of one stage, actor_update: 0.01 s a step, or `slow[n]` seconds at step n."""
    with prof:
        for n in range(1, steps + 1):
            with prof.step(n):
                with prof.stage("actor_update"):
                    time.sleep(slow.get(n, 0.01))
    return prof.watch_dir


def tmp_run(prof):
    return prof.watch_dir


# ---- configuration ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "override, key",
    [
        (f"{T}.slow.factor=0.5", f"{T}.slow.factor"),
        (f"{T}.keep=sometimes", f"{T}.keep"),
        (f"{T}.max_captures=0", f"{T}.max_captures"),
        (f"{T}.slow.facter=2", f"{T}.slow.facter"),
        (f"{T}.request=maybe", f"{T}.request"),
        (f"{T}.cooldown=-1", f"{T}.cooldown"),
    ],
)
def test_bad_trigger_config_is_one_line_naming_the_key(tmp_path, override, key):
    proc = run_cli("plan", "global_profiler.tool=torch", f"{A}.enable=true", override, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and key in proc.stderr and "Traceback" not in proc.stderr


def test_trigger_that_arms_nothing_is_refused(tmp_path):
    proc = run_cli("plan", "global_profiler.tool=torch", f"{A}.enable=true", f"{T}.max_captures=2", cwd=tmp_path)
    assert proc.returncode == 2 and T in proc.stderr and "arms nothing" in proc.stderr


def test_plan_says_what_the_trigger_does(tmp_path):
    proc = run_cli(
        "plan",
        "global_profiler.tool=torch",
        f"{A}.enable=true",
        f"{T}.straggler.factor=1.5",
        f"{T}.max_captures=2",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "trigger: every step of every rank watched" in proc.stdout and "over 1.5x the other ranks" in proc.stdout
    assert "at most 2 capture(s)" in proc.stdout and "nothing will be collected" not in proc.stdout
    proc = run_cli(
        "plan", "global_profiler.tool=torch", f"{A}.enable=true", f"{T}.request=true", "--json", cwd=tmp_path
    )
    assert json.loads(proc.stdout)["trigger"]["request"] is True


def test_trigger_reads_in_the_integrated_dialect_too():
    p = load_plan(None, ["profiler_config.integrated.profile=true", "profiler_config.integrated.trigger.slow.factor=3"])
    assert p.trigger.slow.factor == 3.0 and p.trigger.keep == "next"


# ---- the watch and the slow rule, in any host ---------------------------------------------------------------------
@pytest.mark.timing
def test_slow_stage_is_captured_at_the_next_step_with_its_trigger_row(tmp_path):
    prof = Profiler(plan(tmp_path, f"{T}.slow.factor=2.0"), run_id="run")
    d = host(prof, 16, slow_from=10)
    expected = trigger_steps(10, unjudged_steps(d), 16)
    captured = [r for r in rows(d) if r.get("trigger")]
    if not expected:
        assert captured == [], timeline_said(d)
        return
    judged = captured[0]["trigger"]["step"]
    assert judged in expected and (captured[0]["step"], captured[0]["stage"]) == (judged + 1, "actor_update"), (
        expected,
        [r["trigger"] for r in captured],
        timeline_said(d),
    )
    assert len(captured) == 1, timeline_said(
        d
    )  # the slowdown persists: a new level, captured once (the baseline restarts after it)
    t = captured[0]["trigger"]
    assert t["reason"] == "slow" and t["step"] == judged and t["stage"] == "actor_update" and t["rank"] == 0
    assert t["seconds"] > 2 * t["baseline_seconds"] and t["seconds"] >= 0.15
    rec = read_rank(d / "timeline" / "rank0.bin")
    assert list(rec["step"]) == list(range(1, 17))
    update = rec["stage_s"][:, 6]  # actor_update's column
    assert all(update[9:] > 0.15) and all(update[3:9] < 0.1)
    assert (d / "timeline" / "columns.json").exists()
    # the trigger's verdict in the records (what a tracker logs): the step it saw slow judged and found slow; the
    # warm-up, the unjudged and the captured steps not judged; the judged steps before the onset found nothing
    flags = {int(s): int(f) for s, f in zip(rec["step"], rec["flags"])}
    assert flags[judged] & (JUDGED | SLOW) == JUDGED | SLOW
    assert not any(
        flags[n] & JUDGED for n in (*range(1, 4), *[s for s, f in flags.items() if f & PROFILED], judged + 1)
    )
    assert not any(flags[n] & (SLOW | STRAGGLER) for n in range(1, judged))


@pytest.mark.timing
def test_control_captures_nothing_and_warm_up_never_triggers(tmp_path):
    # the first steps are the slow ones (a warm-up): the trigger must not take them
    prof = Profiler(plan(tmp_path, f"{T}.slow.factor=2.0", f"{T}.warmup_steps=3"), run_id="run")
    d = updates(prof, 30, dict.fromkeys((1, 2, 3), 0.2))
    assert [r for r in rows(d) if r.get("trigger")] == [], timeline_said(d)
    assert len(read_rank(d / "timeline" / "rank0.bin")) == 30


@pytest.mark.timing
def test_the_plans_own_profiled_steps_are_flagged_and_never_called_a_spike(tmp_path):
    """A step the plan profiles anyway carries the profiler's cost: the trigger does not judge it, and neither may
    the run over time (here its update is slowed 0.2 s, as a heavy window can; steps 4-9 are the baseline)."""
    from rlprof.analyze.over_time.timeline import analyze_timeline

    prof = Profiler(plan(tmp_path, f"{T}.slow.factor=2.0", "global_profiler.steps=[10]"), run_id="run")
    d = updates(prof, 12, {10: 0.21})
    assert [r for r in rows(d) if r.get("trigger")] == [], timeline_said(d)
    assert [r["step"] for r in rows(d)] == [10]  # the plan's window, written
    timeline = analyze_timeline(d)
    # step 10, and the steps its window's background write overlapped (none on a quiet machine)
    profiled = timeline["profiled_steps"]
    assert profiled == list(range(10, 10 + len(profiled))) and len(profiled) >= 1, profiled
    assert timeline["captured_steps"] == []
    assert not [s for s in timeline["spikes"] if s["step"] == 10], timeline["spikes"]
    assert not [s for s in timeline["level_shifts"] if s["from_step"] == 10]
    assert max(timeline["per_step"]["actor_update"]["max"]) >= 0.2  # the step is kept in the series, flagged


def test_a_step_beside_a_window_written_in_the_background_is_neither_judged_nor_a_spike(tmp_path, monkeypatch):
    """A window is written in the background after its step (gzip, manifest): the steps that write overlaps carry
    its cost. Here the write of step 5's window is held 0.5 s and step 6's update is slowed 0.2 s, as the write's
    cost can: step 6 is flagged, the trigger does not take it (no capture at step 7), the run over time calls it
    no spike."""
    from rlprof.analyze.over_time.timeline import analyze_timeline
    from rlprof.collect.window import WindowWriter

    finish = WindowWriter._finish

    def slow_finish(self, w, out):
        time.sleep(0.5)
        finish(self, w, out)

    monkeypatch.setattr(WindowWriter, "_finish", slow_finish)
    prof = Profiler(
        plan(tmp_path, f"{T}.slow.factor=2.0", f"{T}.warmup_steps=1", "global_profiler.steps=[5]"), run_id="run"
    )
    d = updates(prof, 10, {6: 0.21})
    assert [r for r in rows(d) if r.get("trigger")] == []
    assert [r["step"] for r in rows(d)] == [5]
    timeline = analyze_timeline(d)
    assert {5, 6} <= set(timeline["profiled_steps"]), timeline["profiled_steps"]
    assert not [s for s in timeline["spikes"] if s["step"] == 6], timeline["spikes"]


def test_a_capture_samples_the_roles_schedule_units_inside_the_stage(tmp_path):
    """A slow update caught as one micro-batch: the role's `schedule` (unit micro_batch, active 1) applies inside
    the captured stage, and a timeline-only run (before anything was captured) is analysed too."""
    from helpers import load_trace, names
    from rlprof.analyze.pipeline import analyze

    prof = Profiler(
        plan(tmp_path, f"{T}.request=true", f"{A}.tool_config.torch.schedule={{unit: micro_batch, active: 1}}"),
        run_id="run",
    )
    from rlprof.collect.request import submit

    submit(prof.watch_dir, step=3, role="actor", stage="actor_update", ranks=None)
    with prof:
        for n in range(1, 5):
            with prof.step(n):
                with prof.stage("actor_update"):
                    for _ in range(4):
                        with prof.unit("micro_batch", seqs=2):
                            time.sleep(0.002)
            if n == 2:
                doc = analyze(prof.watch_dir, workers=1)  # the timeline alone: nothing captured yet
                assert doc["rows"] == [] and doc["timeline"]["steps"] == [1, 2]
    (row,) = rows(prof.watch_dir)
    assert (row["step"], row["stage"], row["unit"], row["trigger"]["reason"]) == (
        3,
        "actor_update",
        "micro_batch",
        "request",
    )
    trace = load_trace(prof.watch_dir / row["path"])
    assert names(trace, "rlprof:micro_batch:") == ["rlprof:micro_batch:0"]  # one of the stage's four


def test_budget_and_cooldown_bound_the_captures(tmp_path):
    prof = Profiler(plan(tmp_path, f"{T}.slow.factor=2.0", f"{T}.max_captures=1", f"{T}.window=3"), run_id="run")
    d = updates(prof, 20, dict.fromkeys((6, 12, 18), 0.2))  # three separate spikes
    assert len([r for r in rows(d) if r.get("trigger")]) == 1


@pytest.mark.timing
def test_a_new_level_is_captured_once_and_separate_spikes_each_time(tmp_path):
    """After a slow capture the baseline restarts: a stage slowed from step 10 on is captured once in 30 steps,
    not again each time the cooldown ends while the old steps hold the median; spikes at steps 8, 15 and 22 (the
    job back at its level between them) are each captured, within max_captures (3)."""
    from rlprof.analyze.inputs.timeline_file import BUSY

    prof = Profiler(plan(tmp_path / "level", f"{T}.slow.factor=2.0"), run_id="run")
    d = host(prof, 30, slow_from=10)
    captured = [r for r in rows(d) if r.get("trigger")]
    assert len(captured) == (1 if trigger_steps(10, unjudged_steps(d), 30) else 0), (captured, timeline_said(d))

    prof = Profiler(plan(tmp_path / "spikes", f"{T}.slow.factor=2.0"), run_id="run")
    d = updates(prof, 26, dict.fromkeys((8, 15, 22), 0.3))
    taken = sorted(r["step"] for r in rows(d) if r.get("trigger"))
    assert set(taken) <= {9, 16, 23}, (taken, timeline_said(d))  # only the step after a spike
    rec = read_rank(d / "timeline" / "rank0.bin")
    if not (rec["flags"] & BUSY).any():  # a quiet machine: every spike judged
        assert taken == [9, 16, 23]


def test_fault_writing_the_timeline_is_one_warning_and_the_decision_goes_on(tmp_path, caplog):
    p = plan(tmp_path, f"{T}.request=true")
    run = tmp_path / "p" / "run"
    run.mkdir(parents=True)
    (run / "timeline").write_text("not a directory")  # the timeline cannot be written
    from rlprof.collect.request import submit

    submit(run, step=6, role="actor", stage="actor_update", ranks=None)  # asked before the job starts
    prof = Profiler(p, run_id="run")
    with caplog.at_level(logging.WARNING, logger="rlprof"):
        d = host(prof, 10)
    faults = [r for r in caplog.records if "the watch failed" in r.getMessage()]
    assert len(faults) == 1 and "training goes on" in faults[0].getMessage() and "timeline" in faults[0].getMessage()
    assert [(r["step"], r["stage"], r["trigger"]["reason"]) for r in rows(d)] == [(6, "actor_update", "request")]


def test_fault_inside_the_trigger_is_one_warning_and_training_goes_on(tmp_path, caplog, monkeypatch):
    from rlprof.collect import trigger

    def broken(self, step, matrix, ranks=None):
        raise RuntimeError("injected")

    monkeypatch.setattr(trigger.Trigger, "decide", broken)
    prof = Profiler(plan(tmp_path, f"{T}.slow.factor=2.0"), run_id="run")
    done = []
    with caplog.at_level(logging.WARNING, logger="rlprof"):
        with prof:
            for n in range(1, 11):
                with prof.step(n):
                    with prof.stage("actor_update"):
                        done.append(n)
    faults = [r for r in caplog.records if "the watch failed" in r.getMessage()]
    assert done == list(range(1, 11))
    assert len(faults) == 1 and "failed to decide" in faults[0].getMessage() and "without it" in faults[0].getMessage()
    assert rows(prof.watch_dir) == []


@pytest.mark.timing
def test_keep_slow_only_keeps_only_the_slow_windows(tmp_path, capsys):
    prof = Profiler(
        plan(
            tmp_path,
            f"{T}.slow.factor=2.0",
            f"{T}.keep=slow_only",
            f"{T}.stages=[actor_update]",
            f"{T}.max_captures=10",
        ),
        run_id="run",
    )
    d = host(prof, 12, slow_from=9)
    kept = [r for r in rows(d) if r["stage"] == "actor_update"]
    busy = unjudged_steps(d)
    # empty only where a loaded machine left no judgement
    assert bool(kept) == bool(trigger_steps(9, busy, 12)), ([r["step"] for r in kept], timeline_said(d))
    assert all(r["trigger"]["reason"] == "slow" and r["trigger"]["step"] == r["step"] for r in kept)
    assert all(r["step"] >= 9 and r["step"] not in busy for r in kept)  # the fast windows were profiled, dropped
    assert sorted(p.name for p in d.glob("*.json.gz")) == sorted(r["path"] for r in kept)
    assert "keep: slow_only profiled 9 stage windows" in capsys.readouterr().out  # steps 4..12


def test_capture_says_in_one_line_why_not(tmp_path):
    prof = Profiler(plan(tmp_path, f"{T}.request=true"), run_id="run")
    d = host(prof, 4)  # the job ended: its heartbeat says so
    proc = run_cli("capture", d, "--next")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no live job" in proc.stderr
    assert "ended" in proc.stderr
    live = json.loads((d / "rlprof_live.json").read_text())
    for fields, why in [
        ({"captures_left": 0}, "the budget is spent"),
        ({"step": 9}, "step 5 has passed"),
        ({"request": False}, "takes no requests"),
    ]:
        # a live job (this test's own process) at step 4 with the budget left, but for the one field changed
        (d / "rlprof_live.json").write_text(
            json.dumps({**live, "ended": False, "pid": os.getpid(), "step": 4, "captures_left": 1, **fields})
        )
        proc = run_cli("capture", d, "--step", "5", "--wait", "1")
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and why in proc.stderr, (fields, proc.stderr)
    (d / "rlprof_live.json").write_text(
        json.dumps({**live, "ended": False, "pid": os.getpid(), "step": 4, "captures_left": 1})
    )
    proc = run_cli("capture", tmp_path / "p", "--next", "--wait", "0")  # the save_path of one live run finds it
    assert proc.returncode == 0 and f"asked {d} for a capture" in proc.stdout, proc.stderr
    assert json.loads((d / "capture_request.json").read_text())["step"] is None  # --next


def test_capture_waits_for_every_window_each_rank_noted_and_names_those_still_being_written(tmp_path):
    """The mechanism alone, on files as a two-rank job leaves them: the answer names the ranks, each rank notes the
    windows it took (at the captured step's end, before their rows), and the command waits for every noted row."""
    from rlprof.collect.manifest import append_row
    from rlprof.collect.request import wait_answer
    from rlprof.collect.watch import write_live, write_rank_note, write_response

    run = tmp_path / "run"
    run.mkdir()
    write_live(run, step=5)  # this test's process is the live job
    rid, trigger = 42, {"reason": "request", "request_id": 42}

    def window(rank, stage):
        return {
            "role": "actor",
            "stage": stage,
            "window": 0,
            "path": f"step5_actor_{stage}_rank{rank}.pt.trace.json.gz",
        }

    def row(rank, stage):
        return {"step": 5, "rank": rank, "bytes": 1, "status": "complete", "trigger": trigger, **window(rank, stage)}

    write_response(run, rid, status="captured", at_step=5, stage=None, role=None, ranks=[0, 1])
    write_rank_note(run, rid, 0, step=5, windows=[window(0, "actor_update"), window(0, "actor_compute_log_prob")])
    append_row(run, row(0, "actor_update"))
    got = wait_answer(run, rid, 0.5)
    assert not got.whole and [r["stage"] for r in got.rows] == ["actor_update"]
    assert got.pending == [
        "rank 0 actor/actor_compute_log_prob: step5_actor_actor_compute_log_prob_rank0.pt.trace.json.gz",
        "rank 1's windows (it has not said what it captured)",
    ]
    write_rank_note(run, rid, 1, step=5, windows=[window(1, "actor_update")])
    append_row(run, row(0, "actor_compute_log_prob"))
    assert wait_answer(run, rid, 0.5).pending == [
        "rank 1 actor/actor_update: step5_actor_actor_update_rank1.pt.trace.json.gz"
    ]
    append_row(run, row(1, "actor_update"))
    got = wait_answer(run, rid, 0.5)
    assert got.whole and not got.pending and len(got.rows) == 3


def test_capture_of_a_whole_step_lists_every_window_the_job_wrote_for_it(tmp_path):
    """`rlprof capture --next` on a running host whose windows are written in the background: the command lists every
    window of the capture, or names those still being written when its wait ends, whatever the timing."""
    prof = Profiler(plan(tmp_path, f"{T}.request=true"), run_id="run")
    run = prof.watch_dir
    cli = None
    with prof:
        for n in range(1, 400):
            with prof.step(n):
                for stage in ("rollout_generate", "actor_compute_log_prob", "actor_update"):
                    with prof.stage(stage):
                        sum(i * i for i in range(20000))
            if n == 2:
                cli = subprocess.Popen(
                    [sys.executable, "-m", "rlprof.cli", "capture", str(run), "--next", "--wait", "60"],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            if cli is not None and cli.poll() is not None:
                break
    out, err = cli.communicate(timeout=120)
    assert cli.returncode == 0, err
    taken = [r for r in rows(run) if r.get("trigger")]
    assert sorted(r["stage"] for r in taken) == ["actor_compute_log_prob", "actor_update", "rollout_generate"]
    listed = [line for line in out.splitlines() if line.startswith("  rank ")]
    named = [line.strip() for line in out.splitlines() if line.startswith("    ")]
    assert all(any(r["path"] in line for r in taken) for line in listed)  # only the capture's windows
    if "still being written" in out:
        assert len(listed) < len(taken) and named, out
    else:
        assert len(listed) == len(taken), out  # the whole capture


# ---- rlprof's trainer ---------------------------------------------------------------------------------------------
def only_run(path):
    runs = [p for p in path.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


# The live slow tests' line: 100 ms over the baseline, clear of what a host loaded beside the run does to these
# 25-ms stages (with a core kept busy, a control's actor_update once took 52 ms against 25, its time on a core
# doubled with its workload the same), and well below the 0.5 s the tests inject; the control holds the same line.
CLEAR_OF_NOISE = f"{T}.slow.min_seconds=0.1"


def train_args(tmp_path, steps, *extra):
    return [
        "trainer.steps=%d" % steps,
        f"trainer.output_dir={tmp_path}/train",
        "global_profiler.tool=torch",
        f"global_profiler.save_path={tmp_path}/p",
        f"{A}.enable=true",
        "data.prompts_per_step=2",
        "rollout.n=2",
        "actor.mini_batch_size=2",
        "actor.micro_batch_size=2",
        "rollout.max_new_tokens=4",
        *extra,
    ]


@pytest.mark.slow
@pytest.mark.timing
def test_trainer_slowed_from_an_untold_step_is_captured_right_after_the_onset(tmp_path):
    proc = run_cli(
        "train",
        *train_args(
            tmp_path,
            22,
            f"{T}.slow.factor=2.0",
            CLEAR_OF_NOISE,
            "trainer.debug.inject_slowdown.from_step=14",
            "trainer.debug.inject_slowdown.stage=actor_update",
            "trainer.debug.inject_slowdown.seconds=0.5",
        ),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = only_run(tmp_path / "p")
    assert f"run directory {d}" in proc.stdout
    expected = trigger_steps(14, unjudged_steps(d), 22)
    captured = [r for r in rows(d) if r.get("trigger")]
    assert bool(captured) == bool(expected), (expected, timeline_said(d))
    if not expected:
        return
    judged = captured[0]["trigger"]["step"]
    first = [r for r in captured if r["trigger"]["step"] == judged]
    assert judged in expected and {r["step"] for r in first} == {judged + 1}
    assert all(r["trigger"]["reason"] == "slow" and r["trigger"]["stage"] == "actor_update" for r in captured)
    assert captured[0]["stage"] == "e2e"  # the actor's tool config is end-to-end: the step is captured


@pytest.mark.slow
@pytest.mark.timing
def test_control_run_of_30_steps_with_a_core_kept_busy_captures_nothing(tmp_path):
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        proc = run_cli(
            "train",
            *train_args(tmp_path, 30, f"{T}.slow.factor=2.0", CLEAR_OF_NOISE, f"{T}.straggler.factor=1.5"),
            cwd=tmp_path,
        )
    finally:
        burner.kill()
        burner.wait()
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = only_run(tmp_path / "p")
    captured = [r["trigger"] for r in rows(d) if r.get("trigger")]
    assert captured == [], (captured, timeline_said(d))
    assert len(read_rank(d / "timeline" / "rank0.bin")) == 30


def torchrun(tmp_path, *args, **popen):
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
        *args,
    ]
    if popen:  # its output to files: a pipe nobody reads fills (~2 KB a step) and stops the job at its next print
        out, err = (open(tmp_path / name, "w") for name in ("job.out", "job.err"))
        with out, err:
            return subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=out, stderr=err, text=True)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=400, cwd=tmp_path)


@pytest.mark.slow
@pytest.mark.timing
def test_straggler_on_two_ranks_captures_the_slow_and_a_healthy_rank_at_the_same_step(tmp_path):
    proc = torchrun(
        tmp_path,
        *train_args(
            tmp_path,
            12,
            f"{T}.straggler.factor=1.5",
            # the 0.4 s sleep stands clear of a loaded host's lags (a 23 ms stage once took 51 ms on one rank with a
            # core kept busy, its wait for a core 5 ms: no contention to explain it)
            f"{T}.straggler.min_seconds=0.15",
            "data.prompts_per_step=4",
            "trainer.debug.inject_slowdown.from_step=8",
            "trainer.debug.inject_slowdown.stage=reward_compute",
            "trainer.debug.inject_slowdown.seconds=0.4",
            "trainer.debug.inject_slowdown.rank=1",
        ),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = only_run(tmp_path / "p")
    busy = unjudged_steps(d, 0) | unjudged_steps(d, 1)
    captured = [r for r in rows(d) if r.get("trigger")]
    judged = first_judged(8, busy)
    seen = timeline_said(d, (0, 1))
    if judged >= 12:  # a loaded machine left no step to judge with a step after it to capture
        assert captured == [], (captured, seen)
        return
    # the actor's rank 0 is the healthy one, rank 1 the slow
    assert sorted(r["rank"] for r in captured) == [0, 1], ([r["trigger"] for r in captured], seen)
    assert len({r["step"] for r in captured}) == 1
    t = captured[0]["trigger"]
    assert t["reason"] == "straggler" and t["rank"] == 1 and t["stage"] == "reward_compute", (t, seen)
    assert captured[0]["step"] == judged + 1, seen
    assert [r["trigger"] for r in captured][0] == [r["trigger"] for r in captured][1]
    assert [rank for rank, _ in timeline_ranks(d)] == [0, 1]
    from rlprof.analyze.over_time.timeline import analyze_timeline

    over_time = analyze_timeline(d)
    assert any(s["rank"] == 1 and s["stage"] == "reward_compute" for s in over_time["stragglers"])
    assert not any(s["rank"] == 0 and s["stage"] == "reward_compute" for s in over_time["stragglers"])
    from rlprof.analyze.pipeline import analyze

    (item,) = analyze(d, workers=1)["timeline"]["beside"]  # the slow rank's window beside the healthy rank's
    assert (item["rank"], item["stage"], item["why"]) == (1, "reward_compute", "rank 0 at the same step")
    causes = {c["cause"]: c for c in item["cause"]["causes"]}
    assert item["cause"]["verdict"] == "cause" and item["cause"]["causes"][0]["cause"] == "slow_rank"
    slow = causes["slow_rank"]
    assert slow["rank"] == 1 and slow["levers"]["verl"][0]["key"] == "trainer.balance_batch"
    # rank 1 keeping pace saves at most its excess in the stage (the 0.4 s sleep), and something
    assert 0 < slow["saving_ms"] <= item["buckets"]["wall_ms"]["captured_ms"]
    assert "slow_reward" in causes  # the sleep was in the reward, on rank 1 alone


def _rank_pid(launcher: subprocess.Popen, rank: int) -> int | None:
    """The pid of torchrun's worker of local rank `rank` (a child of the launcher carrying LOCAL_RANK)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                here = f"LOCAL_RANK={rank}".encode() in f.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if parent == launcher.pid and here:
            return int(entry.name)
    return None


def _stop_from_outside(launcher, save_path, after_step: int, rank: int, stop_s=0.030, every_s=0.040) -> dict:
    """Once rank 0's timeline under `save_path` holds `after_step` records (that step ended), SIGSTOP torchrun's
    worker `rank` for `stop_s` in every `every_s` until the launcher ends. Returns a dict that gets `from_step`: the
    step running when the stopping began."""
    import signal
    import threading

    from rlprof.analyze.inputs.timeline_file import DTYPE

    began: dict = {}

    def records() -> int:
        found = list(save_path.glob("*/timeline/rank0.bin")) if save_path.is_dir() else []
        return found[0].stat().st_size // DTYPE.itemsize if found else 0

    def run():
        while launcher.poll() is None and records() < after_step:
            time.sleep(0.002)
        pid = _rank_pid(launcher, rank)
        began["from_step"] = records() + 1
        while pid is not None and launcher.poll() is None:
            try:
                os.kill(pid, signal.SIGSTOP)
                time.sleep(stop_s)
                os.kill(pid, signal.SIGCONT)
                time.sleep(every_s - stop_s)
            except ProcessLookupError:
                break

    threading.Thread(target=run, daemon=True).start()
    return began


@pytest.mark.slow
@pytest.mark.timing
def test_a_straggler_stopped_from_outside_on_a_busy_host_is_captured_naming_its_rank(tmp_path):
    """Both cores kept busy by two other processes, and once step 12 has ended rank 1 of 2 is stopped 30 ms in every
    40 from outside: its steps are busy ones, judged all the same, and the straggler is captured as soon as on a
    quiet host (by the second step after the onset), on both ranks, naming rank 1 and why: held off its cores (a
    stopped process waits for no core: not contention), with how long. The two ranks wait for each other inside every
    stage, so their stage times are alike (a loaded CI host once hid the stop that way for a whole run); the clock
    each rank keeps of its time held off its cores says whom the other waited for. A straggler the machine's
    contention explained is said in one line and flagged, never captured. The run is tried twice, and each try says
    what the watch saw and how many steps after the onset it was caught."""
    tries = []
    for k in range(2):
        work = tmp_path / f"try{k}"
        work.mkdir()
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
        try:
            job = torchrun(
                work,
                *train_args(
                    work,
                    18,
                    f"{T}.straggler.factor=1.5",
                    f"{T}.straggler.min_seconds=0.05",  # a 50 ms lag: more than a loaded host's hiccup, less than the stop's
                    f"{T}.cooldown=0",
                    "data.prompts_per_step=8",
                    "rollout.max_new_tokens=24",
                    "rollout.ignore_eos=true",
                    f"{A}.all_ranks=true",
                ),
                popen=True,
            )
            began = _stop_from_outside(job, work / "p", 12, rank=1)
            job.wait(timeout=400)
            err = (work / "job.err").read_text()
        finally:
            for hog in hogs:
                hog.kill()
                hog.wait()
        assert job.returncode == 0, err[-3000:]
        d = only_run(work / "p")
        captured = [r for r in rows(d) if r.get("trigger")]
        triggers = sorted({json.dumps({"at": r["step"], **r["trigger"]}, sort_keys=True) for r in captured})
        tries.append(
            f"try {k}: stopped from step {began.get('from_step')}; captures {triggers}; timeline:\n"
            + timeline_said(d, (0, 1))
        )
        late = [
            r["trigger"]["step"] - began["from_step"] for r in captured if r["trigger"]["step"] >= began["from_step"]
        ]
        tries[-1] += f"\ncaught {min(late)} step(s) after the onset" if late else "\nnot caught after the onset"
        if late and min(late) <= 2:
            break
    seen = "\n".join(tries)
    onset = began["from_step"]
    said = [line for line in err.splitlines() if "contention, not the job" in line]
    assert len(said) <= 1, said
    # before the onset the two busy loops' contention is judged too (captured only where a rank lagged by more than
    # its wait for a core explains: a loaded host's rare hiccup); from the onset on, the stopped rank
    first = min((r["trigger"]["step"] for r in captured if r["trigger"]["step"] >= onset), default=None)
    assert first is not None and first <= onset + 2, seen  # as soon as on a quiet host: by step 15 for 13
    taken = [r for r in captured if r["trigger"]["step"] == first]
    t = taken[0]["trigger"]
    assert (t["reason"], t["rank"], t.get("cause")) == ("straggler", 1, "held_off"), (t, seen)
    # held 30 ms in every 40: its hold beyond rank 0's is half its excess in the stage or more
    extra = t["evidence"]["extra_held_ms"]
    assert t["evidence"]["rank"] == 1 and extra >= 500 * (t["seconds"] - t["baseline_seconds"]), (t, seen)
    said_by_analysis = run_cli("analyze", d, "--workers", "1").stdout  # the capture says why, in the run over time
    assert f"step {first}: the straggler step the trigger saw" in said_by_analysis, said_by_analysis[-3000:]
    assert f"rank 1 was held off its cores {extra:.0f} ms longer than the other ranks" in said_by_analysis
    assert sorted(r["rank"] for r in taken) == [0, 1] and {r["step"] for r in taken} == {first + 1}, seen
    contended = {
        int(r["step"]) for k in (0, 1) for r in read_rank(d / "timeline" / f"rank{k}.bin") if r["flags"] & CONTENTION
    }
    assert not contended & {r["trigger"]["step"] for r in captured}, seen  # a step contention explained: no capture


@pytest.mark.slow
def test_capture_on_request_from_a_running_two_rank_trainer(tmp_path):
    job = torchrun(
        tmp_path,
        *train_args(
            tmp_path,
            200,
            f"{T}.request=true",
            "data.prompts_per_step=4",
            f"{A}.all_ranks=true",
            f"{A}.tool_config.torch.discrete=true",
        ),
        popen=True,
    )
    try:
        deadline = time.monotonic() + 240
        live = None
        while time.monotonic() < deadline and live is None:
            live = (
                next((p for p in (tmp_path / "p").glob("*/rlprof_live.json")), None)
                if (tmp_path / "p").exists()
                else None
            )
            time.sleep(0.5)
        assert live is not None, "the job never wrote its heartbeat"
        run = live.parent
        for bad, why in [
            (["--stage", "actor_updat"], "--stage"),
            (["--role", "ref", "--stage", "actor_update"], "--stage actor_update is a stage of role actor"),
            (["--step", "1"], "has passed"),
            (["--ranks", "5"], "--ranks 5"),
            (["--next", "--step", "300"], "exclusive"),
        ]:
            proc = run_cli("capture", run, *bad, "--wait", "5")
            assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and why in proc.stderr, (bad, proc.stderr)
        proc = run_cli("capture", tmp_path / "nowhere", "--next")
        assert proc.returncode == 2 and "not a directory" in proc.stderr
        at_ask = json.loads(live.read_text())["step"]
        proc = run_cli("capture", run, "--next", "--role", "actor", "--stage", "actor_update", "--wait", "120")
        assert proc.returncode == 0, proc.stderr
        assert (
            "captured step" in proc.stdout
            and "rank 0 actor/actor_update" in proc.stdout
            and "rank 1 actor/actor_update" in proc.stdout
        ), proc.stdout
        taken = [r for r in rows(run) if r.get("trigger")]
        assert sorted((r["rank"], r["stage"]) for r in taken) == [(0, "actor_update"), (1, "actor_update")]
        assert {r["trigger"]["reason"] for r in taken} == {"request"} and len({r["step"] for r in taken}) == 1
        step = taken[0]["step"]
        # the next step after the step end at which rank 0 read the request (and relayed it to rank 1)
        assert step > at_ask and all(r["trigger"]["step"] == step - 1 for r in taken)
        assert f"captured step {step} " in proc.stdout
    finally:
        job.terminate()
        job.wait(timeout=60)


def test_the_capture_is_put_beside_the_baseline_window_in_analysis_and_report(tmp_path):
    from rlprof.analyze.pipeline import analyze
    from rlprof.report.over_time import captures_beside
    from rlprof.report.page import build_page

    prof = Profiler(plan(tmp_path, f"{T}.request=true", f"{T}.baseline=true"), run_id="run")
    from rlprof.collect.request import submit

    submit(prof.watch_dir, step=8, role="actor", stage="actor_update", ranks=None)
    d = host(prof, 9, slow_from=8)  # the request takes step 8, the first slow one
    reasons = sorted((r["step"], r["stage"], r["trigger"]["reason"]) for r in rows(d))
    assert (4, "actor_update", "baseline") in reasons and (8, "actor_update", "request") in reasons
    doc = analyze(d, workers=1)
    assert doc["timeline"]["captured_steps"] == [4, 8]
    beside = [b for b in captures_beside(doc) if b["capture"].startswith("step8_")]
    assert len(beside) == 1 and beside[0]["normal"].startswith("step4_actor_actor_update")
    wall = beside[0]["buckets"]["wall_ms"]
    assert wall["captured_ms"] > wall["normal_ms"] + 100  # the 150 ms sleep is what grew
    page = build_page(doc, "run")
    assert "The run over time" in page and "chart-over_time" in page and "beside step4_actor_actor_update" in page


def test_a_one_off_spike_is_said_step_by_step_and_its_captured_step_ordinary(tmp_path, capsys):
    """One update 0.3 s slow at step 10, the rest 0.01 s, a baseline window at step 4: the trigger sees step 10 and
    captures step 11, an ordinary step. The capture is said step by step, each line naming its step: step 10 the
    spike the trigger saw, step 11 captured and ordinary (its window no slower than the normal one, against the
    spike's 30x: `repeat`, on the normal window), then its window beside the normal one."""
    from rlprof.analyze.pipeline import analyze
    from rlprof.report.terminal import print_analysis

    prof = Profiler(plan(tmp_path, f"{T}.slow.factor=2.0", f"{T}.baseline=true"), run_id="run")
    d = updates(prof, 13, {10: 0.3})
    judged = trigger_steps(10, unjudged_steps(d), 10)  # a one-off: only step 10 itself can be seen slow
    taken = [r for r in rows(d) if r.get("trigger") and r["trigger"]["reason"] == "slow"]
    assert bool(taken) == bool(judged), (judged, taken)
    if not judged:
        return  # a loaded machine left step 10 unjudged
    doc = analyze(d, workers=1)
    (item,) = [b for b in doc["timeline"]["beside"] if b["reason"] == "slow"]
    t = taken[0]["trigger"]
    repeat = item["repeat"]
    assert (repeat["spike_step"], repeat["captured_step"], repeat["basis"]) == (10, 11, "normal_window")
    assert repeat["spike_ratio"] == pytest.approx(t["seconds"] / t["baseline_seconds"])
    wall = item["buckets"]["wall_ms"]
    assert repeat["captured_ratio"] == pytest.approx(wall["captured_ms"] / wall["normal_ms"])
    assert repeat["repeated"] is (repeat["captured_ratio"] - 1 >= 0.5 * (repeat["spike_ratio"] - 1)) is False
    print_analysis(doc)
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
    at = [k for k, line in enumerate(lines) if line.startswith(("step 10: the slow step", "step 11: captured"))]
    assert len(at) == 2 and at[1] == at[0] + 1  # the spike's step, then the captured step
    assert "actor_update" in lines[at[0]] and "an ordinary step: the spike of step 10 did not repeat" in lines[at[1]]
    assert lines[at[1] + 1].startswith("step 11's window (actor_update) beside step4_")


# ---- the cause of a captured slow step ------------------------------------------------------------------------------
FOUR_STAGES = ("rollout_generate", "reward_compute", "actor_compute_log_prob", "actor_update")


def slowed_host(tmp_path, slow_stage, normal_s, slow_from=10, extra=0.2, steps=15):
    """The four stages of a step sleeping `normal_s` seconds each (a dict), `extra` more in `slow_stage` from
    `slow_from`; the whole step captured (end-to-end windows): the baseline after the warm-up, and the slow step."""
    prof = Profiler(plan(tmp_path, f"{T}.slow.factor=2.0", f"{T}.baseline=true", discrete=False), run_id="run")
    with prof:
        for n in range(1, steps + 1):
            with prof.step(n):
                for stage in FOUR_STAGES:
                    with prof.stage(stage):
                        time.sleep(normal_s[stage] + (extra if n >= slow_from and stage == slow_stage else 0))
    d = prof.watch_dir
    slow = [r for r in rows(d) if r.get("trigger") and r["trigger"]["reason"] == "slow"]
    return d, slow, bool(trigger_steps(slow_from, unjudged_steps(d), steps))


def the_beside(doc, captured_row):
    (item,) = [b for b in doc["timeline"]["beside"] if b["capture"] == captured_row["path"]]
    assert item["normal"].startswith("step4_") and item["stage"] == captured_row["trigger"]["stage"]
    return item


@pytest.mark.timing
def test_a_slowed_reward_captured_mid_run_is_named_with_its_lever_and_a_saving(tmp_path):
    d, slow, expected = slowed_host(
        tmp_path, "reward_compute", {s: 0.002 if s == "reward_compute" else 0.02 for s in FOUR_STAGES}
    )
    assert bool(slow) == expected, timeline_said(d)
    if not slow:
        return  # a loaded machine left no step judged after the onset
    proc = run_cli("analyze", d, "-o", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "out" / "analysis.json").read_text())
    item = the_beside(doc, slow[0])
    assert item["stage"] == "reward_compute" and item["reason"] == "slow"
    cause = item["cause"]
    assert cause["verdict"] == "cause" and [c["cause"] for c in cause["causes"]] == ["slow_reward"]
    (reward,) = cause["causes"]
    normal = {r["stage"]: r["wall_ms"] for r in doc["rows"] if r["file"] == item["normal"] and r["unit"] is None}
    # 2 of 62 ms in the normal step: no cause there, unless a loaded machine stretched its reward's sleep
    share = normal["reward_compute"] / sum(normal.values())
    assert reward["how"] == ("new" if share < 0.15 else "grew") and reward["stage"] == "reward_compute"
    assert reward["levers"]["verl"][0]["key"] == "reward.num_workers"  # a loop of its own writes no run config
    assert reward["levers"]["rlprof"][0]["key"] == "reward.workers"
    wall = item["buckets"]["wall_ms"]
    assert wall["captured_ms"] - wall["normal_ms"] > 150  # the 200 ms sleep is what grew
    saving = reward["saving"]
    assert saving["status"] == "predicted" and saving["dialect"] == "verl" and saving["setting"]["workers"] > 1
    assert 0 < saving["saving_ms"] <= wall["captured_ms"]  # less reward time, never more than the reward took
    assert "slow_reward lever (verl): raise reward.num_workers" in proc.stdout
    assert "predicted saving" in proc.stdout
    from rlprof.report.page import build_page

    page = build_page(doc, "run")
    assert "slow_reward" in page and "raise reward.num_workers" in page and "predicted saving" in page


def test_a_captured_window_without_a_known_cause_says_so(tmp_path):
    d, slow, expected = slowed_host(
        tmp_path, "actor_update", {s: 0.002 if s == "reward_compute" else 0.02 for s in FOUR_STAGES}
    )
    assert bool(slow) == expected, timeline_said(d)
    if not slow:
        return
    from rlprof.analyze.pipeline import analyze

    doc = analyze(d, workers=1)
    item = the_beside(doc, slow[0])
    assert item["stage"] == "actor_update" and item["buckets"]["wall_ms"]["captured_ms"] > 150
    cause = item["cause"]
    assert (cause["verdict"], cause["causes"], cause["in_both"]) == ("none", [], [])  # a sleep: no cause known
    assert "no cause rlprof names in the captured window" in cause["text"]


def test_a_cause_the_normal_window_has_too_is_not_why_the_step_was_slow(tmp_path, capsys):
    # the reward holds the step in every step (a cause of the run's own); the update is what slowed
    d, slow, expected = slowed_host(
        tmp_path, "actor_update", {s: 0.08 if s == "reward_compute" else 0.02 for s in FOUR_STAGES}
    )
    assert bool(slow) == expected, timeline_said(d)
    if not slow:
        return
    from rlprof.analyze.pipeline import analyze
    from rlprof.report.terminal import print_analysis

    doc = analyze(d, workers=1)
    cause = the_beside(doc, slow[0])["cause"]
    assert cause["verdict"] == "in_both" and cause["causes"] == []
    assert [c["cause"] for c in cause["in_both"]] == ["slow_reward"]
    assert "not why this step was slow" in cause["text"]
    print_analysis(doc)
    assert "cause: no cause of this slow step" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.timing
def test_trainer_with_a_reward_slowed_mid_run_names_slow_reward_and_its_lever(tmp_path):
    proc = run_cli(
        "train",
        *train_args(
            tmp_path,
            16,
            f"{T}.slow.factor=2.0",
            CLEAR_OF_NOISE,
            f"{T}.baseline=true",
            "trainer.debug.inject_slowdown.from_step=10",
            "trainer.debug.inject_slowdown.stage=reward_compute",
            "trainer.debug.inject_slowdown.seconds=0.5",
        ),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = only_run(tmp_path / "p")
    slow = [r for r in rows(d) if r.get("trigger") and r["trigger"]["reason"] == "slow"]
    assert bool(slow) == bool(trigger_steps(10, unjudged_steps(d), 16)), timeline_said(d)
    if not slow:
        return
    assert "slow_reward" in proc.stdout  # the first screen says the cause of the captured step
    from rlprof.analyze.pipeline import analyze

    doc = analyze(d, workers=1)
    item = the_beside(doc, slow[0])
    (reward,) = [c for c in item["cause"]["causes"] if c["cause"] == "slow_reward"]
    assert reward["how"] in ("new", "grew")  # the trainer's reward may hold the step a little already
    assert reward["levers"]["rlprof"][0]["key"] == "reward.workers" and reward["saving"]["dialect"] == "rlprof"
    assert reward["saving"]["setting"]["workers"] > 1
    assert 0 < reward["saving_ms"] <= item["buckets"]["wall_ms"]["captured_ms"]


@pytest.mark.slow
def test_async_rollout_replicas_follow_the_drivers_decision(tmp_path):
    R = "actor_rollout_ref.rollout.profiler"
    proc = run_cli(
        "train",
        *train_args(
            tmp_path,
            14,
            "rollout.mode=async",
            "rollout.replicas=2",
            f"{R}.tool_config.torch.discrete=true",
            f"{R}.ranks=[1]",
            f"{T}.slow.factor=2.0",
            "trainer.debug.inject_slowdown.from_step=9",
            "trainer.debug.inject_slowdown.stage=rollout_generate",
            "trainer.debug.inject_slowdown.seconds=0.5",
        ),
        cwd=tmp_path,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = only_run(tmp_path / "p")
    expected = trigger_steps(9, unjudged_steps(d), 14)
    captured = [r for r in rows(d) if r.get("trigger")]
    assert bool(captured) == bool(expected), (expected, unjudged_steps(d))
    if not expected:
        return
    first = captured[0]
    assert first["trigger"]["step"] in expected and first["trigger"]["stage"] == "rollout_generate"
    # the driver's trigger decided; replica 1 (the rollout's selected replica) took the next step's rollout
    assert (first["role"], first["stage"], first["replica"], first["step"]) == (
        "rollout",
        "rollout_generate",
        1,
        first["trigger"]["step"] + 1,
    )
    assert [rank for rank, _ in timeline_ranks(d)] == [0]  # the driver keeps the timeline; replicas follow


def test_a_cause_found_in_several_stages_of_a_captured_window_is_said_once():
    """A launch-bound device in three stages of the captured step (a GPU step's whole window) is one cause with its
    three stages inside, not three causes in a row; the stages its impact grew in are its evidence."""
    from conftest import window_doc, window_row
    from rlprof.analyze.diagnosis.capture_cause import judge

    def window(bound_share):
        return window_doc(
            [
                window_row(
                    stage,
                    role,
                    100.0,
                    device_gap_ms=100.0 * bound_share,
                    launch_bound_ms=100.0 * bound_share,
                    launch_unlinked_ms=0.0,
                )
                for stage, role in (
                    ("rollout_generate", "rollout"),
                    ("actor_compute_log_prob", "actor"),
                    ("actor_update", "actor"),
                )
            ]
        )

    verdict = judge(window(0.9), window(0.05), wall_growth_ms=250.0)
    (cause,) = verdict["causes"]
    assert cause["cause"] == "launch_bound" and cause["how"] == "new" and cause["impact_ms"] == pytest.approx(270.0)
    assert verdict["text"].count("launch-bound") == 1
    assert {lv["key"] for lv in cause["levers"]["rlprof"]} >= {"rollout.engine", "actor.micro_batch_size"}


# ---- contention: the rule on the matrix every rank sees (collect/trigger.py) ----------------------------------------
def _row(step_s, stage_s, busy=False, waits=None, others=0.0, cpus=None, held=None):
    """One rank's vector at a step end: its step and `stage_s` (stage -> seconds), busy flag, its wait for a core in
    each stage (`waits`: stage -> ms; 0 elsewhere) and its time on one (`cpus`: stage -> ms; the rest of the stage
    where not given: CPU-bound), the step's their sums, others' share of the host, and its time held off its cores
    in each stage (`held`: stage -> ms; 0 elsewhere)."""
    import numpy as np

    from rlprof.collect.trigger import BUSY_COL, BUSY_MACHINE, CPU_COL, OTHERS_COL, STAGE_CPUS, STAGE_WAITS, STARTS
    from rlprof.collect.trigger import HELD_COLS, WAIT_COL, WIDTH
    from rlprof.vocab import STAGES

    waits, cpus = waits or {}, dict(cpus or {})
    row = np.full(WIDTH, np.nan)
    row[0] = step_s
    for name, seconds in stage_s.items():
        at = STAGES.index(name)
        cpus.setdefault(name, seconds * 1e3 - waits.get(name, 0.0))
        row[1 + at], row[STARTS + at] = seconds, at * 0.01
        row[STAGE_WAITS + at], row[STAGE_CPUS + at] = waits.get(name, 0.0), cpus[name]
    row[BUSY_COL] = BUSY_MACHINE if busy else 0
    row[WAIT_COL], row[CPU_COL] = sum(waits.values()), sum(cpus.values())
    row[OTHERS_COL] = others
    row[OTHERS_COL + 1 :] = 0.0  # no request, no hold
    for name, ms in (held or {}).items():
        row[HELD_COLS + STAGES.index(name)] = ms
    return row


def _trigger(**rules):
    from rlprof.collect.trigger import Trigger
    from rlprof.config.plan import SlowRule, TriggerPlan

    plan = TriggerPlan(**{k: SlowRule(factor=v) for k, v in rules.items()}, cooldown=0, max_captures=10)
    return Trigger(plan, ("actor",))


def _steps(trigger, rows_per_step: dict):
    """Decide each step in order: {step: [row per rank]} -> {step: Decision}."""
    import numpy as np

    return {n: trigger.decide(n, np.asarray(rows)) for n, rows in sorted(rows_per_step.items())}


def test_ranks_on_a_busy_host_are_still_compared_and_the_one_slower_beyond_the_load_straggles():
    """Both ranks busy alike (the same wait for a core in the reward): rank 1's reward twice rank 0's is a straggler
    at the step it first shows, captured beside a healthy rank, with no contention said (the load is on both)."""
    calm = {n: [_row(0.1, {"reward_compute": 0.05})] * 2 for n in range(1, 5)}
    busy = {
        n: [
            _row(0.2, {"reward_compute": 0.1}, busy=True, waits={"reward_compute": 40}, others=0.9),
            _row(0.3, {"reward_compute": 0.2 if n >= 6 else 0.1}, busy=True, waits={"reward_compute": 40}, others=0.9),
        ]
        for n in range(5, 9)
    }
    decided = _steps(_trigger(straggler=1.5), {**calm, **busy})
    armed = {n: d.armed for n, d in decided.items() if d.armed}
    assert list(armed) == [6], armed  # judged though busy: captured at the next step
    (cap,) = armed[6]
    assert cap.at_step == 7 and cap.extra_ranks == (1, 0)
    assert cap.trigger["reason"] == "straggler" and cap.trigger["rank"] == 1 and "cause" not in cap.trigger


def test_a_straggler_its_own_wait_for_a_core_explains_is_recorded_with_contention_and_the_evidence():
    """Rank 1 waited 275 ms more for a core than rank 0 in the reward it lagged in by 300 ms (a neighbour on its core):
    the contention's, said with the evidence, not captured (the budget stays for the job's own stragglers)."""
    rows = {n: [_row(0.1, {"reward_compute": 0.05})] * 2 for n in range(1, 5)}
    rows[5] = [
        _row(0.1, {"reward_compute": 0.05}, waits={"reward_compute": 5}),
        _row(0.4, {"reward_compute": 0.35}, busy=True, waits={"reward_compute": 280}, others=0.7),
    ]
    decided = _steps(_trigger(straggler=1.5), rows)[5]
    assert decided.armed == []
    t = decided.contention
    assert (t["reason"], t["rank"], t["cause"]) == ("straggler", 1, "contention")
    ev = t["evidence"]
    assert (ev["rank"], ev["run_wait_ms"], ev["others_share"], ev["ranks_busy"], ev["ranks"]) == (1, 280, 0.7, 1, 2)
    assert ev["expected_wait_ms"] == pytest.approx(70 * 5 / 45)  # its 70 ms on a core at rank 0's share (5 of 50)


def test_a_rank_stopped_from_outside_on_a_busy_host_is_no_contention_though_its_step_waited_longer():
    """Rank 1 lost 300 ms stopped (not runnable: neither on a core nor waiting for one) and, when it ran, waited for a
    core in the rollout at the share rank 0 did (both busy alike); its step waited more (rank 0 slept in collectives
    meanwhile), but not in the stage it lagged in: its excess is the job's straggler, captured."""
    rows = {n: [_row(0.1, {"rollout_generate": 0.05})] * 2 for n in range(1, 5)}
    ran = {"rollout_generate": 30, "actor_update": 40}
    rows[5] = [
        _row(0.45, {"rollout_generate": 0.05, "actor_update": 0.35}, busy=True, waits={"rollout_generate": 20}),
        _row(
            0.45,
            {"rollout_generate": 0.35, "actor_update": 0.05},
            busy=True,
            waits={"rollout_generate": 22, "actor_update": 10},
            cpus=ran,
        ),
    ]
    decided = _steps(_trigger(straggler=1.5), rows)[5]
    (cap,) = decided.armed
    t = cap.trigger
    assert (t["rank"], t["stage"]) == (1, "rollout_generate") and "cause" not in t and decided.contention is None


HELD_CHILD = """
import sys, time
from rlprof.collect.cpu_wait import HeldOffClock
clock = HeldOffClock().start()
t0 = time.monotonic()
print("ready", flush=True)
time.sleep(float(sys.argv[1]))
clock.stop()
print(clock.held_ns / 1e6, (time.monotonic() - t0) * 1e3, flush=True)
"""


def _held_child(seconds: float, stop: bool) -> tuple[float, float]:
    """A process whose main thread sleeps `seconds` beside its HeldOffClock, stopped from outside 30 ms in every 40
    meanwhile where `stop`: (held ms, wall ms) as it counted them."""
    import signal

    child = subprocess.Popen([sys.executable, "-c", HELD_CHILD, str(seconds)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    while stop and child.poll() is None:
        child.send_signal(signal.SIGSTOP)
        time.sleep(0.03)
        child.send_signal(signal.SIGCONT)
        time.sleep(0.01)
    held, wall = map(float, child.communicate(timeout=60)[0].split())
    return held, wall


def test_the_held_off_clock_counts_a_process_stopped_from_outside_and_not_one_that_sleeps():
    """Stopped 30 ms in every 40, a process is held off its cores most of the time, whatever else the host runs (its
    waits for a core are not counted); the same process left alone, its main thread asleep, is held for nothing."""
    held, wall = _held_child(1.5, stop=True)
    assert held >= 0.4 * wall, (held, wall)  # 75% stopped; a stop shorter than the clock's slack is not counted
    held, wall = _held_child(1.0, stop=False)
    assert held <= 0.05 * wall, (held, wall)


def test_the_rank_held_off_its_cores_is_the_straggler_though_every_ranks_stage_took_as_long():
    """Rank 1 stopped from outside 220 ms of a 300 ms rollout whose collectives made rank 0 wait as long: the stage
    times are alike, the hold says whom the others waited for. Captured as rank 1's straggle, `held_off`, with its
    stage time had it been held no longer than rank 0 as the baseline; a hold both ranks share (a busy host, an
    interpreter's lock) or one under the line is nothing; a lag the hold explains carries the same cause."""
    calm = {n: [_row(0.4, {"rollout_generate": 0.1})] * 2 for n in range(1, 5)}
    alike = {"rollout_generate": 0.3}
    held = {5: [_row(0.6, alike, held={"rollout_generate": 5}), _row(0.6, alike, held={"rollout_generate": 225})]}
    decided = _steps(_trigger(straggler=1.5), {**calm, **held})[5]
    (cap,) = decided.armed
    t = cap.trigger
    assert (t["reason"], t["rank"], t["stage"], t["cause"]) == ("straggler", 1, "rollout_generate", "held_off")
    assert t["seconds"] == 0.3 and t["baseline_seconds"] == pytest.approx(0.08)
    assert t["evidence"] == {"rank": 1, "held_ms": 225, "extra_held_ms": 220} and decided.contention is None
    assert cap.at_step == 6 and cap.extra_ranks == (1, 0)
    for quiet in ({"rollout_generate": 60}, {"rollout_generate": 60}), ({}, {"rollout_generate": 95}):
        # held alike on both; or 95 ms more in a 300 ms stage: under a third of it (factor 1.5)
        rows = {**calm, 5: [_row(0.6, alike, held=quiet[0]), _row(0.6, alike, held=quiet[1])]}
        assert _steps(_trigger(straggler=1.5), rows)[5].armed == [], quiet
    lag = {
        5: [_row(0.4, {"rollout_generate": 0.1}), _row(0.7, {"rollout_generate": 0.4}, held={"rollout_generate": 250})]
    }
    (cap,) = _steps(_trigger(straggler=1.5), {**calm, **lag})[5].armed
    assert (cap.trigger["rank"], cap.trigger["cause"], cap.trigger["baseline_seconds"]) == (1, "held_off", 0.1)


def test_a_slow_step_the_whole_machines_contention_explains_is_said_not_captured_and_no_baseline():
    one = lambda s, **k: [_row(s, {"actor_update": s}, **k)]  # noqa: E731
    rows = {n: one(0.1, waits={"actor_update": 1}) for n in range(1, 8)}
    rows[8] = one(0.4, busy=True, waits={"actor_update": 250}, others=0.8)  # 300 ms late, 249 more waiting
    rows[9] = one(0.1, waits={"actor_update": 1})
    trig = _trigger(slow=2.0)
    decided = _steps(trig, rows)
    assert not any(d.armed for d in decided.values())
    said = decided[8].contention
    assert said["reason"] == "slow" and said["cause"] == "contention" and said["stage"] == "actor_update"
    ev = said["evidence"]
    assert (ev["run_wait_ms"], ev["ranks_busy"], ev["ranks"]) == (250, 1, 1)
    assert ev["expected_wait_ms"] == pytest.approx(150 / 99)  # its 150 ms on a core at its usual share, 1 of 100
    assert max(row[7] for row in trig.history) < 0.2  # the contended step is not in the baseline


def test_a_slow_step_on_a_busy_machine_its_wait_does_not_explain_is_captured():
    """The job itself slowed (a 0.3 s excess) while the machine was busy and it waited 60 ms: the job's, captured."""
    one = lambda s, **k: [_row(s, {"actor_update": s}, **k)]  # noqa: E731
    rows = {n: one(0.1, waits={"actor_update": 1}) for n in range(1, 8)}
    rows[8] = one(0.4, busy=True, waits={"actor_update": 60}, others=0.8)
    decided = _steps(_trigger(slow=2.0), rows)
    (cap,) = decided[8].armed
    assert cap.trigger["reason"] == "slow" and "cause" not in cap.trigger and decided[8].contention is None


def test_the_waits_of_every_rank_a_synchronous_step_waits_for_add_up():
    """Two ranks, each slowed 100 ms in the update by its own wait for a core at a different moment (each holds the
    other at the next collective): the step's 200 ms excess is explained by their waits together."""
    calm = lambda: _row(0.1, {"actor_update": 0.1}, waits={"actor_update": 1})  # noqa: E731
    rows = {n: [calm(), calm()] for n in range(1, 8)}
    busy = lambda: _row(0.3, {"actor_update": 0.3}, busy=True, waits={"actor_update": 101}, others=0.6)  # noqa: E731
    rows[8] = [busy(), busy()]
    said = _steps(_trigger(slow=2.0), rows)[8].contention
    assert said is not None and said["evidence"]["run_wait_ms"] == 202


def test_a_job_doing_more_work_on_a_host_busy_alike_is_slow_not_contention():
    """The host busy throughout, the job waiting for a core a third of its ready time every step; from step 8 its
    update does 3x the work, and waits 3x as long, at the same share: the excess is the job's, captured."""
    one = lambda s, w: [_row(s, {"actor_update": s}, busy=True, waits={"actor_update": w}, others=0.5)]  # noqa: E731
    rows = {n: one(0.15, 50) for n in range(1, 8)}
    rows[8] = one(0.45, 150)
    decided = _steps(_trigger(slow=2.0), rows)[8]
    (cap,) = decided.armed
    assert cap.trigger["reason"] == "slow" and "cause" not in cap.trigger and decided.contention is None

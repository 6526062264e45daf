"""global_profiler.trigger in main_ppo's driver (integrations/verl/trigger.py), against a stand-in for verl's v1
PPOTrainer: its fit loop, step boundaries and profiling switch as verl 0.9.1 has them (trainer/ppo/v1/
trainer_base.py: fit, _start_profiling, _stop_profiling, curr/next/prev_step_profile, timing_raw, _compute_metrics
building the dict fit hands to Tracking.log). The step and
stage times are verl's timers' numbers, given here, so the rule's decisions are exact. The whole job (main_ppo on
CPU, verl's own workers and rollout replicas capturing) is tests/test_verl_job.py's."""

from __future__ import annotations

import gzip
import json
import logging
import time
import types

import pytest
from conftest import run_cli

omegaconf = pytest.importorskip("omegaconf")

from rlprof.analyze.inputs.timeline_file import CAPTURED, WARMUP, read_rank, timeline_ranks  # noqa: E402
from rlprof.collect.request import submit  # noqa: E402
from rlprof.integrations.verl import trigger as verl_trigger  # noqa: E402


class StandIn:
    """verl 0.9.1's PPOTrainer, its step loop and profiling switch only: `profiled` lists the steps verl would have
    started its workers' and replicas' profilers for, and each such step writes a trace file as a worker would."""

    def __init__(self, config, gen_seconds, on_step=None):
        self.config = config
        self.gen_seconds = gen_seconds
        self.on_step = on_step
        self.logged: dict[int, dict] = {}  # what verl's Tracking.log(data=metrics, step=...) was handed per step
        self.profiled: list[int] = []
        self.rollout_starts: list[dict] = []  # what the rollout replicas' start_profile was given

    def fit(self):
        steps = self.config.global_profiler.steps
        self.global_steps = 1
        self.prev_step_profile = False
        self.curr_step_profile = self.global_steps in steps if steps is not None else False
        while self.global_steps <= self.config.trainer.total_training_steps:
            self.timing_raw = {}
            self._start_profiling()
            if self.on_step:  # while the step runs
                self.on_step(self)
            self.timing_raw["gen"] = self.gen_seconds(self.global_steps)
            self.timing_raw["old_log_prob"] = 0.2
            self.timing_raw["update_actor"] = 0.5
            self._stop_profiling()
            self.timing_raw["update_weights"] = 0.1
            self.timing_raw["step"] = sum(self.timing_raw.values())
            metrics = {}
            self._compute_metrics(None, metrics, self.timing_raw, global_steps=self.global_steps, epoch=0)
            self.logged[self.global_steps] = metrics
            self.global_steps += 1

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        metrics["timing_s/step"] = timing_raw["step"]  # verl's own (of many), then the dict goes to Tracking.log

    def _start_profiling(self):
        if self.curr_step_profile:
            self.profiled.append(self.global_steps)
            self._start_rollout_profiling()

    def _rollout_server_managers(self):
        return [types.SimpleNamespace(start_profile=lambda **kwargs: self.rollout_starts.append(kwargs))]

    def _start_rollout_profiling(self):
        for manager in self._rollout_server_managers():
            manager.start_profile()

    def _stop_profiling(self):
        steps = self.config.global_profiler.steps
        this_step = self.curr_step_profile
        self.next_step_profile = self.global_steps + 1 in steps if steps is not None else False
        self.prev_step_profile, self.curr_step_profile = self.curr_step_profile, self.next_step_profile
        if this_step:  # a worker's trace, named as verl's torch profiler names it
            save = self.config.global_profiler.save_path
            name = f"actor-rollout_update-actor_step{self.global_steps}_rank0-of-1_pid1_2026112218574{self.global_steps:04d}"
            with gzip.open(f"{save}/{name}.json.gz", "wt") as f:
                json.dump({"traceEvents": []}, f)


@pytest.fixture
def trainer_class():
    module = types.ModuleType("stand_in_trainer_base")
    module.PPOTrainer = type("PPOTrainer", (StandIn,), {})
    verl_trigger.attach(module)
    return module.PPOTrainer


def config(save, trigger, steps=12, listed=None):
    return omegaconf.OmegaConf.create(
        {
            "global_profiler": {"tool": "torch", "steps": listed, "save_path": str(save), "trigger": trigger},
            "actor_rollout_ref": {
                "actor": {"profiler": {"enable": True, "ranks": [0], "tool_config": {"torch": {"discrete": True}}}}
            },
            "trainer": {"total_training_steps": steps, "n_gpus_per_node": 1, "nnodes": 1},
        }
    )


def run_dir_of(save):
    (d,) = [p for p in save.iterdir() if (p / "rlprof_live.json").exists()]
    return d


def manifest(run_dir):
    return [json.loads(line) for line in (run_dir / "manifest.jsonl").read_text().splitlines()]


SLOW = {"slow": {"factor": 2.0, "min_seconds": 0.5}, "warmup_steps": 1, "cooldown": 0, "max_captures": 1}


def test_the_driver_captures_the_step_after_the_slowdown_through_verls_own_switch(trainer_class, tmp_path):
    trainer = trainer_class(config(tmp_path, SLOW), lambda n: 4.0 if n >= 7 else 1.0)
    trainer.fit()
    assert trainer.profiled == [8]  # verl's switch, set for the step after the first slow one; none before it
    run_dir = run_dir_of(tmp_path)
    (row,) = manifest(run_dir)
    assert row["step"] == 8 and row["stage"] == "actor_update" and (run_dir / row["path"]).is_file()
    t = row["trigger"]
    assert (t["reason"], t["step"], t["stage"]) == ("slow", 7, "rollout_generate")
    assert t["seconds"] == pytest.approx(4.0) and t["baseline_seconds"] == pytest.approx(1.0)
    # every step in the timeline, with verl's timers' numbers under rlprof's stage names
    ((rank, path),) = timeline_ranks(run_dir)
    rec = read_rank(path)
    assert rec["step"].tolist() == list(range(1, 13))
    assert rec["step_s"][6] == pytest.approx(4.0 + 0.2 + 0.5 + 0.1)
    assert (rec["flags"] & CAPTURED != 0).tolist() == [s == 8 for s in range(1, 13)]
    assert (rec["flags"] & WARMUP != 0).tolist() == [s == 1 for s in range(1, 13)]
    assert json.loads((run_dir / "rlprof_live.json").read_text())["ended"] is True
    # rlprof analyze of the run directory: the captured window with its trigger row, and the run over time
    out = run_cli("analyze", run_dir, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [c["trigger"]["reason"] for c in doc["timeline"]["captures"]] == ["slow"]
    # the analysis sees the onset where the driver did: rollout slow from step 7 on, one level shift (not a spike a step)
    (shift,) = [s for s in doc["timeline"]["level_shifts"] if s["stage"] == "rollout_generate"]
    assert shift["from_step"] == 7 and shift["after_seconds"] == pytest.approx(4.0)
    assert not [s for s in doc["timeline"]["spikes"] if s["stage"] == "rollout_generate"]


@pytest.mark.parametrize("decode_window", [False, True])
def test_the_rollout_replicas_learn_the_step_and_why_where_rlprofs_vllm_plugin_holds_the_window(
    trainer_class, tmp_path, monkeypatch, decode_window
):
    """verl starts its replicas' profilers with no argument; where rlprof's vLLM plugin keeps a decode window
    (RLPROF_PLAN, handed over by the verl plugin), their start_profile names the step and the capture's cause in
    verl's own profile_prefix argument, which the plugin in vLLM's worker reads."""
    if decode_window:
        monkeypatch.setenv("RLPROF_PLAN", "global_profiler.tool=torch")
    else:
        monkeypatch.delenv("RLPROF_PLAN", raising=False)
    trainer = trainer_class(config(tmp_path, SLOW), lambda n: 4.0 if n >= 7 else 1.0)
    trainer.fit()
    assert trainer.profiled == [8]
    assert trainer.rollout_starts == (
        [{"profile_prefix": "step8.rlprof-slow-7-rollout_generate"}] if decode_window else [{}]
    )
    from rlprof.integrations.vllm.session import STEP_IN_PREFIX, TRIGGER_IN_PREFIX

    if decode_window:
        prefix = trainer.rollout_starts[0]["profile_prefix"]
        assert STEP_IN_PREFIX.search(prefix).group(1) == "8"
        assert TRIGGER_IN_PREFIX.search(prefix).groups() == ("slow", "7", "rollout_generate")


def test_without_a_trigger_verl_is_left_alone(trainer_class, tmp_path):
    cfg = config(tmp_path, None, listed=[3])
    del cfg.global_profiler["trigger"]
    trainer = trainer_class(cfg, lambda n: 4.0 if n >= 7 else 1.0)
    trainer.fit()
    assert trainer.profiled == [3] and trainer.rollout_starts == [{}]
    assert list(tmp_path.iterdir()) == [next(tmp_path.glob("actor-rollout_update-actor_step3_*"))]  # verl's own file


def test_a_steady_run_captures_nothing(trainer_class, tmp_path):
    trainer = trainer_class(config(tmp_path, SLOW), lambda n: 1.0 + 0.05 * (n % 3))
    trainer.fit()
    assert trainer.profiled == [] and not (run_dir_of(tmp_path) / "manifest.jsonl").exists()


def test_listed_steps_stay_verls_and_are_not_judged(trainer_class, tmp_path):
    trainer = trainer_class(config(tmp_path, SLOW, listed=[3]), lambda n: 9.0 if n == 3 else 1.0)
    trainer.fit()
    assert trainer.profiled == [3]  # its cost is the profiler's: no capture follows it
    assert not (run_dir_of(tmp_path) / "manifest.jsonl").exists()


def test_rlprof_capture_request_arms_the_next_step(trainer_class, tmp_path):
    asked = {}

    def ask(trainer):  # while step 4 runs, `rlprof capture --next` leaves its request
        if trainer.global_steps == 4:
            asked["id"] = submit(run_dir_of(tmp_path), step=None, role=None, stage=None, ranks=None)

    trainer = trainer_class(config(tmp_path, {"request": True}, steps=8), lambda n: 1.0, on_step=ask)
    trainer.fit()
    assert trainer.profiled == [5]  # read at the end of step 4
    run_dir = run_dir_of(tmp_path)
    answer = json.loads((run_dir / "capture" / f"{asked['id']}.json").read_text())
    assert answer["status"] == "captured" and answer["at_step"] == 5 and answer["ranks"] == [0]
    (row,) = manifest(run_dir)
    assert row["step"] == 5 and row["trigger"]["request_id"] == asked["id"]


def test_a_fault_in_the_hook_is_one_warning_and_training_goes_on(trainer_class, tmp_path, monkeypatch, caplog):
    def broken(self, *a):
        raise OSError("disk gone")

    monkeypatch.setattr("rlprof.collect.watch.Watch.write", broken)
    verl_trigger._said.clear()
    trainer = trainer_class(config(tmp_path, SLOW), lambda n: 4.0 if n >= 7 else 1.0)
    with caplog.at_level(logging.WARNING, logger="rlprof"):
        trainer.fit()
    assert trainer.global_steps == 13 and trainer.profiled == []
    warned = [r.getMessage() for r in caplog.records if "trigger failed" in r.getMessage()]
    assert len(warned) == 1 and "disk gone" in warned[0] and "main_ppo goes on" in warned[0]


def test_a_bad_trigger_value_is_one_warning_naming_the_key(trainer_class, tmp_path, caplog):
    verl_trigger._said.clear()
    trainer = trainer_class(config(tmp_path, {"slow": {"factor": 0.5}}), lambda n: 1.0)
    with caplog.at_level(logging.WARNING, logger="rlprof"):
        trainer.fit()
    assert trainer.global_steps == 13 and trainer.profiled == []
    (line,) = [r.getMessage() for r in caplog.records if "trigger" in r.getMessage()]
    assert "global_profiler.trigger.slow.factor" in line and "> 1" in line


def test_rlprof_capture_hears_of_every_file_of_the_capture_or_the_ones_still_being_written(trainer_class, tmp_path):
    """verl writes a captured step's traces from its workers, some after the step (a rollout's, a slow disk's): the
    driver's answer lists those it has indexed, names those it sees still being written, and says when it has them
    all (`settled`); `rlprof capture` answers for the whole capture from it (collect/request.py)."""
    from rlprof.collect.request import wait_answer

    asked, seen = {}, {}
    late = "actor-rollout_compute-log-prob_step5_rank0-of-1_pid1_20261122185740099.json.gz"

    def on_step(trainer):
        run_dir = run_dir_of(tmp_path)
        if trainer.global_steps == 4:
            asked["id"] = submit(run_dir, step=None, role=None, stage=None, ranks=None)
        if trainer.global_steps == 6:  # step 5's first trace is settled by now; its second one is being written
            time.sleep(0.6)
            with gzip.open(tmp_path / late, "wt") as f:
                json.dump({"traceEvents": []}, f)
        if trainer.global_steps == 7:  # step 6's boundary has indexed what it could
            seen["mid"] = wait_answer(run_dir, asked["id"], 0.0)

    trainer = trainer_class(config(tmp_path, {"request": True}, steps=8), lambda n: 1.0, on_step=on_step)
    trainer.fit()
    assert trainer.profiled == [5]
    mid = seen["mid"]
    assert mid.answer["status"] == "captured" and not mid.whole and mid.answer["settled"] is False
    assert [r["step"] for r in mid.rows] == [5] and [p.rsplit("/", 1)[-1] for p in mid.pending] == [late]
    end = wait_answer(run_dir_of(tmp_path), asked["id"], 0.0)  # the run ended: everything is indexed
    assert end.whole and end.answer["settled"] is True and not end.pending
    assert sorted(r["path"].rsplit("/", 1)[-1] for r in end.rows)[0] == late and len(end.rows) == 2


def test_each_steps_measures_join_the_metrics_verl_logs_for_it(trainer_class, tmp_path):
    """Where verl builds the metrics it logs (`_compute_metrics`), the step's rlprof/ numbers join them: its timeline
    record (written there, from verl's timers), the trigger's verdict, and at the captured step its cause."""
    save = tmp_path / "p"
    trainer = trainer_class(config(save, SLOW, steps=8), lambda n: 3.0 if n >= 6 else 1.0)
    trainer.fit()
    d = run_dir_of(save)
    (rec,) = [read_rank(p) for _, p in timeline_ranks(d)]
    assert sorted(trainer.logged) == [int(s) for s in rec["step"]] == list(range(1, 9))
    for row in rec:
        m = trainer.logged[int(row["step"])]
        assert m["rlprof/time/step/max_s"] == float(row["step_s"]) and "timing_s/step" in m  # verl's keys kept
        assert m["rlprof/time/rollout_generate/max_s"] == float(row["stage_s"][0])
        assert all(isinstance(v, float) for k, v in m.items() if k.startswith("rlprof/"))
    assert trainer.logged[1]["rlprof/trigger/not_judged/warmup"] == 1.0
    assert trainer.logged[6]["rlprof/trigger/found/slow"] == 1.0 and trainer.logged[5]["rlprof/trigger/judged"] == 1.0
    assert trainer.logged[7]["rlprof/capture/slow"] == 1.0 and trainer.logged[7]["rlprof/capture/seen_step"] == 6
    assert trainer.logged[7]["rlprof/capture/stage/rollout_generate"] == 1.0
    assert (
        trainer.logged[7]["rlprof/capture/seconds"] == 3.0
        and trainer.logged[7]["rlprof/capture/baseline_seconds"] == 1.0
    )
    assert trainer.logged[8]["rlprof/trigger/judged"] == 1.0  # the last step is judged too (no request read there)


def test_a_fault_joining_the_measures_is_one_warning_and_verl_logs_its_own(
    trainer_class, tmp_path, monkeypatch, caplog
):
    from rlprof.analyze.over_time import step_measures

    monkeypatch.setattr(step_measures.RunReader, "read", lambda self: 1 / 0)
    verl_trigger._said.clear()
    trainer = trainer_class(config(tmp_path / "p", SLOW, steps=4), lambda n: 1.0)
    with caplog.at_level(logging.WARNING, logger="rlprof"):
        trainer.fit()
    assert [m for m in trainer.logged.values()] == [
        {"timing_s/step": trainer.logged[n]["timing_s/step"]} for n in range(1, 5)
    ]
    said = [r.getMessage() for r in caplog.records if "could not join verl's metrics" in r.getMessage()]
    assert len(said) == 1 and "main_ppo goes on without them" in said[0]

"""The run over time's rules on timelines written in the watch's layout (analyze/inputs/timeline_file.py): a stage
that slows from one step on and stays slow is one level shift from that step, not a spike a step and a drift; a
lone spike stays a spike; a slow climb stays a drift; a spike at the new level is judged against the new level."""

import json

import numpy as np
import pytest

from rlprof.analyze.inputs.timeline_file import DTYPE, TIMELINE_DIR, columns, rank_file
from rlprof.analyze.over_time.timeline import SHIFT_STEPS, analyze_timeline
from rlprof.vocab import STAGES

REWARD = STAGES.index("reward_compute")
UPDATE = STAGES.index("actor_update")


def write_timeline(run_dir, reward_s, update_s=None, ranks=(0,), busy=(), wait_ms=None, others_share=0.6):
    """One record per step per rank: reward_compute and actor_update only, the step their sum; busy steps flagged,
    with each rank's wait for a core in the reward (ms, a list per step or a dict rank -> list; 0 where not given),
    the step's wait the same, its time on a core the rest of the step (a CPU-bound job)."""
    (run_dir / TIMELINE_DIR).mkdir(parents=True)
    (run_dir / TIMELINE_DIR / "columns.json").write_text(json.dumps(columns()))
    n = len(reward_s)
    update_s = update_s if update_s is not None else [0.05] * n
    for rank in ranks:
        rec = np.zeros(n, DTYPE)
        rec["step"] = np.arange(1, n + 1)
        rec["flags"] = [1 if s in busy else 2 if s == 1 else 0 for s in range(1, n + 1)]  # busy, warm-up
        rec["stage_s"] = np.nan
        rec["stage_start_s"] = np.nan
        rec["stage_s"][:, REWARD] = reward_s
        rec["stage_s"][:, UPDATE] = update_s
        rec["stage_start_s"][:, REWARD] = 0.0
        rec["stage_start_s"][:, UPDATE] = np.asarray(reward_s)
        rec["step_s"] = np.asarray(reward_s) + np.asarray(update_s)
        rec["start_unix_s"] = 1.7e9 + np.cumsum(rec["step_s"]) - rec["step_s"]
        waits = wait_ms.get(rank) if isinstance(wait_ms, dict) else wait_ms
        rec["run_wait_ms"] = waits if waits is not None else 0.0
        rec["cpu_ms"] = np.maximum(rec["step_s"] * 1e3 - rec["run_wait_ms"], 0.0)
        rec["stage_wait_ms"] = rec["stage_cpu_ms"] = np.nan
        rec["stage_wait_ms"][:, REWARD] = rec["run_wait_ms"]
        rec["stage_wait_ms"][:, UPDATE] = 0.0
        rec["stage_cpu_ms"][:, REWARD] = np.maximum(rec["stage_s"][:, REWARD] * 1e3 - rec["run_wait_ms"], 0.0)
        rec["stage_cpu_ms"][:, UPDATE] = rec["stage_s"][:, UPDATE] * 1e3
        rec["others_share"] = [others_share if s in busy else 0.0 for s in range(1, n + 1)]
        rec.tofile(rank_file(run_dir, rank))
    return run_dir


def jitter(n, level, seed=0):
    return (level * (1 + 0.04 * np.random.default_rng(seed).standard_normal(n))).astype(np.float32)


def test_a_stage_slowed_from_a_step_on_is_one_level_shift_not_a_spike_per_step(tmp_path):
    reward = jitter(30, 0.05)
    reward[11:] = jitter(19, 0.20, seed=1)  # from step 12 on, four times slower, and it stays
    doc = analyze_timeline(write_timeline(tmp_path, reward))
    (shift,) = [s for s in doc["level_shifts"] if s["stage"] == "reward_compute"]
    assert shift["from_step"] == 12 and shift["steps"] >= SHIFT_STEPS
    assert shift["before_seconds"] == pytest.approx(0.05, rel=0.1) and shift["after_seconds"] == pytest.approx(
        0.2, rel=0.1
    )
    assert not [s for s in doc["spikes"] if s["stage"] == "reward_compute"]  # was 11 spikes
    assert not [d for d in doc["drift"] if d["stage"] == "reward_compute"]  # and a drift
    # the step's own time shifts with it: one record for it too; the update is untouched
    assert [s["from_step"] for s in doc["level_shifts"] if s["stage"] == "step"] == [12]
    assert not [s for s in doc["level_shifts"] if s["stage"] == "actor_update"]


def test_lone_spikes_stay_spikes_and_a_steady_run_has_neither(tmp_path):
    reward = jitter(30, 0.05)
    reward[[9, 19]] = 0.3  # two separate slow steps
    doc = analyze_timeline(write_timeline(tmp_path / "spiky", reward))
    assert [s["step"] for s in doc["spikes"] if s["stage"] == "reward_compute"] == [10, 20]
    assert doc["level_shifts"] == []
    quiet = analyze_timeline(write_timeline(tmp_path / "quiet", jitter(30, 0.05)))
    assert (quiet["level_shifts"], quiet["spikes"], quiet["drift"]) == ([], [], [])


def test_a_slow_climb_is_a_drift_not_a_level_shift(tmp_path):
    reward = (np.linspace(0.05, 0.12, 40) * (1 + 0.02 * np.random.default_rng(2).standard_normal(40))).astype(
        np.float32
    )
    doc = analyze_timeline(write_timeline(tmp_path, reward))
    assert "reward_compute" in [d["stage"] for d in doc["drift"]]
    assert not [s for s in doc["level_shifts"] if s["stage"] == "reward_compute"]


def test_a_spike_at_the_new_level_is_judged_against_it(tmp_path):
    reward = jitter(40, 0.05)
    reward[9:] = jitter(31, 0.20, seed=3)  # the shift at step 10
    reward[29] = 0.9  # then a spike over the new level at step 30
    reward[34] = 0.3  # 1.5x the new level: not a spike there (it would be 6x the old one)
    doc = analyze_timeline(write_timeline(tmp_path, reward))
    assert [s["from_step"] for s in doc["level_shifts"] if s["stage"] == "reward_compute"] == [10]
    spikes = [s for s in doc["spikes"] if s["stage"] == "reward_compute"]
    assert [s["step"] for s in spikes] == [30] and spikes[0]["baseline_seconds"] == pytest.approx(0.2, rel=0.1)


def test_a_short_slow_stretch_at_the_end_is_spikes_until_it_has_stayed(tmp_path):
    """Fewer than SHIFT_STEPS judged steps at the new level: not yet a level (a capture's slow step and the next)."""
    reward = jitter(20, 0.05)
    reward[18:] = 0.3
    doc = analyze_timeline(write_timeline(tmp_path, reward))
    assert SHIFT_STEPS > 2 and doc["level_shifts"] == []
    assert [s["step"] for s in doc["spikes"] if s["stage"] == "reward_compute"] == [19, 20]


def test_busy_steps_whose_wait_explains_them_are_one_contention_record_not_spikes_nor_a_level(tmp_path):
    """Slow only while the machine was busy, and the step waited for a core about what it lost: the machine's, not
    the job's. Judged all the same (not left out): said once as contention with the evidence, no spike, no level."""
    reward = jitter(30, 0.05)
    busy = {12, 13, 14, 15}
    reward[[s - 1 for s in busy]] = 0.3  # slow only while the machine was busy
    wait = [260.0 if s in busy else 2.0 for s in range(1, 31)]  # and it waited for a core about that long
    doc = analyze_timeline(write_timeline(tmp_path, reward, busy=busy, wait_ms=wait))
    assert doc["level_shifts"] == [] and doc["spikes"] == [], (doc["level_shifts"], doc["spikes"])
    (said,) = doc["contention"]
    assert said["every_rank"] and said["steps"] == sorted(busy) and said["stages"] == ["reward_compute", "step"]
    # at its usual share (2 ms of a 100 ms step) its 90 ms on a core would have waited about 2 ms
    assert said["run_wait_ms"] == pytest.approx(260) and said["expected_wait_ms"] == pytest.approx(1.8, abs=0.4)
    assert said["others_share"] == pytest.approx(0.6) and said["excess_seconds"] == pytest.approx(0.25, rel=0.1)


def test_a_busy_step_the_wait_does_not_explain_is_still_a_spike(tmp_path):
    """A busy machine is no reason to look away: a step 6x slower that waited 20 ms for a core is the job's spike."""
    reward = jitter(30, 0.05)
    reward[[13, 21]] = 0.3
    wait = [20.0 if s in (14, 22) else 2.0 for s in range(1, 31)]
    doc = analyze_timeline(write_timeline(tmp_path, reward, busy={14, 22}, wait_ms=wait))
    assert [s["step"] for s in doc["spikes"] if s["stage"] == "reward_compute"] == [14, 22]
    assert doc["contention"] == [] and doc["busy_steps"] == [14, 22]


def test_a_straggler_whose_extra_wait_explains_it_is_said_with_contention(tmp_path):
    """Two ranks on a busy host: rank 1 waited for a core 210 ms a step in the reward (rank 0: 2 ms) at the steps it
    lagged there by 250 ms (a neighbour on its core): a straggler, with contention as its cause and its evidence;
    rank 0 is none."""
    reward = jitter(30, 0.05)
    slow = jitter(30, 0.05, seed=4)
    slow[9:] = 0.3
    busy = set(range(10, 31))
    waits = {0: [2.0] * 30, 1: [2.0] * 9 + [210.0] * 21}
    run = write_timeline(tmp_path, reward, ranks=(0,), busy=busy, wait_ms=waits)
    rec = np.fromfile(rank_file(run, 0), DTYPE)
    rec["stage_s"][:, REWARD] = slow
    rec["run_wait_ms"] = rec["stage_wait_ms"][:, REWARD] = waits[1]
    rec["stage_cpu_ms"][:, REWARD] = np.maximum(slow * 1e3 - rec["stage_wait_ms"][:, REWARD], 0.0)
    rec.tofile(rank_file(run, 1))
    doc = analyze_timeline(run)
    (straggler,) = doc["stragglers"]
    assert (straggler["rank"], straggler["stage"], straggler["first_step"]) == (1, "reward_compute", 10)
    assert straggler["cause"] == "contention" and straggler["run_wait_ms"] == pytest.approx(210)
    assert straggler["expected_wait_ms"] == pytest.approx(90 * 0.04 / 0.96, rel=0.05)  # its 90 ms at rank 0's 2 of 50

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


def write_timeline(run_dir, reward_s, update_s=None, ranks=(0,), busy=()):
    """One record per step per rank: reward_compute and actor_update only, the step their sum."""
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


def test_busy_steps_neither_start_nor_hold_a_level(tmp_path):
    reward = jitter(30, 0.05)
    busy = {12, 13, 14, 15}
    reward[[s - 1 for s in busy]] = 0.3  # slow only while the machine was busy
    doc = analyze_timeline(write_timeline(tmp_path, reward, busy=busy))
    assert doc["level_shifts"] == [] and doc["spikes"] == []

"""Benchmarks print one JSON object with the documented keys (their figures are not asserted here)."""

import json
import os
import subprocess
import sys

from conftest import REAL, ROOT


def test_overhead_bench_prints_documented_json():
    env = dict(os.environ, RLPROF_BENCH_REEXEC="1")  # measure in this interpreter, verl or not
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "overhead.py")], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("bare_call_ns", "unselected_stage_ns", "unselected_tick_ns", "markers_stage_ns"):
        assert isinstance(figures[key], float) and figures[key] >= 0
    assert "verl_disabled_annotate_ns" in figures  # a number, or null where verl is not importable


def test_volume_bench_prints_documented_json():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "volume.py")], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in (
        "full_stage_bytes",
        "micro_batch_bytes",
        "markers_bytes",
        "full_stage_events",
        "micro_batch_events",
        "markers_events",
        "ratio",
    ):
        assert figures[key] > 0
    assert figures["full_stage_bytes"] > figures["micro_batch_bytes"] > figures["markers_bytes"]


def bench_figures(script: str, *args: str) -> dict:
    """Run a bench script as a user would; its last stdout line is one JSON object."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_ingest_bench_prints_documented_json():
    figures = bench_figures("ingest.py", "--mb", "3", "--no-hta", "--pairs", "1")
    assert figures["size_mb"] >= 3 and figures["rlprof_s"] > 0 and figures["floor_s"] > 0
    assert figures["rlprof_over_floor"] == round(figures["rlprof_s"] / figures["floor_s"], 2)
    assert set(figures["cold_s"]) == {"rlprof", "floor", "rlprof_one_core"}  # the untimed first round, shown
    for name in ("rlprof", "floor", "rlprof_one_core"):
        peak = figures[f"{name}_peak_mb"]
        assert peak["rss_sum"] >= peak["rss_max"] > 0 and peak["pss"] > 0


def test_compare_bench_prints_documented_json():
    figures = bench_figures("compare.py", "--mb", "2", "--db-mb", "2", "--no-msprof")
    kineto, db = figures["kineto"], figures["db"]
    assert kineto["size_mb"] >= 2 and kineto["rlprof_s"] > 0 and kineto["rlprof_peak_mb"]["rss_max"] > 0
    assert kineto["floor_s"] > 0 and kineto["rlprof_over_floor"] > 0
    assert set(kineto["cold_s"]) == {"rlprof", "floor"} and set(db["cold_s"]) == {"rlprof"}
    assert db["size_mb"] >= 2 and db["device_tasks"] > 10_000 and db["rlprof_s"] > 0


def test_ab_bench_runs_a_commit_against_this_checkout():
    figures = bench_figures(
        "ab.py", "HEAD", "--pairs", "1", "--", "analyze", str(REAL / "cpu_only_rank34.json.gz"), "--json"
    )
    assert figures["commit"] == "HEAD" and figures["pairs"] == 1
    assert figures["a_median_s"] > 0 and figures["b_median_s"] > 0
    assert abs(figures["b_over_a"] - figures["b_median_s"] / figures["a_median_s"]) < 0.01  # one pair: its ratio
    worktrees = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True).stdout
    assert "rlprof-ab-" not in worktrees  # the temporary checkout is gone


def test_scale_bench_prints_documented_json():
    figures = bench_figures("scale.py", "--counts", "2", "4", "--rank-mb", "0.3", "--no-ray")
    assert [c["ranks"] for c in figures["cases"]] == [2, 4]
    for case in figures["cases"]:
        assert case["local_s"] > 0 and case["local_driver_peak_mb"] > 0 and case["doc_mb"] > 0
    assert figures["cases"][1]["doc_mb"] > figures["cases"][0]["doc_mb"]


def test_trl_overhead_bench_prints_documented_json():
    import pytest

    pytest.importorskip("trl")
    figures = bench_figures("trl_overhead.py", "--steps", "3", "--pairs", "1")
    assert figures["without_ms_per_step"] > 0 and figures["with_ms_per_step"] > 0
    assert {"diff_ms_per_step", "diff_pct", "baseline_run_to_run_spread_ms"} <= figures.keys()


def test_the_packaged_calibration_is_the_measured_one():
    """advise reads src/rlprof/calibration.json; bench/calibrate.py writes it with bench/results/calibration_cpu.json."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    packaged = json.loads((root / "src" / "rlprof" / "calibration.json").read_text())
    assert packaged == json.loads((root / "bench" / "results" / "calibration_cpu.json").read_text())
    assert (
        packaged["stages"]["actor_update"]["full_bytes"]
        > packaged["units"]["actor_update/micro_batch"]["per_unit_bytes"]
        > 0
    )


def test_timeline_scale_bench_finds_what_it_planted():
    figures = bench_figures("timeline_scale.py", "--ranks", "20", "--steps", "400")
    assert figures["ranks"] == 20 and figures["steps"] == 400 and figures["stages"] == 8
    assert figures["seconds"] > 0 and figures["peak_mb"]["rss_max"] > 0 and figures["timeline_mb"] > 0
    assert (
        figures["found"]["straggler"] and figures["found"]["spike"] and "rollout_generate" in figures["found"]["drift"]
    )


def test_watch_cost_bench_prints_documented_json():
    figures = bench_figures("watch_cost.py", "--rounds", "1", "--steps", "6")
    assert set(figures["boundary_ns"]) == set(figures["step_end_us"]) == {"off", "watch"}
    assert all(v > 0 for v in (*figures["boundary_ns"].values(), *figures["step_end_us"].values()))
    assert (
        figures["decision_us_2_ranks"]["decision_us"] > 0 and figures["decision_us_2_ranks"]["bare_all_gather_us"] > 0
    )
    trainer = figures["trainer"]
    assert set(trainer["median_ms"]) == {"off", "watch", "slow_only"} and trainer["ratio_to_off"]["off"] == 1.0
    assert trainer["slow_only_said"].startswith("rlprof: keep: slow_only profiled")


def test_samples_cost_bench_prints_documented_json():
    figures = bench_figures("samples_cost.py", "--rounds", "2", "--steps", "8", "--passes", "20")
    trainer = figures["trainer"]
    assert len(trainer["on_ms"]) == len(trainer["off_ms"]) == len(trainer["ratio_per_round"]) == 2
    assert trainer["median_on_ms"] > 0 and trainer["median_off_ms"] > 0 and trainer["ratio"] > 0
    records = figures["records_us"]
    assert records["pass_on_us"] > 0 and records["pass_off_us"] > 0 and records["build_and_write_64_us"] > 0
    assert records["passes"] == 20


def test_host_stacks_cost_bench_prints_documented_json():
    figures = bench_figures("host_stacks_cost.py", "--rounds", "1", "--steps", "4", "--part", "trainer")
    trainer = figures["trainer"]
    (run,) = trainer["rounds"]
    assert trainer["on_ms"] > 0 and trainer["off_ms"] > 0 and trainer["ratio"] > 0
    assert run["sampled_steps"] == [2, 4] and 0 < run["sampler_cpu_share"] < 1 and run["stacks_to_trace_bytes"] > 0

"""`rlprof compare` and `rlprof cluster` on real traces, trainer runs and bad input."""

import csv
import gzip
import json
import shutil
import os
import subprocess
import sys
from collections import defaultdict

import pytest

from conftest import REAL, ROOT, plan_json, run_cli
from helpers import A, R, run

from rlprof.cluster import cluster

BASE, TEST = REAL / "compare_base.json.gz", REAL / "compare_test.json.gz"
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def compare_json(*args, cwd=None):
    proc = run_cli("compare", *args, "--json", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def raw_totals(path):
    """(kind, name) -> (count, µs) straight from the file (these ops do not nest: self = total)."""
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    out = defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.get("ph") == "X" and (e["cat"] == "cpu_op" or e["cat"] in DEVICE_CATS):
            slot = out[("cpu_op" if e["cat"] == "cpu_op" else "kernel", e["name"])]
            slot[0] += 1
            slot[1] += e["dur"]
    return out


def test_real_pair_lists_what_differs_with_signs():
    doc = compare_json("-d", TEST, "-bp", BASE)
    assert doc["matched_by"] == "trace"
    assert compare_json(BASE, TEST) == doc  # `rlprof compare BASELINE NEW`: the same comparison
    base, new = raw_totals(BASE), raw_totals(TEST)
    expected = {}
    for key in set(base) | set(new):
        (bc, bus), (nc, nus) = base.get(key, (0, 0.0)), new.get(key, (0, 0.0))
        if (bc, bus) != (nc, nus):
            expected[key] = (
                "added" if not bc else "removed" if not nc else "slower" if nus > bus else "faster",
                (nus - bus) / 1e3,
            )
    moved = {(o["kind"], o["name"]): (o["status"], o["diff_ms"]) for o in doc["ops"] if o["status"] != "same"}
    assert moved.keys() == expected.keys()
    for key, (status, diff) in expected.items():
        assert moved[key][0] == status
        assert moved[key][1] == pytest.approx(diff, abs=1e-6)
    # the three CPU ops only the new trace runs, and the elementwise kernel it launches once less
    assert {k[1] for k, v in expected.items() if v[0] == "added"} == {
        "All2All_Pooled_Req",
        "AddmmBackward0",
        "CatBackward0",
    }
    (kernel,) = [o for o in doc["ops"] if o["status"] == "faster"]
    assert "CUDAFunctor_add<int>" in kernel["name"] and (kernel["baseline_count"], kernel["new_count"]) == (3, 2)
    assert [abs(o["diff_ms"]) for o in doc["ops"]] == sorted((abs(o["diff_ms"]) for o in doc["ops"]), reverse=True)
    wall = [s for s in doc["stages"] if s["bucket"] == "wall"]
    assert len(wall) == 1 and wall[0]["baseline_ms"] > 0
    # reversed, the same operators are removed, with the opposite sign
    back = compare_json("-d", BASE, "-bp", TEST)
    rev = {(o["kind"], o["name"]): (o["status"], o["diff_ms"]) for o in back["ops"] if o["status"] != "same"}
    assert {k for k, v in rev.items() if v[0] == "removed"} == {k for k, v in expected.items() if v[0] == "added"}
    assert all(rev[k][1] == pytest.approx(-v[1]) for k, v in expected.items())


def test_by_shape_keys_operators_by_input_dims(tmp_path):
    doc = compare_json("-d", TEST, "-bp", BASE, "--by-shape")
    added = {(o["name"], o["shape"]) for o in doc["ops"] if o["status"] == "added"}
    assert added == {
        ("All2All_Pooled_Req", "[[2048,34820]]"),
        ("AddmmBackward0", "[[1024,96]]"),
        ("CatBackward0", "[[1024,70904]]"),
    }
    proc = run_cli("compare", "-d", TEST, "-bp", BASE, "--by-shape", "-o", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    written = {p.name for p in (tmp_path / "out").iterdir()}
    assert written == {
        "compare.json",
        "compare_stages.csv",
        "compare_units.csv",
        "compare_ops.csv",
        "compare_collectives.csv",
        "compare_memory.csv",
        "compare.html",
    }
    assert "All2All_Pooled_Req" in proc.stdout  # the terminal table


def _train(tmp_path, name, *overrides):
    proc = run_cli(
        "train",
        "trainer.steps=2",
        f"trainer.output_dir={tmp_path}/t_{name}",
        "global_profiler.tool=torch",
        "global_profiler.steps=[2]",
        f"global_profiler.save_path={tmp_path}/{name}",
        f"{A}.enable=true",
        *overrides,
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run_dir,) = list((tmp_path / name).iterdir())
    return run_dir


@pytest.mark.slow
def test_micro_batch_size_change_shows_in_actor_update(tmp_path):
    small = _train(tmp_path, "mb2", "actor.micro_batch_size=2")
    large = _train(tmp_path, "mb16", "actor.micro_batch_size=16")
    doc = compare_json("-d", small, "-bp", large)
    assert doc["matched_by"] == "step"
    update = {s["bucket"]: s for s in doc["stages"] if s["stage"] == "actor_update"}
    assert update["wall"]["step"] == 2 and update["wall"]["diff_ms"] > 0 and update["wall"]["ratio"] > 1.3
    # whole stages of the same work split into more micro-batches: compared as they are, the counts said
    assert update["wall"]["basis"] == "window" and update["wall"]["unit"] == "micro_batch"
    assert update["wall"]["new_units"] == 8 * update["wall"]["baseline_units"] > 0
    ops = [o for o in doc["ops"] if o["stage"] == "actor_update"]
    mm = next(o for o in ops if o["name"] == "aten::mm")
    assert mm["new_count"] >= 4 * mm["baseline_count"] > 0  # 16 micro-batches of 2 instead of 2 of 16
    top = next(o for o in ops if o["status"] != "same")
    assert top["status"] == "slower" and top["diff_ms"] > 0
    # the run's own analysis.json is an accepted input too (with a note about its top-N operators)
    proc = run_cli(
        "compare", "-d", small / "analysis" / "analysis.json", "-bp", large / "analysis" / "analysis.json", "--json"
    )
    assert proc.returncode == 0, proc.stderr
    assert "analysis.json" in proc.stderr and json.loads(proc.stdout)["stages"]


def one_line_exit_2(proc, *words):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line, line
    for w in words:
        assert w in line, line


def test_bad_compare_input_exits_2(tmp_path):
    one_line_exit_2(run_cli("compare", "-d", TEST), "-bp BASELINE", "missing")
    one_line_exit_2(run_cli("compare", "-bp", BASE), "-d NEW", "missing")
    one_line_exit_2(run_cli("compare"), "-d NEW and -bp BASELINE missing", "rlprof compare BASELINE NEW")
    one_line_exit_2(run_cli("compare", BASE), "1 path(s) given", "two needed", "rlprof compare BASELINE NEW")
    one_line_exit_2(run_cli("compare", BASE, TEST, BASE), "3 path(s) given", "two needed")
    one_line_exit_2(run_cli("compare", BASE, TEST, "-d", TEST), "both as arguments and as -d", "-d NEW -bp BASELINE")
    one_line_exit_2(run_cli("compare", BASE, "-bp", BASE), "both as arguments and as -bp")
    one_line_exit_2(run_cli("compare", BASE, tmp_path / "nope"), "NEW", "nope does not exist", "allowed")
    one_line_exit_2(run_cli("compare", "-d", tmp_path / "nope", "-bp", BASE), "does not exist", "allowed")
    only_actor = (
        f"{A}.tool_config.torch.discrete=true",
        f"{R}.enable=false",
        "actor_rollout_ref.ref.profiler.stages=[]",
    )
    actor_update = run(tmp_path / "a", *only_actor, f"{A}.stages=[actor_update]")
    log_prob = run(tmp_path / "b", *only_actor, f"{A}.stages=[actor_compute_log_prob]")
    one_line_exit_2(
        run_cli("compare", "-d", actor_update, "-bp", log_prob),
        "no stage in common",
        "actor/actor_update",
        "actor/actor_compute_log_prob",
    )
    one_line_exit_2(run_cli("compare", "-d", actor_update, "-bp", BASE), "is a run", "is a trace", "allowed")
    (tmp_path / "analysis.json").write_text(json.dumps({"schema_version": 1, "rows": [], "inputs": []}))
    one_line_exit_2(run_cli("compare", "-d", tmp_path / "analysis.json", "-bp", TEST, "--by-shape"), "--by-shape")


def test_compare_html_escapes_names(tmp_path):
    evil = "<img src=x onerror=alert(1)>"
    for side, dur in (("base", 10), ("new", 30)):
        events = [
            {"ph": "X", "cat": "cpu_op", "name": evil, "pid": 1, "tid": 1, "ts": 0, "dur": dur},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 50, "dur": 5},
        ]
        (tmp_path / f"{side}.json").write_text(json.dumps({"traceEvents": events}))
    proc = run_cli("compare", "-d", tmp_path / "new.json", "-bp", tmp_path / "base.json", "-o", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "out" / "compare.html").read_text()
    assert "&lt;img src=x onerror=alert(1)&gt;" in page and "<img" not in page and "<script" not in page


UNIT_RUNS = ROOT / "tests" / "data" / "compare"  # windows of 10 and 20 decode steps, 2 and 4 micro-batches (SOURCES.md)


def unit_walls(run_dir, stage, unit):
    """Each `rlprof:<unit>:<index>` range of the stage's trace, in ms, straight from the file (on the CPU a unit
    row's wall is its range)."""
    (path,) = run_dir.glob(f"*_{stage}_rank0.pt.trace.json.gz")
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return [e["dur"] / 1e3 for e in events if e.get("ph") == "X" and e["name"].startswith(f"rlprof:{unit}:")]


def test_windows_holding_different_unit_counts_are_compared_per_unit(tmp_path):
    """Two trainer runs whose windows held 10 and 20 decode steps, 2 and 4 micro-batches (each window one file holding
    only its scheduled units): each compared per unit, with the counts; the per-unit times agree within their spread,
    and the windows' ~2x is said as the count it is, never as the ratio. Recorded runs: the answer does not move
    with the machine's load."""
    from statistics import fmean, stdev

    base, new = UNIT_RUNS / "decode10_mb2", UNIT_RUNS / "decode20_mb4"
    doc = compare_json(base, new)
    units = {u["stage"]: u for u in doc["units"]}
    walls = {s["stage"]: s for s in doc["stages"] if s["bucket"] == "wall"}
    assert units.keys() == walls.keys() == {"rollout_generate", "actor_compute_log_prob"}
    for stage, unit in (("rollout_generate", "decode_step"), ("actor_compute_log_prob", "micro_batch")):
        wb, wn = unit_walls(base, stage, unit), unit_walls(new, stage, unit)
        u, wall = units[stage], walls[stage]
        assert (u["unit"], u["basis"], u["baseline_units"], u["new_units"]) == (unit, "per_unit", len(wb), len(wn))
        assert len(wn) == 2 * len(wb)
        for side, w in (("baseline", wb), ("new", wn)):
            assert u[f"{side}_unit_ms"] == pytest.approx(fmean(w))
            assert u[f"{side}_unit_std_ms"] == pytest.approx(stdev(w))
            assert (u[f"{side}_unit_min_ms"], u[f"{side}_unit_max_ms"]) == pytest.approx((min(w), max(w)))
            assert u[f"{side}_window_ms"] == pytest.approx(sum(w))  # the window holds its units only
        per_unit = fmean(wn) / fmean(wb)
        assert u["unit_ratio"] == pytest.approx(per_unit)
        # the per-unit times agree within their spread (their ±1 std bands overlap)
        assert abs(fmean(wn) - fmean(wb)) <= stdev(wb) + stdev(wn) and u["within_spread"] is True
        # the raw ratio counts units: read per unit, it would put the new window's units where none of them was
        assert u["window_ratio"] == pytest.approx(sum(wn) / sum(wb)) and u["window_ratio"] > 1.8
        assert fmean(wb) * u["window_ratio"] > max(wn)
        # the stage table's verdict is the per-unit one; the windows' totals stand beside it, named so
        expected = ("per_unit", unit, len(wb), len(wn))
        assert (wall["basis"], wall["unit"], wall["baseline_units"], wall["new_units"]) == expected
        assert wall["ratio"] == pytest.approx(per_unit) and wall["baseline_ms"] == pytest.approx(fmean(wb))
        assert wall["window_ratio"] == pytest.approx(u["window_ratio"])
        assert f"{len(wb)} vs {len(wn)} {unit}" in u["note"] and "within the units' spread" in u["note"]
        # operators of those windows per unit too: the same model runs the same operators per unit
        mm = next(o for o in doc["ops"] if o["stage"] == stage and o["name"] == "aten::mm")
        assert mm["per"] == unit and mm["baseline_count"] == mm["new_count"] > 0
    # the terminal, compare.json, CSV and HTML say the same
    proc = run_cli("compare", base, new, "-o", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    (row,) = [line for line in proc.stdout.splitlines() if "10 -> 20" in line]
    rollout = units["rollout_generate"]
    assert (
        "decode_step" in row and f"{rollout['unit_ratio']:.3f}" in row and f"{rollout['window_ratio']:.3f}" not in row
    )
    assert "10 vs 20 decode_steps in the windows, compared per decode_step" in " ".join(proc.stdout.split())
    assert json.loads((tmp_path / "out" / "compare.json").read_text())["units"] == doc["units"]
    with open(tmp_path / "out" / "compare_units.csv") as f:
        rows = {r["stage"]: r for r in csv.DictReader(f)}
    assert (rows["rollout_generate"]["baseline_units"], rows["rollout_generate"]["new_units"]) == ("10", "20")
    page = (tmp_path / "out" / "compare.html").read_text()
    assert "2 vs 4 micro_batches in the windows" in page and "Windows holding different numbers of units" in page


def test_equal_unit_counts_compare_as_before_and_whole_stages_as_they_are(tmp_path):
    """Windows holding the same number of units compare as they always did, nothing said; whole stages holding
    different numbers (6 and 48 decode steps: another max_new_tokens) each did their run's whole work, so they
    compare as they are, their counts and per-unit times said beside."""
    same = compare_json(UNIT_RUNS / "decode10_mb2", UNIT_RUNS / "decode10_mb2")
    assert all(
        u["basis"] == "window" and u["baseline_units"] == u["new_units"] and u["note"] is None for u in same["units"]
    )
    assert all(s["ratio"] == pytest.approx(1.0) for s in same["stages"] if s["bucket"] == "wall")
    proc = run_cli("compare", UNIT_RUNS / "decode10_mb2", UNIT_RUNS / "decode10_mb2", "-o", tmp_path / "same")
    header = next(line for line in proc.stdout.splitlines() if "step" in line and "ratio" in line)
    assert {c.strip() for c in header.split("┃")} & {"per", "units"} == set()  # the table as it always was
    assert "10 -> 10" not in proc.stdout and "decode_steps" not in proc.stdout
    healthy, skewed = RUNS / "healthy", RUNS / "skewed_lengths"
    doc = compare_json(healthy, skewed)
    counts = [len(unit_walls(run, "e2e", "decode_step")) for run in (healthy, skewed)]
    (u,) = [u for u in doc["units"] if u["stage"] == "rollout_generate"]
    assert (u["basis"], u["baseline_units"], u["new_units"]) == ("window", *counts) and counts[0] != counts[1]
    (wall,) = [s for s in doc["stages"] if s["stage"] == "rollout_generate" and s["bucket"] == "wall"]
    assert wall["ratio"] == pytest.approx(wall["new_ms"] / wall["baseline_ms"]) and "window_ratio" not in wall
    assert f"whole stages holding {counts[0]} vs {counts[1]} decode_steps, compared as they are" in u["note"]
    assert all(o["per"] == "window" for o in doc["ops"])
    assert [x["stage"] for x in doc["units"] if x["note"]] == ["rollout_generate"]  # equal counts: nothing said


def _torchrun_run(tmp_path, name, *overrides):
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
        "trainer.steps=3",
        f"trainer.output_dir={tmp_path}/t_{name}",
        "global_profiler.tool=torch",
        "global_profiler.steps=[2,3]",
        f"global_profiler.save_path={tmp_path}/{name}",
        f"{A}.enable=true",
        f"{A}.all_ranks=true",
        *overrides,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = list((tmp_path / name).iterdir())
    return run_dir


RUNS = ROOT / "tests" / "data" / "runs"  # runs the trainer recorded (bench/record_runs.py, SOURCES.md there)


def test_cluster_names_the_slow_rank_and_only_then(tmp_path):
    """On two recorded 2-rank runs (rank 1 computing 20 ms longer per update micro-batch, and an even one): the
    slowed rank is named with its evidence, first among the findings, targeted by advise; the even run names none.
    Exact, whatever the machine running the test is doing."""
    slow = shutil.copytree(RUNS / "slow_rank_2", tmp_path / "slow")
    proc = run_cli("cluster", slow, "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert [(f["rank"], f["role"], f["stage"]) for f in result["slow_ranks"]] == [(1, "actor", "actor_update")]
    evidence = result["slow_ranks"][0]["evidence"]
    assert evidence["excess_ms"] > 40 and evidence["others_wait_ms"] > evidence["wait_ms"]
    assert any(c["name"].startswith(("gloo:", "FSDP::all_gather", "c10d::")) for c in evidence["collectives"])
    assert {(r["rank"], r["stage"]) for r in result["ranks"]} >= {(0, "actor_update"), (1, "actor_update")}
    spread = next(s for s in result["stages"] if s["stage"] == "actor_update" and s["bucket"] == "compute")
    assert spread["max_rank"] == 1 and spread["spread_ms"] > 40 and spread["cv"] > 0.2
    proc = run_cli("cluster", slow)  # the terminal report names it too, and writes cluster.json
    assert proc.returncode == 0 and "slow rank 1" in proc.stdout and (slow / "cluster" / "cluster.json").exists()
    found = json.loads(run_cli("analyze", slow, "--json").stdout)["findings"]
    first = found[0]  # the first finding: rank 1 in actor_update, and what it makes rank 0 wait
    assert (first["kind"], first["rank"], first["stage"]) == ("slow_rank", 1, "actor_update")
    assert "rank 1" in first["text"] and first["evidence"]["others_wait_ms"] > first["evidence"]["wait_ms"]
    proc = run_cli("advise", slow, "--budget", "2MB", "-o", tmp_path / "next.yaml")
    assert proc.returncode == 0, proc.stderr
    target = json.loads((tmp_path / "next.advice.json").read_text())["target"]
    assert target["stage"] == "actor_update" and target["ranks"] == [1, 0]
    assert sorted(plan_json(tmp_path / "next.yaml")["roles"]["actor"]["ranks"]) == [0, 1]
    even = json.loads(run_cli("cluster", shutil.copytree(RUNS / "even_2", tmp_path / "even"), "--json").stdout)
    assert {r["rank"] for r in even["ranks"]} == {0, 1} and even["slow_ranks"] == []


@pytest.mark.slow
def test_a_rank_slowed_by_a_wide_margin_is_named_live(tmp_path):
    """Live, under torchrun: rank 1 computing 150 ms longer per update micro-batch (1.2 s a step, several times the
    step itself) is named by `rlprof cluster` whatever else the machine runs; the windows of both ranks are there."""
    slow = _torchrun_run(tmp_path, "slow", "trainer.debug.slow_rank=1", "trainer.debug.slow_ms=150")
    result = json.loads(run_cli("cluster", slow, "--json").stdout)
    assert {r["rank"] for r in result["ranks"]} == {0, 1}
    assert [(f["rank"], f["stage"]) for f in result["slow_ranks"]] == [(1, "actor_update")]


def _rows(role, stage, per_rank, replica=False):
    return [
        {
            "step": step,
            "role": role,
            "stage": stage,
            "rank": 0 if replica else rank,
            "replica": rank if replica else None,
            "unit": None,
            "wall_ms": 100.0,
            "compute_ms": c,
            "comm_ms": w,
            "overlap_ms": 0.0,
            "memcpy_ms": 0.0,
            "idle_ms": 100.0 - c - w,
        }
        for rank, (c, w) in per_rank.items()
        for step in (1, 2)
    ]


def test_slow_rank_rule_on_eight_ranks_and_replicas():
    ranks = {r: (50.0 + r * 0.3, 30.0) for r in range(8)}
    ranks[5] = (80.0, 2.0)  # computes 30 ms more, barely waits: the others wait for it
    doc = {
        "rows": _rows("actor", "actor_update", ranks),
        "collectives": [
            {
                "role": "actor",
                "stage": "actor_update",
                "rank": r,
                "step": 1,
                "name": "ncclDevKernel_AllGather",
                "total_ms": w,
            }
            for r, (_, w) in ranks.items()
        ],
    }
    result = cluster(doc)
    assert [(f["rank"], f["stage"]) for f in result["slow_ranks"]] == [(5, "actor_update")]
    assert result["slow_ranks"][0]["evidence"]["collectives"][0]["name"] == "ncclDevKernel_AllGather"
    # more compute without the others waiting (e.g. uneven work that does not gate a collective): no finding
    ranks[5] = (80.0, 30.0)
    assert cluster({"rows": _rows("actor", "actor_update", ranks), "collectives": []})["slow_ranks"] == []
    # async rollout replicas are the ranks of the rollout role
    replicas = {0: (40.0, 20.0), 1: (40.5, 20.0), 2: (70.0, 1.0)}
    result = cluster({"rows": _rows("rollout", "rollout_generate", replicas, replica=True), "collectives": []})
    assert {r["rank"] for r in result["ranks"]} == {0, 1, 2}
    assert [(f["rank"], f["role"]) for f in result["slow_ranks"]] == [(2, "rollout")]


def test_one_slow_step_is_a_hiccup_not_a_slow_rank():
    # rank 0 is 30 ms behind in step 2 only (its mean is 15 ms ahead of rank 1's, past every other bar)
    rows = _rows("actor", "weight_sync", {0: (5.0, 20.0), 1: (5.0, 30.0)})
    for r in rows:
        if r["rank"] == 0 and r["step"] == 2:
            r["compute_ms"] = 35.0
    assert cluster({"rows": rows, "collectives": []})["slow_ranks"] == []
    for r in rows:  # behind in both steps: named, with the steps it was behind in
        if r["rank"] == 0:
            r["compute_ms"] = 20.0
    (found,) = cluster({"rows": rows, "collectives": []})["slow_ranks"]
    assert found["rank"] == 0 and found["evidence"]["steps_behind"] == 2
    assert "behind in 2 of 2 steps" in found["evidence"]["summary"]


def test_cluster_bad_input_exits_2(tmp_path):
    one_line_exit_2(run_cli("cluster", tmp_path / "missing"), "does not exist")
    (tmp_path / "x.json").write_text("{}")
    one_line_exit_2(run_cli("cluster", tmp_path / "x.json"), "x.json")

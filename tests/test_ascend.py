"""Ascend as MindSpeed-RL users run it: torch_npu's db export, mstx stage ranges, a profile_save_path of
many ranks, compare against a Kineto run. Db fixtures: tests/data/ascend (see its SOURCES.md)."""

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from conftest import REAL, ROOT, run_cli
from rlprof.analyze.pipeline import analyze

DATA = ROOT / "tests" / "data" / "ascend"
MINDSPEED = DATA / "mindspeed"
BUCKETS = ("wall_ms", "compute_ms", "comm_ms", "overlap_ms", "idle_ms")
TEXT_TWIN = {"trace_view": "trace_view.json", "kernel_details": "kernel_details.csv"}
STAGES = ["rollout_generate", "actor_compute_log_prob", "ref_compute_log_prob", "advantage_compute", "actor_update"]


def collection(tmp_path, name: str, *, text: bool, db: bool) -> Path:
    """A torch_npu output directory holding the text export, the db export, or both, of one real run."""
    out = tmp_path / f"{name}_{int(text)}{int(db)}_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    if text:
        shutil.copy(REAL / "ascend" / TEXT_TWIN[name], out)
    if db:
        for f in (DATA / "real" / name).glob("*.db"):
            shutil.copy(f, out)
    return out.parent


def intervals_union(pairs) -> int:
    """The test's own union length (integer ns), independent of rlprof's numpy code."""
    total, lo, hi = 0, None, None
    for s, e in sorted(pairs):
        if hi is None or s > hi:
            total += (hi - lo) if hi is not None else 0
            lo, hi = s, e
        else:
            hi = max(hi, e)
    return total + ((hi - lo) if hi is not None else 0)


@pytest.mark.parametrize("name", ["trace_view", "kernel_details"])
def test_text_and_db_exports_of_one_run_give_the_same_rows(tmp_path, name):
    text = analyze(collection(tmp_path, name, text=True, db=False), workers=1)
    db = analyze(collection(tmp_path, name, text=False, db=True), workers=1)
    both = analyze(collection(tmp_path, name, text=True, db=True), workers=1)
    assert [i["export"] for i in (text["inputs"][0], db["inputs"][0], both["inputs"][0])] == ["text", "db", "db"]
    assert len(text["rows"]) == len(db["rows"]) == 1 and text["rows"][0]["step"] == db["rows"][0]["step"] == 1
    for b in BUCKETS:  # equal up to the db's integer ns (the text export prints some durations finer)
        assert db["rows"][0][b] == pytest.approx(text["rows"][0][b], rel=1e-4, abs=1e-6), b
        assert both["rows"][0][b] == db["rows"][0][b]
    assert db["rows"][0]["start_us"] == pytest.approx(text["rows"][0]["start_us"], abs=1e-3)  # epoch µs both
    if name == "kernel_details":  # operator types and counts survive the db form (the csv's Type column)
        ops = lambda d: {(o["name"], o["count"]) for o in d["ops"] if o["kind"] == "kernel"}  # noqa: E731
        assert ops(text) == ops(db) and ("MatMul", 9) in ops(db)
        assert {c["name"]: c["count"] for c in db["collectives"]}["hcom_allReduce_"] == 14


def test_step_rows_equal_torch_npus_own_step_trace():
    """analysis.db beside each db holds StepTraceTime as torch_npu's own parser computed it from the db. Where
    stages are marked rlprof reports stage rows, so its per-step windows are read through its reader."""
    checked = 0
    for db in sorted(DATA.rglob("ascend_pytorch_profiler_*.db")):
        analysis = db.parent / "analysis.db"
        if not analysis.exists():
            continue
        ref = (
            sqlite3.connect(analysis)
            .execute("SELECT step, computing, communication_not_overlapped, overlapped, free FROM StepTraceTime")
            .fetchall()
        )
        steps = {r["step"]: r for r in analyze(db, workers=1)["rows"] if r["stage"] is None} or _step_rows(db)
        for step, compute, comm, overlap, free in ref:
            row = steps[int(step)]
            assert row["compute_ms"] == pytest.approx(compute / 1e3, rel=1e-6), db
            assert row["comm_ms"] == pytest.approx(comm / 1e3, rel=1e-6), db
            assert row["overlap_ms"] == pytest.approx(overlap / 1e3, rel=1e-6, abs=1e-9), db
            assert row["idle_ms"] == pytest.approx(free / 1e3, rel=1e-6, abs=1e-9), db
            checked += 1
    assert checked == 6  # 1 + 1 steps of the real runs, 2 x 2 of the MindSpeed-RL ranks


def _step_rows(db: Path) -> dict:
    """Per-step windows of a db whose stages are marked: each step's device time, through rlprof's reader."""
    from rlprof.analyze.window.breakdown import OverlapBreakdown
    from rlprof.analyze.inputs.readers.ascend import read_ascend

    trace = read_ascend(db)
    lanes = OverlapBreakdown(trace.overlap)
    return {step: lanes.window(lo, hi) for step, lo, hi in (lanes.extent(*s) for s in trace.step_spans)}


def test_buckets_agree_with_msprof_analyze(msprof):
    """msprof-analyze's own comparison of each db (Computing, Uncovered Communication, Free, E2E time) against
    rlprof's whole-timeline buckets of the same file: within 1% each (they agree to the ns). msprof-analyze's db
    E2E runs from the first to the last device task of any kind: rlprof's device_totals_all_tasks."""
    dbs = sorted(p for p in DATA.rglob("ascend_pytorch_profiler_*.db") if "mstx" not in str(p))
    assert len(dbs) == 4
    for base, new in zip(dbs[::2], dbs[1::2]):
        ref = msprof.overall(base, new)
        for side, db in (("base", base), ("new", new)):
            totals = analyze(db, workers=1)["inputs"][0]["device_totals_all_tasks"]
            mine = {
                "Computing Time": totals["compute_ms"],
                "Uncovered Communication Time": totals["comm_ms"],
                "Free Time": totals["idle_ms"],
                "E2E Time": totals["wall_ms"],
            }
            for metric, theirs in ref[side].items():
                assert mine[metric] == pytest.approx(theirs, rel=0.01, abs=1e-6), (db, metric)


@pytest.mark.parametrize("run", ["profiler_data", "profiler_data_mstx"])
def test_mstx_ranges_become_stage_rows_per_step_and_rank(run):
    doc = analyze(MINDSPEED / run)
    rows = [r for r in doc["rows"] if r["unit"] is None]
    assert sorted({r["rank"] for r in rows}) == [0, 1] and len(doc["inputs"]) == 2
    for rank in (0, 1):
        for step in (2, 3):  # the step comes from STEP_TIME, the stage from MindSpeed-RL's qualnames
            assert [r["stage"] for r in rows if r["rank"] == rank and r["step"] == step] == STAGES
    db = next((MINDSPEED / run).rglob("ascend_pytorch_profiler_1.db"))
    conn = sqlite3.connect(db)
    strings = dict(conn.execute("SELECT id, value FROM STRING_IDS"))
    comm = conn.execute("SELECT startNs, endNs FROM COMMUNICATION_OP").fetchall()
    compute = (
        conn.execute(
            "SELECT t.startNs, t.endNs FROM COMPUTE_TASK_INFO c JOIN TASK t ON t.globalTaskId = c.globalTaskId"
        ).fetchall()
        if run == "profiler_data"
        else []
    )
    update = [
        (s, e)
        for s, e, m in conn.execute("SELECT startNs, endNs, message FROM MSTX_EVENTS")
        if strings[m] == "ActorHybridWorkerBase.update"
    ]
    mine = [r for r in rows if r["rank"] == 1 and r["stage"] == "actor_update"]
    for (lo, hi), row in zip(update, mine):
        clip = lambda pairs, lo=lo, hi=hi: [(max(s, lo), min(e, hi)) for s, e in pairs if e > lo and s < hi]  # noqa: E731
        busy = intervals_union(clip(comm) + clip(compute))
        assert row["wall_ms"] == pytest.approx((hi - lo) / 1e6)
        assert row["comm_ms"] == pytest.approx((busy - intervals_union(clip(compute))) / 1e6)  # inside: comm
        assert row["compute_ms"] == pytest.approx(intervals_union(clip(compute)) / 1e6)
        assert row["comm_ms"] > 0
    if run == "profiler_data":  # per-stage operators, and memory from MEMORY_RECORD
        update_ops = {o["name"] for o in doc["ops"] if o["stage"] == "actor_update"}
        assert {"ApplyAdamW", "hcom_reduceScatter_"} <= update_ops and "PagedAttention" not in update_ops
        assert all(m["peak_bytes"] > 8 * 2**30 for m in doc["memory"])


def test_mstx_ranges_in_the_text_export(tmp_path):
    """mstx ranges in trace_view.json are matched by name wherever the exporter put them (host lanes)."""
    events = json.loads((REAL / "ascend" / "trace_view.json").read_text())
    step = next(e for e in events if e.get("name") == "ProfilerStep#1")
    t0 = float(step["ts"])
    for name, lo, hi in (
        ("ActorHybridWorkerBase.compute_log_prob", 2600, 6000),
        ("ActorHybridWorkerBase.update", 6000, 13900),
    ):
        events.append(
            {
                "ph": "X",
                "name": name,
                "pid": step["pid"],
                "tid": step["tid"],
                "ts": f"{t0 + lo:.3f}",
                "dur": hi - lo,
                "args": {},
            }
        )
    out = tmp_path / "r_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    (out / "trace_view.json").write_text(json.dumps(events))
    rows = analyze(tmp_path, workers=1)["rows"]
    assert [(r["step"], r["stage"], r["role"]) for r in rows] == [
        (1, "actor_compute_log_prob", "actor"),
        (1, "actor_update", "actor"),
    ]
    assert rows[0]["host_wall_ms"] == pytest.approx(3.4) and rows[1]["host_wall_ms"] == pytest.approx(7.9)
    computing = [e for e in events if e.get("ph") == "X" and e["name"] == "Computing"]  # the exporter's own lane
    # each range holds the operators it launched (trace_view's async_npu flows): together all the step's computing
    # but the few launched before the first range or after the second
    lane = sum(e["dur"] for e in computing) / 1e3
    assert all(r["attribution"] == "launch" for r in rows)
    assert 0.99 * lane <= sum(r["compute_ms"] for r in rows) <= lane + 1e-9


def test_profile_save_path_is_analysed_per_rank_and_says_what_is_unparsed():
    proc = run_cli("analyze", MINDSPEED / "profiler_data", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert sorted(i["rank"] for i in doc["inputs"]) == [0, 1]
    (line,) = [w for w in doc["warnings"] if "not parsed" in w]
    assert "1 of 3" in line and "profile_analysis: false" in line
    assert f"torch_npu.profiler.profiler.analyse(profiler_path='{MINDSPEED / 'profiler_data'}')" in line


def test_only_unparsed_collections_is_one_line_with_the_parse_command(tmp_path):
    raw = MINDSPEED / "profiler_data" / "actor_update"
    shutil.copytree(raw, tmp_path / "actor_update")
    proc = run_cli("analyze", tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "not parsed yet" in line and f"analyse(profiler_path='{tmp_path}')" in line


def test_stage_directory_names_give_the_stage(tmp_path):
    """MindSpeed-RL's per-stage collections land in profile_save_path/{stage}/: rows carry that stage."""
    src = next((MINDSPEED / "profiler_data" / "integrated").glob("node0_4100_*_ascend_pt"))
    shutil.copytree(src, tmp_path / "actor_generate" / src.name)
    conn = sqlite3.connect(next((tmp_path / "actor_generate").rglob("*.db")))
    conn.execute("DELETE FROM MSTX_EVENTS")  # no ranges: the directory says which stage this is
    conn.commit()
    conn.close()
    rows = analyze(tmp_path, workers=1)["rows"]
    assert {(r["role"], r["stage"], r["rank"]) for r in rows} == {("rollout", "rollout_generate", 0)}
    assert [r["step"] for r in rows] == [2, 3]


def _damaged(tmp_path, how: str) -> Path:
    src = next((MINDSPEED / "profiler_data" / "integrated").glob("node0_4101_*_ascend_pt"))
    dst = tmp_path / "run" / src.name
    shutil.copytree(src, dst)
    db = next(dst.rglob("ascend_pytorch_profiler_1.db"))
    if how == "truncated":
        data = db.read_bytes()
        db.write_bytes(data[: len(data) // 3])
    elif how == "missing-tables":
        conn = sqlite3.connect(db)
        conn.execute("DROP TABLE TASK")
        conn.commit()
        conn.close()
    elif how == "not-sqlite":
        db.write_bytes(b"this is not a database" * 100)
    return db


@pytest.mark.parametrize(
    "how,says",
    [
        ("truncated", "damaged or truncated"),
        ("missing-tables", "no TASK table"),
        ("not-sqlite", "not a readable sqlite db"),
    ],
)
def test_bad_db_is_one_line_and_exit_2(tmp_path, how, says):
    db = _damaged(tmp_path, how)
    proc = run_cli("analyze", tmp_path / "run")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert str(db) in line and says in line, line


def test_locked_db_is_named_and_the_other_ranks_still_analysed(tmp_path):
    db = _damaged(tmp_path, "none")
    good = next((MINDSPEED / "profiler_data" / "integrated").glob("node0_4100_*_ascend_pt"))
    shutil.copytree(good, tmp_path / "run" / good.name)
    holder = sqlite3.connect(db, timeout=0)
    holder.execute("BEGIN EXCLUSIVE")  # another process still writing it
    try:
        proc = run_cli("analyze", tmp_path / "run", "--json")
    finally:
        holder.rollback()
        holder.close()
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["partial"] is True and {r["rank"] for r in doc["rows"]} == {0}
    assert any(str(db) in w and "locked" in w for w in doc["warnings"])


def test_compare_an_ascend_run_with_a_kineto_run(tmp_path):
    """msprof-analyze compare -d NPU -bp GPU, by stage and bucket: here against rlprof's own trainer (CPU)."""
    train = run_cli(
        "train",
        "trainer.steps=2",
        "global_profiler.tool=torch",
        "global_profiler.steps=[2]",
        f"global_profiler.save_path={tmp_path}/kineto",
        "actor_rollout_ref.actor.profiler.enable=true",
        "actor_rollout_ref.rollout.profiler.enable=true",
        "actor_rollout_ref.ref.profiler.enable=true",
        cwd=tmp_path,
        timeout=600,
    )
    assert train.returncode == 0, train.stderr[-2000:]
    proc = run_cli("compare", "-d", MINDSPEED / "profiler_data", "-bp", tmp_path / "kineto", "-o", tmp_path / "cmp")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    matched = {(s["stage"], s["bucket"]) for s in doc["stages"] if s["step"] == 2}
    assert {("actor_update", "compute"), ("rollout_generate", "comm"), ("ref_compute_log_prob", "wall")} <= matched
    added = {o["name"] for o in doc["ops"] if o["status"] == "added"}
    assert "hcom_reduceScatter_" in added  # HCCL collectives exist only on the NPU side


@pytest.mark.slow
def test_ranks_fan_out_over_ray_with_the_same_rows():
    local = analyze(MINDSPEED / "profiler_data")
    proc = run_cli("analyze", MINDSPEED / "profiler_data", "--json", "--ray", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    remote = json.loads(proc.stdout)
    assert remote["rows"] == local["rows"] and len(local["rows"]) == 20


def test_a_cann_msprof_db_is_read_too(tmp_path):
    """msprof's own export (msprof_{timestamp}.db) has the same CANN tables."""
    src = next((DATA / "real" / "kernel_details").glob("ascend_pytorch_profiler_*.db"))
    out = tmp_path / "PROF_000001" / "mindstudio_profiler_output"
    out.mkdir(parents=True)
    shutil.copy(src, out / "msprof_20261122120000.db")
    mine = analyze(out / "msprof_20261122120000.db", workers=1)
    ref = analyze(src, workers=1)
    assert mine["inputs"][0]["export"] == "db" and mine["rows"][0]["compute_ms"] == ref["rows"][0]["compute_ms"]


def test_mindspeeds_lightweight_mode_on_rlprofs_own_timeline(tmp_path):
    """`mstx: true` in the integrated dialect: the activities the switches select (on this CPU machine the torch
    tool) plus the ranges, analysed into the same stage rows, here from one window holding steps 2 and 3."""
    i = "profiler_config.integrated"
    proc = run_cli(
        "train",
        "trainer.steps=3",
        f"trainer.output_dir={tmp_path}/t",
        f"{i}.profile=true",
        f"{i}.mstx=true",
        f"{i}.profile_step_start=2",
        f"{i}.profile_step_end=4",
        f"{i}.profile_save_path={tmp_path}/p",
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run,) = list((tmp_path / "p").iterdir())
    doc = analyze(run, workers=1)
    stages = [(r["step"], r["stage"]) for r in doc["rows"] if r["unit"] is None]
    assert (2, "actor_update") in stages and (3, "actor_update") in stages and (3, "rollout_generate") in stages
    assert doc["inputs"][0]["tool"] == "torch"


def test_cluster_names_the_slow_rank_of_an_ascend_run(tmp_path):
    proc = run_cli("cluster", MINDSPEED / "profiler_data", "-o", tmp_path / "c")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "c" / "cluster.json").read_text())
    (slow,) = doc["slow_ranks"]
    assert slow["rank"] == 1 and slow["stage"] == "actor_update"
    assert any("hcom_reduceScatter_" in str(v) for v in slow.values())


def test_a_cut_text_export_keeps_what_was_written(tmp_path):
    """trace_view.json cut at 60% and kernel_details.csv cut mid-row: the events before the cut, partial, named."""
    out = tmp_path / "r_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    view = (REAL / "ascend" / "trace_view.json").read_bytes()
    (out / "trace_view.json").write_bytes(view[: int(len(view) * 0.6)])
    proc = run_cli("analyze", tmp_path, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["partial"] is True and any("trace_view.json" in w and "kept" in w for w in doc["warnings"])
    kept = json.loads(view[: view.rfind(b"}", 0, int(len(view) * 0.6)) + 1].decode() + "]")
    hardware = {e["pid"] for e in kept if e.get("ph") == "M" and e.get("args", {}).get("name") == "Ascend Hardware"}
    assert doc["rows"] and doc["rows"][0]["compute_ms"] > 0 and hardware
    csv_text = (REAL / "ascend" / "kernel_details.csv").read_bytes()
    (out / "trace_view.json").unlink()
    (out / "kernel_details.csv").write_bytes(csv_text[: len(csv_text) // 2])
    proc = run_cli("analyze", tmp_path, "--json")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert json.loads(proc.stdout)["rows"][0]["compute_ms"] > 0

"""Device work belongs to the row whose host range launched it: on real GPU traces where the device runs behind
the host, each row's device numbers equal the union of the device events its host range launched, computed here
from the raw JSON (Kineto's correlation ids) without rlprof's code; CPU runs analyse exactly as before."""

import gzip
import json
import re
import shutil

import pytest

from conftest import DATA, REAL
from helpers import union
from rlprof.analyze.diagnosis.causes import CAUSES
from rlprof.analyze.diagnosis.speed_of_light import ROW_FIELDS
from rlprof.analyze.pipeline import analyze

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
INFERENCE = [
    "vllm_decode_full_graph_mi300x.json.gz",
    "vllm_prefilldecode_piecewise_mi300x.json.gz",
    "sglang_qwen3_8b_decode_mi300x.json.gz",
    "sglang_qwen3_8b_prefilldecode_mi300x.json.gz",
]


def _launched(events, lo, hi):
    """The device events whose launch call (the runtime event with their correlation id) lies in [lo, hi]."""
    calls = {
        e["args"]["correlation"]: e["ts"]
        for e in events
        if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    return [
        e
        for e in events
        if e.get("ph") == "X"
        and e.get("cat") in DEVICE_CATS
        and lo <= calls.get(e["args"].get("correlation"), float("nan")) <= hi
    ]


def _device_time(work):
    """(union of the events' intervals, first start to last end), µs."""
    iv = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in work]
    return union(iv), max(b for _, b in iv) - min(a for a, _ in iv)


@pytest.mark.parametrize("name", INFERENCE)
def test_engine_iteration_rows_hold_the_kernels_their_host_range_launched(name):
    events = json.load(gzip.open(REAL / name))["traceEvents"]
    (it,) = [e for e in events if e.get("cat") == "user_annotation" and re.match(r"execute_\d+_context_", e["name"])]
    lo, hi = float(it["ts"]), float(it["ts"]) + float(it["dur"])
    work = _launched(events, lo, hi)
    busy, window = _device_time(work)
    assert max(float(e["ts"]) + float(e["dur"]) for e in work) > hi  # the device ran past the host range
    doc = analyze(REAL / name, workers=1, top=None)
    stage = next(r for r in doc["rows"] if r["unit"] is None)
    (step,) = [r for r in doc["rows"] if r["unit"] == "decode_step"]
    for row in (stage, step):
        assert row["attribution"] == "launch" and row["unlinked_events"] == 0
        assert row["wall_ms"] - row["idle_ms"] == pytest.approx(busy / 1e3, rel=0.01)
        assert row["wall_ms"] == pytest.approx(window / 1e3, rel=0.01)
        assert row["host_wall_ms"] == pytest.approx((hi - lo) / 1e3, rel=1e-9)
        parts = row["compute_ms"] + row["comm_ms"] + row["memcpy_ms"] + row["idle_ms"]
        assert parts == pytest.approx(row["wall_ms"], rel=1e-9)  # the identity: the buckets fill the device window
    # the operator table places the step's kernels in its stage, not outside every stage
    placed = sum(o["count"] for o in doc["ops"] if o["kind"] == "kernel" and o["stage"] == "rollout_generate")
    assert placed == len(work)
    # an idle finding says only the idle the launched work left: never the idle of a device kept busy
    for f in doc["findings"]:
        if f["kind"] == "idle":
            assert f["evidence"]["share"] == pytest.approx(1 - busy / window, rel=0.01)
    if busy / window > 0.5:
        assert "idle" not in [f["kind"] for f in doc["findings"]]


def test_full_graph_decode_step_reads_its_graph_kernels():
    """The issue's example: one vLLM full-graph decode step, its 425 kernels replayed by a graph launch inside a
    2.41 ms host range, running ~10.7 ms after it: compute is that time, not 0."""
    doc = analyze(REAL / "vllm_decode_full_graph_mi300x.json.gz", workers=1)
    (step,) = [r for r in doc["rows"] if r["unit"] == "decode_step"]
    assert step["host_wall_ms"] == pytest.approx(2.41, abs=0.01)
    assert step["compute_ms"] > 10 and step["idle_ms"] < 0.05 * step["wall_ms"]
    assert step["start_us"] - step["host_start_us"] > 8e3  # queued 8 ms behind the host


ADVICE_KEYS = ("text", "levers", "levers_text", "saving", "saving_ms", "saving_share", "saving_text", "actionable")


def test_recorded_cpu_runs_analyse_exactly_as_before(tmp_path):
    """The recorded CPU runs (tests/data/runs) against their documents from before attribution by launch
    (analysis_before_launch_attribution.json.gz, written by the code of 419fa31): identical, key by key, but for
    idle, and any cause, found in several stages: since said as one finding holding exactly the per-stage ones it
    replaced (its first stage's finding, the others in `evidence.stages`); each input's `clock_base_ns`; and what the
    speed of light added since (the model, each input's hardware, the rows' work, the stages' limits: new keys, no
    value changed); and what the advice changed on purpose (each finding's words, levers and saving, the plan, the
    fixed-cost fit): the rows, operators, measures and each finding's numbers stay as they were."""
    before = json.load(gzip.open(DATA / "runs" / "analysis_before_launch_attribution.json.gz"))
    runs = sorted(p for p in (DATA / "runs").iterdir() if p.is_dir() and p.name in before)
    assert sorted(before) == [p.name for p in runs]  # the runs recorded since (busy_micro_batches) have no old document
    merges = 0
    for run in runs:
        copy = tmp_path / run.name
        shutil.copytree(run, copy)
        doc = analyze(copy, workers=1)
        now = json.loads(json.dumps(doc, sort_keys=True, default=str).replace(str(copy), "<run>"))
        was = before[run.name]
        for i in now["inputs"]:  # each Kineto trace's clock origin, read since (the rollout's samples are put on it)
            assert i.pop("clock_base_ns", 1790857026000000000) == 1790857026000000000, i["path"]
            i.pop("hardware")
        for key in ("model", "stage_limits"):  # the speed of light's (analyze/diagnosis/speed_of_light.py)
            now.pop(key)
        # the advice's since (analyze/diagnosis/plan.py, savings on the real step, levers saying what they change, fits
        # held to physics): what a finding advises and saves, the plan and the fixed-cost fit are new words and numbers
        now.pop("plan")
        for d in (now, was):
            for f in d["findings"]:
                for key in ADVICE_KEYS:
                    f.pop(key, None)
                    for part in f["evidence"].get("stages", ()):
                        part.pop(key, None)
            d["measures"] = [m for m in d["measures"] if m["measure"] != "fixed_cost"]
            d["findings"] = [f for f in d["findings"] if f["kind"] != "small_units"]  # its evidence is the fit
            d["findings"].sort(key=lambda f: json.dumps(f, sort_keys=True))  # ranked by saving: the order is advice
        for r in now["rows"]:
            for key in (*ROW_FIELDS, "query_key_pairs", "context_tokens", "writer"):  # and who wrote the row, since
                r.pop(key, None)
        for kind in {f["kind"] for f in was["findings"]}:
            kind_was = [f for f in was["findings"] if f["kind"] == kind]
            kind_now = [f for f in now["findings"] if f["kind"] == kind]
            if len(kind_was) < 2 or not (kind == "idle" or kind in CAUSES):
                assert kind_now == kind_was, (run.name, kind)
                continue
            merges += 1
            (merged,) = kind_now
            if kind == "idle":
                assert sorted(
                    (s["role"], s["stage"], s["share"], s["bucket_ms"], s["wall_ms"])
                    for s in merged["evidence"]["stages"]
                ) == sorted(
                    (
                        f["role"],
                        f["stage"],
                        f["evidence"]["share"],
                        f["evidence"]["bucket_ms"],
                        f["evidence"]["wall_ms"],
                    )
                    for f in kind_was
                ), run.name
                continue
            parts = merged["evidence"]["stages"]
            assert sorted(
                (p["stage"], p["impact_ms"], {k: v for k, v in p.items() if k in f["evidence"]} == f["evidence"])
                for p, f in ((p, next(f for f in kind_was if f["stage"] == p["stage"])) for p in parts)
            ) == sorted((f["stage"], f["impact_ms"], True) for f in kind_was), (run.name, kind)
            assert merged["impact_ms"] == pytest.approx(sum(f["impact_ms"] for f in kind_was))
            first = next(f for f in kind_was if f["stage"] == parts[0]["stage"])
            assert {k: v for k, v in merged["evidence"].items() if k != "stages"} == first["evidence"]
        for d in (now, was):
            d["findings"] = [
                f for f in d["findings"] if len([g for g in was["findings"] if g["kind"] == f["kind"]]) < 2
            ]
        assert now == was, run.name
    assert merges >= 4  # idle in several runs, exposed communication in two


def test_training_steps_hold_the_device_time_each_step_launched():
    """A real DDP training trace where the host runs a step ahead (TraceLens' ResNet on an MI300): every kernel
    launched in a `ProfilerStep#N` range ends after the range; each step's row holds the union of what its range
    launched, and the whole-trace row stays the trace's own span."""
    name = "resnet_act_checkpoint_mi300.json.gz"
    events = json.load(gzip.open(REAL / name))["traceEvents"]
    steps = sorted(
        (e["ts"], e["ts"] + e["dur"], int(e["name"].split("#")[1]))
        for e in events
        if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
    )
    doc = analyze(REAL / name, workers=1)
    rows = {r["index"]: r for r in doc["rows"] if r["unit"] == "profiler_step"}
    assert sorted(rows) == [n for _, _, n in steps]
    for lo, hi, n in steps:
        work = _launched(events, lo, hi)
        kernels = [e for e in work if e["cat"] == "kernel"]
        assert len(kernels) == 746 and all(e["ts"] + e["dur"] > hi for e in kernels)
        busy, window = _device_time(work)
        row = rows[n]
        assert row["step"] == n and row["attribution"] == "launch"
        assert row["wall_ms"] - row["idle_ms"] == pytest.approx(busy / 1e3, rel=0.01)
        assert row["wall_ms"] == pytest.approx(window / 1e3, rel=0.01)
    (whole,) = [r for r in doc["rows"] if r["unit"] is None]
    device = [
        (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        for e in events
        if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS
    ]
    assert whole["wall_ms"] - whole["idle_ms"] == pytest.approx(union(device) / 1e3, rel=1e-6)


# ---- Ascend: mstx stage ranges on real torch_npu collections (MindStudio Insight's, level1) --------------------
STAGE_RANGES = ("ActorHybridWorkerBase.compute_log_prob", "ActorHybridWorkerBase.update")  # MindSpeed-RL's names


def _split_by_launch(step_lo, step_hi, launches):
    """Two host ranges splitting the step where half of its operators were launched before."""
    cut = sorted(x for x in launches if step_lo <= x <= step_hi)[len(launches) // 2]
    return [(step_lo, cut), (cut, step_hi)]


def _check_stage_rows(doc, ranges, ops, scale):
    """Each stage row's compute is the union of the operators (start, end, launch) its host range launched."""
    rows = {r["stage"]: r for r in doc["rows"] if r["unit"] is None and r["stage"] is not None}
    assert sorted(rows) == ["actor_compute_log_prob", "actor_update"]
    ran_after = 0
    for stage, (lo, hi) in zip(("actor_compute_log_prob", "actor_update"), ranges):
        mine = [(s, e) for s, e, at in ops if lo <= at <= hi]
        ran_after += sum(1 for s, _ in mine if s > hi)
        row = rows[stage]
        assert row["attribution"] in ("launch", "launch+time")
        assert row["compute_ms"] == pytest.approx(float(union(mine)) * scale, rel=0.01)
        assert row["host_wall_ms"] == pytest.approx(float(hi - lo) * scale, rel=1e-6)
    assert ran_after > 0  # some operators a range enqueued ran after it closed: the case attribution is for


def test_text_export_stage_rows_hold_the_tasks_their_ranges_enqueued(msinsight, tmp_path):
    import csv
    from decimal import Decimal

    src = msinsight / "text" / "level1" / "rank0_ascend_pt"
    run = tmp_path / "rank0_ascend_pt"
    shutil.copytree(src, run)
    view = run / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    events = json.loads(view.read_text())
    flow_from = {e["id"]: Decimal(e["ts"]) for e in events if e.get("ph") == "s" and e.get("cat") == "async_npu"}
    launch_at = {
        Decimal(e["ts"]): flow_from[e["id"]]
        for e in events
        if e.get("ph") == "f" and e.get("cat") == "async_npu" and e["id"] in flow_from
    }
    with open(run / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["Accelerator Core"] != "HCCL"]
    ops = [
        (
            Decimal(r["Start Time(us)"].strip()),
            Decimal(r["Start Time(us)"].strip()) + Decimal(r["Duration(us)"]),
            launch_at[Decimal(r["Start Time(us)"].strip())],
        )
        for r in rows
    ]
    assert len(ops) == 187  # every operator task of the step is linked to the torch op that enqueued it
    step = next(e for e in events if e.get("name") == "ProfilerStep#50")
    lo = Decimal(step["ts"])
    ranges = _split_by_launch(lo, lo + Decimal(str(step["dur"])), [at for _, _, at in ops])
    for name, (a, b) in zip(STAGE_RANGES, ranges):
        events.append(
            {
                "ph": "X",
                "name": name,
                "pid": step["pid"],
                "tid": step["tid"],
                "ts": str(a),
                "dur": float(b - a),
                "args": {},
            }
        )
    view.write_text(json.dumps(events))
    _check_stage_rows(analyze(run, workers=1), ranges, ops, 1e-3)


def test_db_export_stage_rows_hold_the_tasks_their_ranges_enqueued(msinsight, tmp_path):
    import sqlite3

    src = msinsight / "db" / "level1" / "rank0_ascend_pt"
    run = tmp_path / "rank0_ascend_pt"
    shutil.copytree(src, run)
    (db,) = (run / "ASCEND_PROFILER_OUTPUT").glob("ascend_pytorch_profiler_*.db")
    conn = sqlite3.connect(db)
    # the db's links: a task's connectionId is listed under the torch op (type 50001) that enqueued it
    listed = dict(conn.execute("SELECT connectionId, id FROM CONNECTION_IDS"))
    op_start = {}
    for start, cid in conn.execute("SELECT startNs, connectionId FROM PYTORCH_API WHERE type = 50001"):
        if cid is not None:
            op_start[cid] = min(int(start), op_start.get(cid, int(start)))
    tasks = conn.execute(
        "SELECT t.startNs, t.endNs, t.connectionId FROM TASK t JOIN COMPUTE_TASK_INFO c "
        "ON c.globalTaskId = t.globalTaskId"
    ).fetchall()
    ops = [(s, e, op_start[listed[c]]) for s, e, c in tasks if listed.get(c) in op_start]
    assert len(ops) == len(tasks) == 187
    ((lo, hi),) = conn.execute("SELECT startNs, endNs FROM STEP_TIME").fetchall()
    main_tid = conn.execute(
        "SELECT globalTid FROM PYTORCH_API WHERE type = 50001 GROUP BY globalTid ORDER BY count(*) DESC LIMIT 1"
    ).fetchone()[0]
    ranges = _split_by_launch(lo, hi, [at for _, _, at in ops])
    top = conn.execute("SELECT max(id) FROM STRING_IDS").fetchone()[0]
    conn.executemany("INSERT INTO STRING_IDS VALUES (?, ?)", [(top + 1 + i, n) for i, n in enumerate(STAGE_RANGES)])
    conn.execute(
        "CREATE TABLE MSTX_EVENTS (startNs INTEGER, endNs INTEGER, eventType INTEGER, rangeId INTEGER, "
        "category INTEGER, message INTEGER, globalTid INTEGER, endGlobalTid INTEGER, domainId INTEGER, "
        "connectionId INTEGER)"
    )
    conn.executemany(
        "INSERT INTO MSTX_EVENTS VALUES (?, ?, 2, ?, 0, ?, ?, ?, 0, NULL)",
        [(a, b, i, top + 1 + i, main_tid, main_tid) for i, (a, b) in enumerate(ranges)],
    )
    conn.commit()
    conn.close()
    _check_stage_rows(analyze(run, workers=1), ranges, ops, 1e-6)


def test_slice_of_a_micro_batch_keeps_the_kernels_it_launched(tmp_path):
    """`rlprof slice --micro-batch K` on a trace where the device runs a step behind: the slice holds exactly the
    device events K's host range launched (all of which ran after it), and none another range launched."""
    from conftest import run_cli

    trace = json.load(gzip.open(REAL / "resnet_act_checkpoint_mi300.json.gz"))
    events = trace["traceEvents"]
    steps = sorted(
        (e["ts"], e["dur"])
        for e in events
        if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
    )
    host = next(e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    marks = [("rlprof:stage:actor_update", steps[0][0], steps[-1][0] + steps[-1][1] - steps[0][0])]
    marks += [(f"rlprof:micro_batch:{k}", ts, dur) for k, (ts, dur) in enumerate(steps)]
    for name, ts, dur in marks:
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": name,
                "pid": host["pid"],
                "tid": host["tid"],
                "ts": ts,
                "dur": dur,
            }
        )
    path = tmp_path / "marked.pt.trace.json"
    path.write_text(json.dumps(trace))
    out = tmp_path / "mb1.json"
    proc = run_cli(
        "slice", path, "--step", 1, "--role", "actor", "--stage", "actor_update", "--micro-batch", 1, "-o", out
    )
    assert proc.returncode == 0, proc.stderr
    lo, hi = steps[1][0], steps[1][0] + steps[1][1]
    launched = {(e["ts"], e["name"]) for e in _launched(events, lo, hi)}
    kept = {
        (e["ts"], e["name"])
        for e in json.loads(out.read_text())["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS
    }
    assert kept == launched and len(kept) > 746
    assert json.loads(out.read_text())["rlprof"]["slice"]["device_end_us"] > hi


def test_report_timeline_draws_the_device_lane_beside_the_host_lane():
    """The report's timeline: a decode step's host range on the host lane, the device window of what it launched
    on the device lane, starting when its first launched kernel started (from the raw JSON)."""
    from rlprof.report.charts import timeline

    name = "vllm_decode_full_graph_mi300x.json.gz"
    events = json.load(gzip.open(REAL / name))["traceEvents"]
    (it,) = [e for e in events if e.get("cat") == "user_annotation" and re.match(r"execute_\d+_context_", e["name"])]
    work = _launched(events, it["ts"], it["ts"] + it["dur"])
    first = min(float(e["ts"]) for e in work)
    bars = {t["name"]: t for t in timeline(analyze(REAL / name, workers=1))["data"]}
    host, device = bars["host range"], bars["rollout_generate"]
    assert host["y"] == ["rank 0 host"] and device["y"] == ["rank 0 device"]
    assert host["x"][0] == pytest.approx(it["dur"] / 1e3, rel=1e-6)
    assert device["base"][0] - host["base"][0] == pytest.approx((first - it["ts"]) / 1e3, rel=1e-6)


def test_fixed_cost_fit_is_computed_on_the_device_time_each_micro_batch_launched(tmp_path):
    """Micro-batch rows on the real ResNet trace (each ProfilerStep's host range cut in two, with token counts
    written into the range names as rlprof's trainer writes them): each row's wall is the device window of what
    its range launched, and fixed_cost fits those walls (recomputed here from the raw JSON)."""
    import numpy as np

    from rlprof.analyze.diagnosis.measures import fit_fixed_cost

    trace = json.load(gzip.open(REAL / "resnet_act_checkpoint_mi300.json.gz"))
    events = trace["traceEvents"]
    steps = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
    )
    host = next(e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    halves = [h for lo, hi in steps for h in ((lo, (lo + hi) / 2), ((lo + hi) / 2, hi))]
    tokens = [100 * (k + 1) for k in range(len(halves))]
    marks = [("rlprof:stage:actor_update", steps[0][0], steps[-1][1])]
    marks += [
        (f"rlprof:micro_batch:{k}|seqs=4,tokens={n}", lo, hi) for k, ((lo, hi), n) in enumerate(zip(halves, tokens))
    ]
    for name, lo, hi in marks:
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": name,
                "pid": host["pid"],
                "tid": host["tid"],
                "ts": lo,
                "dur": hi - lo,
            }
        )
    path = tmp_path / "micro.pt.trace.json"
    path.write_text(json.dumps(trace))
    doc = analyze(path, workers=1)
    rows = sorted((r for r in doc["rows"] if r["unit"] == "micro_batch"), key=lambda r: r["index"])
    walls = []
    for (lo, hi), row in zip(halves, rows):
        busy, window = _device_time(_launched(events, lo, hi))
        assert row["wall_ms"] == pytest.approx(window / 1e3, rel=1e-6)
        assert row["wall_ms"] - row["idle_ms"] == pytest.approx(busy / 1e3, rel=1e-6)
        walls.append(window / 1e3)
    # the fit's own rule (least squares over the units a burst did not slow, no negative part) on the walls here
    mine = fit_fixed_cost(np.array(tokens, float), np.array(walls))
    (fit,) = [m for m in doc["measures"] if m["measure"] == "fixed_cost"]
    assert fit["micro_batches"] == int(mine.kept.sum()) and fit["status"] == (
        "not measurable" if mine.broken else "measured"
    )
    assert fit["fixed_ms"] == pytest.approx(mine.fixed, rel=1e-6, abs=1e-9)
    kept = np.array(walls)[mine.kept]
    assert fit["value"] == (None if mine.broken else pytest.approx(mine.fixed / kept.mean(), rel=1e-6, abs=1e-9))


def test_compare_matches_stages_and_kernels_by_what_each_range_launched():
    """`rlprof compare` of two real vLLM iterations (piecewise graphs against the full graph): the stage's compute
    on each side is the union of the kernels its host range launched, and every kernel it launched is compared
    inside the stage (none left outside it)."""
    from rlprof.compare import compare

    base, new = INFERENCE[0], INFERENCE[1]
    out = compare(str(REAL / new), str(REAL / base), workers=1)
    (compute,) = [s for s in out["stages"] if s["bucket"] == "compute" and s["stage"] == "rollout_generate"]
    for side, name in (("baseline", base), ("new", new)):
        events = json.load(gzip.open(REAL / name))["traceEvents"]
        (it,) = [
            e for e in events if e.get("cat") == "user_annotation" and re.match(r"execute_\d+_context_", e["name"])
        ]
        work = _launched(events, it["ts"], it["ts"] + it["dur"])
        kernels = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in work if e["cat"] == "kernel"]
        assert compute[f"{side}_ms"] == pytest.approx(union(kernels) / 1e3, rel=0.01)
        counted = sum(
            o[f"{side}_count"] for o in out["ops"] if o["kind"] == "kernel" and o["stage"] == "rollout_generate"
        )
        assert counted == len(work)

"""`rlprof analyze` on real traces: buckets recomputed independently, damaged input, exports."""

import gzip
import json
import shutil
from decimal import Decimal

import pytest

from conftest import REAL, run_cli
from helpers import complete_events, union

BUCKETS = ("compute_ms", "comm_ms", "overlap_ms", "memcpy_ms", "idle_ms")


def analyze_json(path, cwd=None):
    proc = run_cli("analyze", path, "--json", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def test_gpu_nccl_buckets_match_independent_interval_unions():
    doc, _ = analyze_json(REAL / "gpu_nccl_rank0.json.gz")
    (row,) = [r for r in doc["rows"] if r["unit"] is None]  # the whole trace (its ProfilerStep# rows beside it)
    assert row["rank"] == 0 and row["step"] is None and row["stage"] is None
    with gzip.open(REAL / "gpu_nccl_rank0.json.gz", "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    iv = lambda e: (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))  # noqa: E731
    nccl = [iv(e) for e in events if e.get("cat") == "kernel" and e["name"].lower().startswith("nccl")]
    compute = [iv(e) for e in events if e.get("cat") == "kernel" and not e["name"].lower().startswith("nccl")]
    copies = [iv(e) for e in events if e.get("cat") in ("gpu_memcpy", "gpu_memset")]
    assert len(nccl) == 80
    span = max(e for _, e in map(iv, events)) - min(s for s, _ in map(iv, events))
    c, m, cm, busy = union(compute), union(nccl), union(compute + nccl), union(compute + nccl + copies)
    expected = {
        "compute_ms": c,
        "comm_ms": cm - c,
        "overlap_ms": c + m - cm,
        "memcpy_ms": busy - cm,
        "idle_ms": span - busy,
        "wall_ms": span,
    }
    for key, value in expected.items():
        assert row[key] == pytest.approx(value / 1e3, rel=1e-9, abs=1e-6), key
    assert sum(row[b] for b in BUCKETS if b != "overlap_ms") == pytest.approx(row["wall_ms"], rel=1e-9)
    (coll,) = doc["collectives"]
    assert coll["count"] == 80 and coll["name"].startswith("ncclKernel_SendRecv")
    assert row["comm_ms"] > 0 and doc["launch"][0]["launches"] > 0


def test_cpu_only_trace_counts_gloo_as_communication():
    doc, _ = analyze_json(REAL / "cpu_only_rank34.json.gz")
    (row,) = doc["rows"]
    assert row["rank"] == 34
    assert row["comm_ms"] > 1000 and row["compute_ms"] < 1
    assert [(c["name"], c["count"]) for c in doc["collectives"]] == [("gloo:all_reduce", 10)]


def test_rocm_and_compact_layouts_are_read():
    for name in ("rocm_mi250_train.json.gz", "compare_base.json.gz"):
        doc, _ = analyze_json(REAL / name)
        assert doc["inputs"][0]["events"] > 0 and not doc["partial"]
        assert doc["inputs"][0]["device"] is True


def test_trainer_run_rows_per_stage_with_units(tmp_path):
    a = "actor_rollout_ref.actor.profiler"
    proc = run_cli(
        "train",
        "trainer.steps=2",
        f"trainer.output_dir={tmp_path}/t",
        "global_profiler.tool=torch",
        "global_profiler.steps=[2]",
        f"global_profiler.save_path={tmp_path}/p",
        f"{a}.enable=true",
        f"{a}.tool_config.torch.discrete=true",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    (run,) = list((tmp_path / "p").iterdir())
    doc, _ = analyze_json(run)
    stages = {(r["step"], r["role"], r["stage"], r["rank"]) for r in doc["rows"] if r["unit"] is None}
    assert stages == {
        (2, "rollout", "rollout_generate", 0),
        (2, "ref", "ref_compute_log_prob", 0),
        (2, "actor", "actor_compute_log_prob", 0),
        (2, "actor", "advantage_compute", 0),
        (2, "actor", "actor_update", 0),
    }
    micro = [r for r in doc["rows"] if r["stage"] == "actor_update" and r["unit"] == "micro_batch"]
    assert sorted(r["index"] for r in micro) == list(range(8))
    decode = [r for r in doc["rows"] if r["unit"] == "decode_step"]
    assert decode and all(r["stage"] == "rollout_generate" for r in decode)
    for r in doc["rows"]:
        parts = r["compute_ms"] + r["comm_ms"] + r["memcpy_ms"] + r["idle_ms"]
        assert parts == pytest.approx(r["wall_ms"], rel=1e-6, abs=1e-6)


def _copy(tmp_path, name):
    dst = tmp_path / name
    shutil.copy(REAL / name, dst)
    return dst


def test_truncated_gzip_keeps_events_before_the_damage(tmp_path):
    data = (REAL / "gpu_nccl_rank0.json.gz").read_bytes()
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(data[: len(data) // 2])
    doc, err = analyze_json(cut)
    assert doc["partial"] is True
    assert 0 < doc["inputs"][0]["events"] < 67217
    assert "cut.json.gz" in err and "byte" in err


def test_file_cut_mid_event(tmp_path):
    raw = gzip.open(REAL / "rocm_mi250_train.json.gz").read()
    cut = tmp_path / "mid.json"
    cut.write_bytes(raw[: int(len(raw) * 0.6)])
    doc, err = analyze_json(cut)
    assert doc["partial"] and 0 < doc["inputs"][0]["events"] < 113
    assert "mid.json" in err and "byte" in err


@pytest.mark.parametrize(
    "content,what", [(b"", "empty"), (b'{"hello": 1}', "traceEvents"), (b"not json at all", "not a readable trace")]
)
def test_unreadable_single_file_exits_2(tmp_path, content, what):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    proc = run_cli("analyze", bad)
    assert proc.returncode == 2
    assert "bad.json" in proc.stderr and what in proc.stderr and "Traceback" not in proc.stderr


def test_directory_without_traces_exits_2(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    proc = run_cli("analyze", tmp_path)
    assert proc.returncode == 2 and "no trace files" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_exports_csv_and_duckdb(tmp_path):
    trace = _copy(tmp_path, "gpu_nccl_rank0.json.gz")
    proc = run_cli("analyze", trace, "-o", tmp_path / "csv")
    assert proc.returncode == 0, proc.stderr
    assert {p.name for p in (tmp_path / "csv").iterdir()} >= {"analysis.json", "rows.csv", "ops.csv", "collectives.csv"}
    doc = json.loads((tmp_path / "csv" / "analysis.json").read_text())
    assert doc["schema_version"] == 1
    proc = run_cli("analyze", trace, "-o", tmp_path / "db", "--export", "db")
    assert proc.returncode == 0, proc.stderr
    import duckdb

    con = duckdb.connect(str(tmp_path / "db" / "analysis.duckdb"), read_only=True)
    (count,) = con.execute("SELECT sum(count) FROM collectives WHERE name LIKE 'nccl%'").fetchone()
    assert count == 80
    (wall,) = con.execute("SELECT wall_ms FROM rows").fetchone()
    assert wall == pytest.approx(doc["rows"][0]["wall_ms"])


@pytest.mark.slow
def test_ray_gives_the_same_numbers_as_local(tmp_path):
    _copy(tmp_path, "gpu_nccl_rank0.json.gz")
    _copy(tmp_path, "cpu_only_rank34.json.gz")
    local, _ = analyze_json(tmp_path)
    proc = run_cli("analyze", tmp_path, "--json", "--ray", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    remote = json.loads(proc.stdout)
    assert remote["rows"] == local["rows"] and len([r for r in local["rows"] if r["unit"] is None]) == 2
    assert remote["ops"] == local["ops"]


def test_ascend_output_directory(tmp_path):
    """msprof-analyze's real trace_view.json (an older CANN: every task typed "Other"): computing is the union of
    the operator tasks, equal to the exporter's own Overlap Analysis drawing; its kernel_details.csv, from another
    run, is named as such and not mixed in. Alone, kernel_details.csv gives the operators by their Type."""
    import csv
    from collections import Counter

    doc, _ = analyze_json(REAL / "ascend")
    assert doc["inputs"][0]["kind"] == "ascend" and doc["inputs"][0]["events"] > 0
    assert any("kernel_details.csv" in w and "another run" in w for w in doc["warnings"])
    events = json.loads((REAL / "ascend" / "trace_view.json").read_text())
    assert isinstance(events[0]["ts"], str)  # string timestamps, parsed
    pid = {e["args"]["name"]: str(e["pid"]) for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    lane_of = {
        (str(e["pid"]), str(e["tid"])): e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e["name"] == "thread_name"
    }
    lanes = {}
    for e in events:
        if e.get("ph") == "X" and str(e["pid"]) in (pid["Overlap Analysis"], pid["Ascend Hardware"]):
            t0 = Decimal(e["ts"])  # exact: epoch µs as float64 would round each edge to a quarter µs
            lane = lane_of[(str(e["pid"]), str(e["tid"]))] if str(e["pid"]) == pid["Overlap Analysis"] else "tasks"
            lanes.setdefault(lane, []).append((t0, t0 + Decimal(str(e["dur"]))))
    (row,) = doc["rows"]  # ProfilerStep#1, narrowed to its device activity as the Ascend step trace counts it
    assert row["step"] == 1
    # the exporter's own lanes, which rlprof skips and recomputes from the tasks
    assert row["compute_ms"] == pytest.approx(float(union(lanes["Computing"])) / 1e3, rel=1e-6)
    assert row["idle_ms"] == pytest.approx(float(union(lanes["Free"])) / 1e3, rel=1e-6)
    assert row["wall_ms"] == pytest.approx(
        float(max(e for _, e in lanes["tasks"]) - min(s for s, _ in lanes["tasks"])) / 1e3, rel=1e-9
    )
    assert row["idle_ms"] == pytest.approx(row["wall_ms"] - row["compute_ms"] - row["comm_ms"], abs=1e-9)
    kernels = {o["name"] for o in doc["ops"] if o["kind"] == "kernel"}
    assert "MEMCPY_ASYNC" not in kernels and "aclnnMm_MatMulCommon_MatMulV2" in kernels  # the runtime's copies
    out = tmp_path / "r_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    shutil.copy(REAL / "ascend" / "kernel_details.csv", out)
    doc, _ = analyze_json(tmp_path)
    with open(REAL / "ascend" / "kernel_details.csv", newline="") as f:
        kinds = Counter(r["Type"] for r in csv.DictReader(f))
    kernels = {o["name"]: o["count"] for o in doc["ops"] if o["kind"] == "kernel"}
    assert kernels["MatMul"] == kinds["MatMul"] and kernels["Cast"] == kinds["Cast"]  # from kernel_details.csv
    hccl = {c["name"]: c["count"] for c in doc["collectives"]}
    assert hccl["hcom_allReduce_"] == kinds["hcom_allReduce_"] > 0  # HCCL tasks are communication


def test_step_trace_time_csv(tmp_path):
    out = tmp_path / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    (out / "step_trace_time.csv").write_text(
        "Step,Computing,Communication(Not Overlapped),Overlapped,Communication,Free,Stage,Bubble,"
        "Communication(Not Overlapped and Exclude Receive),Preparing\n"
        "1,1000.0,500.0,250.0,750.0,200.0,0,0,500.0,0\n2,1100.0,400.0,300.0,700.0,100.0,0,0,400.0,0\n"
    )
    doc, _ = analyze_json(tmp_path)
    assert [(r["step"], r["compute_ms"], r["comm_ms"], r["overlap_ms"], r["idle_ms"]) for r in doc["rows"]] == [
        (1, 1.0, 0.5, 0.25, 0.2),
        (2, 1.1, 0.4, 0.3, 0.1),
    ]


class _Evil:
    def __reduce__(self):
        import os

        return (os.system, ("touch pwned",))


def test_malicious_memory_snapshot_is_refused(tmp_path):
    import pickle

    bad = tmp_path / "step1_actor_e2e_rank0.memory_snapshot.pickle"
    bad.write_bytes(pickle.dumps({"segments": [], "device_traces": [[_Evil()]]}))
    proc = run_cli("analyze", bad, cwd=tmp_path)
    assert proc.returncode == 2
    assert "refused" in proc.stderr and ("posix.system" in proc.stderr or "os.system" in proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "pwned").exists()


def test_memory_snapshot_peak_and_timeline(tmp_path):
    import pickle

    snap = {
        "segments": [{"total_size": 4096, "blocks": [{"size": 1024, "state": "active_allocated"}]}],
        "device_traces": [
            [
                {"action": "alloc", "size": 1024, "time_us": 1},
                {"action": "alloc", "size": 2048, "time_us": 2},
                {"action": "free_completed", "size": 2048, "time_us": 3},
            ]
        ],
    }
    path = tmp_path / "snap.memory_snapshot.pickle"
    path.write_bytes(pickle.dumps(snap))
    doc, _ = analyze_json(path)
    (mem,) = doc["memory"]
    assert mem["peak_bytes"] == 3072 and mem["reserved_bytes"] == 4096
    assert mem["timeline"] == [[1.0, 1024.0], [2.0, 3072.0], [3.0, 1024.0]]


def test_self_time_of_nested_ops():
    import numpy as np

    from rlprof.analyze.window.ops import self_times, top_ops
    from rlprof.analyze.tables.table import CPU_OP, EventTable

    # thread 0: A [0,100) holds B [10,40) (which holds C [15,25)) and D [50,60); thread 1: E [0,30)
    start = np.array([0, 10, 15, 50, 0], dtype=float)
    end = np.array([100, 40, 25, 60, 30], dtype=float)
    t = EventTable(
        start,
        end,
        np.full(5, CPU_OP, np.uint8),
        np.arange(5, dtype=np.int32),
        np.array([0, 0, 0, 0, 1], dtype=np.int32),
        names=list("ABCDE"),
        threads=["t0", "t1"],
    )
    assert self_times(t, np.arange(5)).tolist() == [60, 20, 10, 10, 30]
    ops = {o["name"]: o for o in top_ops(t)}
    assert ops["A"]["self_ms"] == 0.06 and ops["A"]["total_ms"] == 0.1 and ops["A"]["count"] == 1


def test_self_times_in_segments_equal_the_whole(monkeypatch):
    import numpy as np

    import rlprof.analyze.window.ops as ops
    from rlprof.analyze.inputs.readers.kineto import read_kineto
    from rlprof.analyze.tables.table import CPU_OP

    t = read_kineto(REAL / "gpu_nccl_rank0.json.gz").table
    sel = np.flatnonzero(t.kind == CPU_OP)
    whole = ops.self_times(t, sel)
    monkeypatch.setattr(ops, "SEGMENT", 500)
    assert np.allclose(ops.self_times(t, sel), whole)
    assert whole.sum() <= (t.end[sel] - t.start[sel]).sum()


def test_markers_timeline_windows_are_analysed(tmp_path):
    a = "actor_rollout_ref.actor.profiler"
    proc = run_cli(
        "train",
        "trainer.steps=2",
        f"trainer.output_dir={tmp_path}/t",
        "global_profiler.tool=markers",
        "global_profiler.steps=[2]",
        f"global_profiler.save_path={tmp_path}/p",
        f"{a}.enable=true",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    (run,) = list((tmp_path / "p").iterdir())
    doc, _ = analyze_json(run)
    stages = [r["stage"] for r in doc["rows"] if r["unit"] is None]
    assert stages == [
        "rollout_generate",
        "reward_compute",
        "ref_compute_log_prob",
        "actor_compute_log_prob",
        "advantage_compute",
        "actor_update",
    ]
    assert any(r["unit"] == "decode_step" for r in doc["rows"])


def test_kernels_belong_to_the_stage_that_launched_them(tmp_path):
    """A kernel queued at a stage's end runs in the next stage's time; Kineto's ac2g flows and correlation ids
    tie it to its launch, so its stage is the launching one; one launched before the trace began (its id below
    every launch call's) belongs to no stage. Two stage ranges split the real NCCL rank; counts recomputed here."""
    trace = json.loads(gzip.open(REAL / "gpu_nccl_rank0.json.gz").read())
    events = trace["traceEvents"]
    host = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    lo, hi = min(e["ts"] for e in host), max(e["ts"] + e["dur"] for e in host)
    launch = {e["id"]: e["ts"] for e in events if e.get("ph") == "s" and e.get("cat") == "ac2g"}
    arrive = {(e["pid"], e["tid"], e["ts"]): e["id"] for e in events if e.get("ph") == "f" and e.get("cat") == "ac2g"}
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    calls = {
        e["args"]["correlation"]: e["ts"]
        for e in events
        if e.get("ph") == "X" and e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    launched = {
        id(k): launch.get(arrive.get((k["pid"], k["tid"], k["ts"])), calls.get(k["args"]["correlation"]))
        for k in kernels
    }
    before = {id(k) for k in kernels if k["args"]["correlation"] < min(calls)}
    assert before and all(launched[id(k)] is None for k in kernels if id(k) in before)
    # the cut: where the most kernels were launched before it but run after it
    cut = sorted(launched[id(k)] for k in kernels if launched[id(k)] is not None)[len(kernels) // 2]
    pid, tid = host[0]["pid"], host[0]["tid"]
    for name, a, b in (("actor_compute_log_prob", lo, cut), ("actor_update", cut, hi)):
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"rlprof:stage:{name}",
                "pid": pid,
                "tid": tid,
                "ts": a,
                "dur": b - a,
            }
        )
    path = tmp_path / "staged.pt.trace.json"
    path.write_text(json.dumps(trace))
    from rlprof.analyze.pipeline import analyze

    doc = analyze(path, workers=1, top=None)  # every kernel name, not the top 50 per window
    mine = sum(o["count"] for o in doc["ops"] if o["kind"] == "kernel" and o["stage"] == "actor_compute_log_prob")
    placed = [launched[id(k)] if launched[id(k)] is not None else k["ts"] for k in kernels if id(k) not in before]
    by_launch = sum(1 for t in placed if lo <= t < cut)  # a window holds [start, next window)
    by_start = sum(1 for k in kernels if lo <= k["ts"] < cut)
    assert by_launch != by_start  # the split is one where the two placements disagree
    assert mine == by_launch


@pytest.mark.parametrize("n", [50_000, 300_000, 700_000, 1_000_000])
def test_a_cut_gzip_keeps_every_event_it_could_decompress(tmp_path, n):
    import re
    import zlib

    cut = tmp_path / "cut.json.gz"
    cut.write_bytes((REAL / "gpu_nccl_rank0.json.gz").read_bytes()[:n])
    decompressable = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(cut.read_bytes())
    events, last_end = complete_events(decompressable)
    proc = run_cli("analyze", cut, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["partial"] is True
    (warning,) = [w for w in doc["warnings"] if "ends early" in w]
    offset = int(re.search(r"byte (\d+)", warning).group(1))
    assert last_end - 2 <= offset <= len(decompressable) and len(decompressable) - offset < 5_000
    # the events kept are exactly the complete ones before the cut: the same numbers as those events written whole
    whole = tmp_path / "whole.json"
    whole.write_text(json.dumps({"traceEvents": events}))
    ref = json.loads(run_cli("analyze", whole, "--json").stdout)
    whole_row = lambda d: [r for r in d["rows"] if r["unit"] is None]  # noqa: E731 (its ProfilerStep# rows beside it)
    (row,), (ref_row,) = whole_row(doc), whole_row(ref)
    assert ref["partial"] is False and doc["inputs"][0]["events"] == ref["inputs"][0]["events"]
    assert doc["inputs"][0]["device"] is True  # a GPU trace stays one, whatever the cut left of it
    compute = [
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("cat") == "kernel" and not e["name"].lower().startswith("nccl")
    ]
    # what the kept events leave uncovered may be the lost events' time: unknown, and idle its lower bound (0)
    assert row["idle_ms"] == 0
    assert row["unknown_ms"] == pytest.approx(row["wall_ms"] - row["compute_ms"] - row["comm_ms"] - row["memcpy_ms"])
    if any(e.get("cat") == "kernel" for e in events):  # the same numbers as those events written whole
        busy = [k for k in BUCKETS if k != "idle_ms"]
        assert {k: row[k] for k in busy} == pytest.approx({k: ref_row[k] for k in busy})
        assert row["unknown_ms"] == pytest.approx(ref_row["idle_ms"])
        assert row["compute_ms"] == pytest.approx(union(compute) / 1e3)
    else:  # no kernel kept: compute is kernel time all the same (none), never CPU-operator time
        assert row["compute_ms"] == 0 and row["wall_ms"] == pytest.approx(ref_row["wall_ms"])
        assert any("holds no device activity" in w for w in doc["warnings"])
    (full,) = whole_row(json.loads(run_cli("analyze", REAL / "gpu_nccl_rank0.json.gz", "--json").stdout))
    assert all(row[k] <= full[k] for k in BUCKETS)  # a lower bound


def test_unusable_times_are_dropped_counted_and_never_printed(tmp_path):
    good = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 100 + 10 * k, "dur": 5}
        for k in range(5)
    ]
    bad = [
        {"ph": "X", "cat": "cpu_op", "name": "nan_ts", "pid": 1, "tid": 1, "ts": "NaN", "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": "negative", "pid": 1, "tid": 1, "ts": 120, "dur": -50},
        {"ph": "X", "cat": "cpu_op", "name": "huge", "pid": 1, "tid": 1, "ts": 1e300, "dur": 1e300},
        {"ph": "X", "cat": "cpu_op", "name": "no_ts", "pid": 1, "tid": 1, "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": "word_ts", "pid": 1, "tid": 1, "ts": "soon", "dur": 5},
    ]
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"traceEvents": good + bad}))
    proc = run_cli("analyze", path, "--json")
    assert proc.returncode == 0, proc.stderr
    assert "Warning" not in proc.stderr  # no numpy / Python warning leaks

    def refuse(constant):
        raise AssertionError(f"non-finite number in the output: {constant}")

    doc = json.loads(proc.stdout, parse_constant=refuse)
    (warning,) = [w for w in doc["warnings"] if "dropped" in w]
    assert "dropped 5 event(s)" in warning and "ts" in warning and "dur" in warning
    (row,) = doc["rows"]
    assert row["wall_ms"] == pytest.approx(0.045) and row["compute_ms"] == pytest.approx(0.025)
    assert {o["name"] for o in doc["ops"]} == {"aten::mm"}


def test_pytorch_1_8_capitalised_categories_are_read(tmp_path):
    """torch-tb-profiler era traces: Operator / Kernel / Runtime / Memcpy, not cpu_op / kernel / cuda_runtime."""
    events = [
        {"ph": "X", "cat": "Operator", "name": "aten::conv2d", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 10, "dur": 5},
        {"ph": "X", "cat": "Kernel", "name": "implicit_gemm", "pid": 0, "tid": 7, "ts": 20, "dur": 60},
        {"ph": "X", "cat": "Memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": 7, "ts": 90, "dur": 5},
    ]
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"traceEvents": events}))
    doc, _ = analyze_json(path)
    (row,) = doc["rows"]
    assert row["compute_ms"] == pytest.approx(0.060) and row["memcpy_ms"] == pytest.approx(0.005)
    assert {o["name"] for o in doc["ops"]} >= {"aten::conv2d", "implicit_gemm"}
    assert not [w for w in doc["warnings"] if "categories" in w]


def test_mostly_unknown_categories_warn_instead_of_reporting_zeros(tmp_path):
    events = [
        {"ph": "X", "cat": "Mystery", "name": f"op{k}", "pid": 1, "tid": 1, "ts": 10 * k, "dur": 5} for k in range(9)
    ] + [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 100, "dur": 5}]
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"traceEvents": events}))
    doc, _ = analyze_json(path)
    (warning,) = [w for w in doc["warnings"] if "categories" in w]
    assert "9 of 10 events" in warning and "'Mystery'" in warning


def test_a_partly_copied_run_directory_goes_on(tmp_path):
    """A manifest row whose file is missing, a line that is not a row, a row whose path is not text, an event
    name that is not UTF-8: each is a warning naming the file; the readable windows are analysed."""
    run = tmp_path / "run"
    run.mkdir()
    good = json.loads(gzip.open(REAL / "cpu_only_rank34.json.gz").read())
    (run / "good.json").write_text(json.dumps(good))
    raw = (
        json.dumps(
            {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "NAME", "pid": 1, "tid": 1, "ts": 1, "dur": 1}]}
        )
        .encode()
        .replace(b"NAME", b"bad\xff\xfename")
    )
    (run / "bad_utf8.json").write_bytes(raw)
    rows = [
        {"path": "good.json", "step": 2, "role": "actor", "stage": "e2e", "rank": 0, "status": "complete"},
        {"path": "gone.json", "step": 3, "role": "actor", "stage": "e2e", "rank": 0, "status": "complete"},
        {"path": "bad_utf8.json", "step": "4", "role": "actor", "stage": "e2e", "rank": 0, "status": "complete"},
        [1, 2, 3],
        {"path": 17, "status": "complete"},
    ]
    (run / "manifest.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    proc = run_cli("analyze", run, "--json")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    doc = json.loads(proc.stdout)
    assert any(r["step"] == 2 for r in doc["rows"])
    assert any("gone.json" in w for w in doc["warnings"])
    assert any("bad_utf8.json" in w for w in doc["warnings"])
    for cmd in (("report", run, "-o", tmp_path / "r.html"), ("cluster", run, "--json"), ("advise", run)):
        proc = run_cli(*cmd)  # steps of mixed types (2 and "4") sort everywhere
        assert "Traceback" not in proc.stderr, (cmd, proc.stderr[-1500:])


def test_other_writers_layouts_unterminated_array_and_damage(tmp_path):
    events = [
        {"ph": "X", "cat": "cpu_op", "name": f"op{k}", "pid": "p1", "tid": "t1", "ts": str(10 * k), "dur": 5}
        for k in range(4)
    ]
    unterminated = tmp_path / "unterminated.json"  # the Trace Event Format's array form may omit its "]"
    unterminated.write_text("[" + ",\n".join(json.dumps(e) for e in events) + ",\n")
    doc, _ = analyze_json(unterminated)
    assert doc["partial"] is False and doc["inputs"][0]["events"] == 4
    compact = json.dumps({"otherData": {}, "traceEvents": events})  # one line, traceEvents not first
    broken = tmp_path / "broken.json"
    broken.write_text(compact[: compact.index('"op3"') + 3])
    proc = run_cli("analyze", broken, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["partial"] is True and doc["inputs"][0]["events"] == 3
    (warning,) = [w for w in doc["warnings"] if "ends early" in w]  # a cut, said as one
    assert "byte" in warning and "3 events before it were kept" in warning

"""Make the Ascend db-export fixtures under tests/data/ascend/ (small; committed; CI needs none of this).

No NPU is reachable here, so torch_npu's collection cannot run. What can run is torch_npu's own analysis
code: this script takes the torch_npu wheel from PyPI (`pip download --no-deps torch-npu`), loads its pure-
Python profiler parsers without its C extension, and uses
  - its table definitions (`TableColumnsManager`) for every framework-side table it defines, and the
    documented CANN schema ("Data in ascend_pytorch_profiler_{Rank_ID}.db") for TASK, COMPUTE_TASK_INFO,
    COMMUNICATION_OP, COMMUNICATION_TASK_INFO and MSTX_EVENTS;
  - its `TraceStepTimeDbParser` to write analysis.db (StepTraceTime) from each db, as torch_npu does.

What goes in the tables:
  real/trace_view/    the real Ascend text export of tests/data/real/ascend/trace_view.json, moved
                      into db form: Ascend Hardware tasks -> TASK + COMPUTE_TASK_INFO, Python ops ->
                      PYTORCH_API, CANN -> CANN_API, ProfilerStep#N -> STEP_TIME (op type: the last
                      part of the task name, `{aclnn api}_{kernel}_{op type}`);
  real/kernel_details/ the real kernel_details.csv (another run, with HCCL collectives) moved likewise:
                      compute rows -> TASK + COMPUTE_TASK_INFO, HCCL rows -> COMMUNICATION_OP; its Step Id
                      gives STEP_TIME (the device extent of that step's tasks: the csv has no host times);
  mindspeed/          a MindSpeed-RL GRPO run's layout (profile_save_path with two ranks, stage: all, db
                      export) with seeded synthetic timings: mstx ranges named as MindSpeed-RL's
                      mstx_timer_decorator names them, compute tasks, HCCL collectives, rank 1 slower in the
                      update; its lightweight twin (mstx: true, level_none: mstx ranges and communication
                      only); and one collection left unparsed (profile_analysis: false).

    python3 bench/make_ascend_fixtures.py
"""

from __future__ import annotations

import csv
import json
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import types
import zipfile
from decimal import Decimal
from pathlib import Path

import numpy as np

from rlprof.frameworks import mindspeed

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
REAL = ROOT / "tests" / "data" / "real" / "ascend"
OUT = ROOT / "tests" / "data" / "ascend"
CACHE = HERE / ".cache"
TORCH_NPU = "torch-npu==2.14.0"

# The CANN tables, as the msprof db reference documents them (every column, in order).
CANN_TABLES = {
    "TASK": (
        "startNs",
        "endNs",
        "deviceId",
        "connectionId",
        "globalTaskId",
        "globalPid",
        "taskType",
        "contextId",
        "streamId",
        "taskId",
        "modelId",
    ),
    "COMPUTE_TASK_INFO": (
        "name",
        "globalTaskId",
        "blockDim",
        "mixBlockDim",
        "taskType",
        "opType",
        "inputFormats",
        "inputDataTypes",
        "inputShapes",
        "outputFormats",
        "outputDataTypes",
        "outputShapes",
        "attrInfo",
        "opState",
        "hf32Eligible",
    ),
    "COMMUNICATION_OP": (
        "opName",
        "startNs",
        "endNs",
        "connectionId",
        "groupName",
        "opId",
        "relay",
        "retry",
        "dataType",
        "algType",
        "count",
        "opType",
        "waitNs",
    ),
    "COMMUNICATION_TASK_INFO": (
        "name",
        "globalTaskId",
        "taskType",
        "planeId",
        "groupName",
        "notifyId",
        "rdmaType",
        "srcRank",
        "dstRank",
        "transportType",
        "size",
        "dataType",
        "linkType",
        "opId",
    ),
    "MSTX_EVENTS": (
        "startNs",
        "endNs",
        "eventType",
        "rangeId",
        "category",
        "message",
        "globalTid",
        "endGlobalTid",
        "domainId",
        "connectionId",
    ),
}


def torch_npu_analysis():
    """torch_npu's profiler analysis package, loaded from the PyPI wheel without its C extension."""
    CACHE.mkdir(exist_ok=True)
    wheels = sorted(CACHE.glob("torch_npu-*.whl"))
    if not wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", TORCH_NPU, "-d", str(CACHE)], check=True
        )
        wheels = sorted(CACHE.glob("torch_npu-*.whl"))
    src = CACHE / "torch_npu_py"
    if not (src / "torch_npu").exists():
        with zipfile.ZipFile(wheels[-1]) as z:
            z.extractall(src, [n for n in z.namelist() if n.endswith(".py")])
    pkg = src / "torch_npu"
    for name, sub in (
        ("torch_npu", ""),
        ("torch_npu.utils", "utils"),
        ("torch_npu._init", "_init"),
        ("torch_npu._init.common", "_init/common"),
        ("torch_npu.profiler", "profiler"),
    ):
        module = types.ModuleType(name)
        module.__path__ = [str(pkg / sub)]  # a namespace: the packages' __init__ would load the C extension
        sys.modules[name] = module
    from torch_npu.profiler.analysis.prof_common_func import _constant as constant
    from torch_npu.profiler.analysis.prof_common_func import _db_manager as db_manager
    from torch_npu.profiler.analysis.prof_view.prof_db_parse._trace_step_time_db_parser import TraceStepTimeDbParser

    return constant, db_manager, TraceStepTimeDbParser, wheels[-1].name


class DbWriter:
    """One ascend_pytorch_profiler db: STRING_IDS interning and documented tables."""

    def __init__(self, path: Path, constant):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        self.path, self.conn, self.constant = path, sqlite3.connect(path), constant
        self.strings: dict[str, int] = {}
        self.task_id = 0

    def sid(self, value) -> int | None:
        if value is None:
            return None
        return self.strings.setdefault(str(value), len(self.strings))

    def columns(self, table: str) -> tuple[str, ...]:
        if table in CANN_TABLES:
            return CANN_TABLES[table]
        return tuple(c for c, _ in self.constant.TableColumnsManager.TableColumns[table])

    def insert(self, table: str, rows: list[dict]) -> None:
        cols = self.columns(table)
        self.conn.execute(f"CREATE TABLE IF NOT EXISTS {table} ({', '.join(cols)})")
        self.conn.executemany(
            f"INSERT INTO {table} VALUES ({', '.join('?' * len(cols))})", [tuple(r.get(c) for c in cols) for r in rows]
        )

    def compute(self, rows: list[tuple[int, int, str, str | None, int]]) -> None:
        """(startNs, endNs, name, opType, streamId) compute tasks."""
        tasks, info = [], []
        for start, end, name, op_type, stream in rows:
            self.task_id += 1
            tasks.append(
                {
                    "startNs": start,
                    "endNs": end,
                    "deviceId": 0,
                    "connectionId": self.task_id,
                    "globalTaskId": self.task_id,
                    "globalPid": 0,
                    "taskType": self.sid("KERNEL_AIVEC"),
                    "contextId": 4294967295,
                    "streamId": stream,
                    "taskId": self.task_id,
                    "modelId": 4294967295,
                }
            )
            info.append(
                {
                    "name": self.sid(name),
                    "globalTaskId": self.task_id,
                    "blockDim": 1,
                    "taskType": self.sid("AI_VECTOR_CORE"),
                    "opType": self.sid(op_type),
                }
            )
        self.insert("TASK", tasks)
        self.insert("COMPUTE_TASK_INFO", info)

    def runtime_tasks(self, rows: list[tuple[int, int, str, int]]) -> None:
        """(startNs, endNs, task type, streamId) device tasks that are no operator (MEMCPY_ASYNC, EVENT_WAIT):
        in TASK only, as CANN writes them (COMPUTE_TASK_INFO lists operators)."""
        tasks = []
        for start, end, task_type, stream in rows:
            self.task_id += 1
            tasks.append(
                {
                    "startNs": start,
                    "endNs": end,
                    "deviceId": 0,
                    "connectionId": self.task_id,
                    "globalTaskId": self.task_id,
                    "globalPid": 0,
                    "taskType": self.sid(task_type),
                    "contextId": 4294967295,
                    "streamId": stream,
                    "taskId": self.task_id,
                    "modelId": 4294967295,
                }
            )
        self.insert("TASK", tasks)

    def communication(self, rows: list[tuple[int, int, str, str, str]]) -> None:
        """(startNs, endNs, opName, opType, group) HCCL collectives, each with one task on the device."""
        ops, tasks, info = [], [], []
        for k, (start, end, name, op_type, group) in enumerate(rows):
            self.task_id += 1
            ops.append(
                {
                    "opName": self.sid(name),
                    "startNs": start,
                    "endNs": end,
                    "connectionId": self.task_id,
                    "groupName": self.sid(group),
                    "opId": k,
                    "relay": 0,
                    "retry": 0,
                    "dataType": self.sid("FP16"),
                    "algType": self.sid("RING"),
                    "count": 1 << 20,
                    "opType": self.sid(op_type),
                    "waitNs": 0,
                }
            )
            tasks.append(
                {
                    "startNs": start,
                    "endNs": end,
                    "deviceId": 0,
                    "connectionId": self.task_id,
                    "globalTaskId": self.task_id,
                    "globalPid": 0,
                    "taskType": self.sid("COMMUNICATION"),
                    "contextId": 4294967295,
                    "streamId": 9,
                    "taskId": self.task_id,
                    "modelId": 4294967295,
                }
            )
            info.append(
                {
                    "name": self.sid("Memcpy"),
                    "globalTaskId": self.task_id,
                    "taskType": self.sid("SDMA"),
                    "planeId": 0,
                    "groupName": self.sid(group),
                    "opId": k,
                }
            )
        self.insert("COMMUNICATION_OP", ops)
        self.insert("TASK", tasks)
        self.insert("COMMUNICATION_TASK_INFO", info)

    def mstx(self, ranges: list[tuple[int, int, str]], tid: int = 1) -> None:
        self.insert(
            "MSTX_EVENTS",
            [
                {
                    "startNs": s,
                    "endNs": e,
                    "eventType": 2,
                    "rangeId": k,
                    "category": 0,
                    "message": self.sid(msg),
                    "globalTid": tid,
                    "endGlobalTid": tid,
                    "domainId": self.sid("default"),
                    "connectionId": 4294967295,
                }
                for k, (s, e, msg) in enumerate(ranges)
            ],
        )

    def steps(self, spans: list[tuple[int, int, int]]) -> None:
        self.insert("STEP_TIME", [{"id": i, "startNs": s, "endNs": e} for i, s, e in spans])

    def api(self, table: str, rows: list[tuple[int, int, str, int]], api_type: int) -> None:
        self.insert(
            table,
            [
                {"startNs": s, "endNs": e, "globalTid": tid, "name": self.sid(n), "type": api_type}
                for s, e, n, tid in rows
            ],
        )

    def close(self, rank: int) -> None:
        self.insert(
            "ENUM_API_TYPE",
            [
                {"id": i, "name": n}
                for i, n in (
                    (50001, "op"),
                    (50002, "queue"),
                    (50003, "trace"),
                    (50004, "mstx"),
                    (20000, "acl"),
                    (5000, "runtime"),
                    (5500, "communication"),
                )
            ],
        )
        self.insert("RANK_DEVICE_MAP", [{"rankId": rank, "deviceId": 0}])
        self.insert("CONNECTION_IDS", [])  # torch_npu writes it beside PYTORCH_API; no flows are kept here
        self.insert("META_DATA", [{"name": "SOURCE", "value": "rlprof bench/make_ascend_fixtures.py"}])
        self.insert("STRING_IDS", [{"id": i, "value": v} for v, i in self.strings.items()])
        self.conn.commit()
        self.conn.close()


def step_trace(torch_npu, db: Path, spans: list[tuple[int, int, int]], first_task: dict[int, int]) -> Path:
    """analysis.db beside the db, written by torch_npu's own TraceStepTimeDbParser. Its step ranges are what
    torch_npu's StepInfoDbParser hands it: from the step's first device task to the later of the step's
    last device task and its host end."""
    constant, db_manager, parser_cls, _ = torch_npu
    C = constant.Constant
    out = db.parent / constant.DbConstant.DB_ANALYSIS
    out.unlink(missing_ok=True)
    torch_db, analysis_db = db_manager.TorchDb(), db_manager.AnalysisDb()
    for single in (torch_db, analysis_db):  # torch_npu's singletons keep the first path of a process
        single.close()
        single.db_path = None
    torch_db.init(str(db))
    analysis_db.init(str(out))
    ranges = [
        {C.STEP_ID: str(i), C.START_TS: first_task.get(i, s), C.END_TS: e, C.FWK_START_TS: s} for i, s, e in spans
    ]
    with tempfile.TemporaryDirectory() as scratch:
        parser = parser_cls(C.TRACE_STEP_TIME_DB_PARSER, {"profiler_path": scratch, "output_path": str(db.parent)})
        status, _ = parser.run({C.STEP_INFO_DB_PARSER: ranges})
    torch_db.close()
    analysis_db.close()
    if status != C.SUCCESS or not out.exists():
        raise SystemExit(f"torch_npu's TraceStepTimeDbParser failed on {db}")
    return out


def ns(us) -> int:
    return int(Decimal(str(us)) * 1000)


def from_trace_view(torch_npu, out: Path) -> None:
    events = json.loads((REAL / "trace_view.json").read_text())
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    xs = [e for e in events if e.get("ph") == "X"]
    w = DbWriter(out / "ascend_pytorch_profiler_0.db", torch_npu[0])
    # task names read {aclnn api}_{kernel}_{op type}: the op type is the last part. The runtime's own tasks
    # (MEMCPY_ASYNC) are no operator: TASK only (this CANN version types every task "Other").
    device = [e for e in xs if procs.get(e["pid"]) == "Ascend Hardware"]
    operator = [mindspeed.is_operator_task(e["args"].get("Task Type", ""), e["name"]) for e in device]
    w.compute(
        [
            (
                ns(e["ts"]),
                ns(e["ts"]) + ns(e["dur"]),
                e["name"],
                e["name"].rsplit("_", 1)[-1],
                e["args"].get("Stream Id", 0),
            )
            for e, op in zip(device, operator)
            if op
        ]
    )
    w.runtime_tasks(
        [
            (ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), e["name"], e["args"].get("Stream Id", 0))
            for e, op in zip(device, operator)
            if not op
        ]
    )
    w.api(
        "PYTORCH_API",
        [
            (ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), e["name"], int(e["tid"]))
            for e in xs
            if procs.get(e["pid"]) == "Python" and not e["name"].startswith("ProfilerStep#")
        ],
        50001,
    )
    w.api(
        "CANN_API",
        [
            (ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), e["name"], int(e["tid"]))
            for e in xs
            if procs.get(e["pid"]) == "CANN"
        ],
        20000,
    )
    spans = [
        (int(e["name"].split("#")[1]), ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]))
        for e in xs
        if e["name"].startswith("ProfilerStep#")
    ]
    w.steps(spans)
    tasks = sorted(ns(e["ts"]) for e in xs if procs.get(e["pid"]) == "Ascend Hardware")
    w.close(0)
    step_trace(torch_npu, w.path, spans, {spans[0][0]: tasks[0]})


def from_kernel_details(torch_npu, out: Path) -> None:
    with open(REAL / "kernel_details.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    w = DbWriter(out / "ascend_pytorch_profiler_0.db", torch_npu[0])
    compute, comm, by_step = [], [], {}
    for r in rows:
        start, end = ns(r["Start Time(us)"]), ns(r["Start Time(us)"]) + ns(r["Duration(us)"])
        lo, hi = by_step.get(int(r["Step Id"]), (start, end))
        by_step[int(r["Step Id"])] = (min(lo, start), max(hi, end))
        if r["Accelerator Core"] == "HCCL":
            comm.append((start, end, r["Name"], r["Type"], "group0"))
        else:
            stream = int(r["Stream ID"]) if r["Stream ID"].isdigit() else 0
            compute.append((start, end, r["Name"], r["Type"], stream))
    w.compute(compute)
    w.communication(comm)
    spans = [(i, lo, hi) for i, (lo, hi) in sorted(by_step.items())]
    w.steps(spans)
    w.close(0)
    step_trace(torch_npu, w.path, spans, {i: lo for i, lo, _ in spans})


# ---- a MindSpeed-RL run ------------------------------------------------------------------------------
# (mstx range name, role in the step, device work: compute kernels, collectives)
STAGES = (
    ("ActorHybridWorkerBase.generate_sequences", "decode"),
    ("ActorHybridWorkerBase.compute_log_prob", "forward"),
    ("IntegratedWorker.compute_ref_log_prob", "forward"),
    ("compute_advantage", "host"),
    ("ActorHybridWorkerBase.update", "train"),
)
KERNELS = {
    "decode": ("PagedAttention", "MatMulV2", "RmsNorm", "Add", "Sample"),
    "forward": ("FlashAttentionScore", "MatMulV2", "RmsNorm", "SwiGlu", "Add"),
    "train": ("FlashAttentionScoreGrad", "MatMulV2", "RmsNormGrad", "SwiGluGrad", "ApplyAdamW"),
}
COLLECTIVE = {
    "decode": ("hcom_allReduce_", 0.0),
    "forward": ("hcom_allGather_", 0.3),
    "train": ("hcom_reduceScatter_", 0.6),
}


def mindspeed_timelines(ranks: int = 2, seed: int = 0) -> list[dict]:
    """Both ranks' device timelines together: each rank computes at its own pace, and every collective ends for
    all ranks once the last one has joined it, plus the transfer. Rank 1 computes 35% slower in the update, so
    rank 0 waits in those collectives: what a slow rank looks like."""
    rng = np.random.default_rng(seed)
    t = [1_700_000_000_000_000_000 + 3_000_000 * r for r in range(ranks)]  # clocks a few ms apart
    out = [{"compute": [], "comm": [], "ranges": [], "spans": [], "first": {}} for _ in range(ranks)]
    for step in (2, 3):
        step_start = list(t)
        t = [x + 200_000 for x in t]
        for name, kind in STAGES:
            lo = list(t)
            if kind == "host":
                t = [x + int(rng.uniform(1.5e6, 2.5e6)) for x in t]
            else:
                for u in range({"decode": 24, "forward": 8, "train": 12}[kind]):
                    for r in range(ranks):
                        slow = 1.35 if (r == 1 and kind == "train") else 1.0
                        for op in KERNELS[kind]:
                            dur = int(rng.uniform(20e3, 120e3) * slow)
                            out[r]["compute"].append((t[r], t[r] + dur, f"{op}_{u}", op, 2))
                            out[r]["first"].setdefault(step, t[r])
                            t[r] += dur + int(rng.uniform(2e3, 15e3))
                    if u % 3 == 2:
                        op_type, overlap = COLLECTIVE[kind]
                        transfer = int(rng.uniform(150e3, 400e3))
                        # each rank enters under its last kernels (overlapped); all leave together
                        starts = [x - int(overlap * transfer) for x in t]
                        end = max(x - int(overlap * transfer) for x in t) + transfer
                        for r in range(ranks):
                            out[r]["comm"].append((starts[r], end, f"{op_type}_{step}_{u}_1", op_type, f"group_{kind}"))
                            t[r] = max(t[r], end) + 5_000
            for r in range(ranks):
                out[r]["ranges"].append((lo[r], t[r], name))
            t = [x + int(rng.uniform(50e3, 300e3)) for x in t]
        for r in range(ranks):
            out[r]["spans"].append((step, step_start[r], t[r]))
        t = [x + 400_000 for x in t]
    return out


def mindspeed_rank(torch_npu, path: Path, rank: int, timeline: dict, lightweight: bool) -> None:
    w = DbWriter(path, torch_npu[0])
    spans = timeline["spans"]
    if not lightweight:
        w.compute(timeline["compute"])
    w.communication(timeline["comm"])
    w.mstx(timeline["ranges"])
    w.steps(spans)
    if not lightweight:
        w.insert(
            "MEMORY_RECORD",
            [
                {
                    "component": w.sid("PTA"),
                    "timestamp": int(s),
                    "totalAllocated": int(a),
                    "totalReserved": int(a * 1.2),
                    "totalActive": int(a),
                    "deviceId": 0,
                }
                for s, a in zip(
                    np.linspace(spans[0][1], spans[-1][2], 40).astype(np.int64),
                    (8 + 6 * np.abs(np.sin(np.arange(40) / 4))) * 2**30,
                )
            ],
        )
    w.close(rank)
    (path.parent.parent / f"profiler_info_{rank}.json").write_text(
        json.dumps(
            {
                "rank_id": rank,
                "config": {
                    "experimental_config": {
                        "_export_type": ["db"],
                        "_profiler_level": "Level_none" if lightweight else "Level0",
                        "_msprof_tx": lightweight,
                    }
                },
            },
            indent=1,
        )
    )
    if not lightweight:
        step_trace(torch_npu, path, spans, timeline["first"])


def mindspeed_run(torch_npu, out: Path) -> None:
    timelines = mindspeed_timelines()
    for sub, lightweight in (("profiler_data/integrated", False), ("profiler_data_mstx/integrated", True)):
        for rank, timeline in enumerate(timelines):
            coll = out / sub / f"node0_{4100 + rank}_20261122120000{rank}_ascend_pt"
            mindspeed_rank(
                torch_npu,
                coll / "ASCEND_PROFILER_OUTPUT" / f"ascend_pytorch_profiler_{rank}.db",
                rank,
                timeline,
                lightweight,
            )
    raw = out / "profiler_data" / "actor_update" / "node0_4100_20261122120500_ascend_pt"
    for d in ("FRAMEWORK", "PROF_000001_20261122120500000_ABCDEFGHIJ"):  # raw collection, never parsed
        (raw / d).mkdir(parents=True, exist_ok=True)
        (raw / d / ".gitkeep").write_text("")  # git keeps no empty directory
    (raw / "profiler_info_0.json").write_text(json.dumps({"rank_id": 0}))


def main() -> int:
    torch_npu = torch_npu_analysis()
    for made in ("real/trace_view", "real/kernel_details", "mindspeed"):  # msinsight/ is copied, not made
        shutil.rmtree(OUT / made, ignore_errors=True)
    from_trace_view(torch_npu, OUT / "real" / "trace_view")
    from_kernel_details(torch_npu, OUT / "real" / "kernel_details")
    mindspeed_run(torch_npu, OUT / "mindspeed")
    (OUT / "SOURCES.md").write_text(SOURCES.format(wheel=torch_npu[3]))
    sizes = {str(p.relative_to(OUT)): p.stat().st_size for p in sorted(OUT.rglob("*")) if p.is_file()}
    print(json.dumps({"written": sizes, "total_kb": round(sum(sizes.values()) / 1024)}))
    return 0


SOURCES = """# Ascend db fixtures

Made by `python3 bench/make_ascend_fixtures.py` (see its docstring). No NPU was available: torch_npu's
collection could not run, its analysis could. Table layouts: torch_npu's own `TableColumnsManager` ({wheel})
for the framework-side tables, the documented CANN schema for TASK / COMPUTE_TASK_INFO / COMMUNICATION_OP /
COMMUNICATION_TASK_INFO / MSTX_EVENTS. Every `analysis.db` was written by torch_npu's `TraceStepTimeDbParser`.

- `real/trace_view/`: the real `tests/data/real/ascend/trace_view.json` in db form (its text twin is that file).
- `real/kernel_details/`: the real `tests/data/real/ascend/kernel_details.csv` (a run with HCCL collectives) in db
  form; STEP_TIME is the device extent of each Step Id (the csv has no host times).
- `mindspeed/profiler_data/`: a MindSpeed-RL `profile_save_path` (stage: all, export db, 2 ranks, steps 2-3) with
  seeded synthetic timings; mstx ranges carry the names MindSpeed-RL's `mstx_timer_decorator` gives them
  (`Class.method` qualnames); rank 1 is slower in the update. `actor_update/` holds one collection left unparsed
  (`profile_analysis: false`: raw FRAMEWORK / PROF_* directories, empty here).
- `mindspeed/profiler_data_mstx/`: the lightweight twin (mstx: true, level_none): mstx ranges and HCCL only.

## Real torch_npu collections: `msinsight_pytorch.tar.xz`

Copied, not made: `test/data/pytorch/` of Ascend MindStudio Insight (the `msinsight` repository, mirrored at
github.com/xiaobingling93-pixel/Ascend-msinsight, commit 91d1c4ec2, data last changed in effd4fc6; Mulan PSL v2,
a permissive licence). Real torch_npu output of a 2-rank ImageNet training step (ResNet-style, HCCL allReduce),
collected by torch_npu itself at profiler levels level0 / level1 / level2, each once with the text export and once
with the db export (separate runs: the two exports hold different timings), step 50 profiled.
Kept of each collection: `trace_view.json`, `kernel_details.csv`, `step_trace_time.csv`, `profiler_info_{{rank}}.json`
(text) and `ascend_pytorch_profiler_{{rank}}.db`, `analysis.db`, `profiler_info_{{rank}}.json` (db); the other csv
files are left out. torch_npu's own step trace (`step_trace_time.csv`, `StepTraceTime`) is the reference the
tests hold rlprof's buckets to. Tests unpack the archive into a temporary directory (`tests/conftest.py`).
"""

if __name__ == "__main__":
    sys.exit(main())

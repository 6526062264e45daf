"""Compare speed and peak memory: `rlprof compare` vs `msprof-analyze compare` on the same pair, two cases.

kineto: a pair of synthetic GPU-style Kineto traces (bench/synth_trace.py, different seeds: a different
        operator mix and timings); msprof-analyze accepts GPU traces.
db:     a pair of torch_npu db exports (`ascend_pytorch_profiler_*.db`): the two ranks of the MindSpeed-RL
        fixture (tests/data/ascend/mindspeed: mstx stages, compute tasks, HCCL), each repeated in time until it
        reaches the asked size, so both tools read the documented tables at a realistic size.
Each tool runs in its own process; peak memory is the summed RSS of its process tree (bench/ingest.py's
measure). The Kineto case also times the decode floor of both files (bench/decode_floor.py, one core). Prints one JSON object: {"kineto": {...}, "db": {...}}.
msprof-analyze 26.2.0 runs from bench/.venv-msprof (bench/msprof.py makes it on first use).

    python3 bench/compare.py                  # 48 MB Kineto pair, 40 MB db pair
    python3 bench/compare.py --case db --db-mb 100
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sqlite3
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "tests" / "data" / "ascend"
DB_PAIR = tuple(sorted((DATA / "mindspeed" / "profiler_data" / "integrated").rglob("ascend_pytorch_profiler_*.db")))
# Tables whose rows are repeated, with the columns shifted on each copy (times by the file's span, ids by
# their maximum, so joins stay one-to-one).
REPEATED = {
    "TASK": ("startNs", "endNs", "globalTaskId", "connectionId"),
    "COMPUTE_TASK_INFO": ("globalTaskId",),
    "COMMUNICATION_TASK_INFO": ("globalTaskId",),
    "COMMUNICATION_OP": ("startNs", "endNs", "connectionId"),
    "MSTX_EVENTS": ("startNs", "endNs"),
    "STEP_TIME": ("startNs", "endNs", "id"),
}


def grow_db(src: Path, dst: Path, mb: float) -> int:
    """Copy `src` to `dst` and repeat its timeline until the file is about `mb` MB; returns device tasks."""
    shutil.copy(src, dst)
    conn = sqlite3.connect(dst)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    lo, hi = conn.execute("SELECT MIN(startNs), MAX(endNs) FROM TASK").fetchone()
    span = (hi - lo) + 1_000_000
    top_id = conn.execute("SELECT MAX(globalTaskId) FROM TASK").fetchone()[0] + 1
    base = {t: conn.execute(f"SELECT rowid FROM {t}").fetchall() for t in REPEATED if t in tables}
    copies = 1
    while dst.stat().st_size < mb * 1e6:
        for table, shifted in REPEATED.items():
            if table not in tables or not base[table]:
                continue
            cols = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
            select = []
            for c in cols:
                if c in ("startNs", "endNs"):
                    select.append(f"{c} + {copies * span}")
                elif c in ("globalTaskId", "connectionId") and c in shifted:
                    select.append(f"{c} + {copies * top_id}")
                elif c == "id" and table == "STEP_TIME":
                    select.append(f"{c} + {copies * 1000}")
                else:
                    select.append(c)
            last = base[table][-1][0]
            conn.execute(f"INSERT INTO {table} SELECT {', '.join(select)} FROM {table} WHERE rowid <= {last}")
        conn.commit()
        copies += 1
    tasks = conn.execute("SELECT COUNT(*) FROM TASK").fetchone()[0]
    conn.close()
    return tasks


def time_pair(base: Path, new: Path, out: Path, use_msprof: bool, pairs: int = 3, floor: bool = False) -> dict:
    """rlprof (median of `pairs` runs, alternating with the decode floor of both files where `floor`), then
    msprof-analyze once."""
    from ingest import floor_cmd, measured

    rlprof = [
        sys.executable,
        "-m",
        "rlprof.cli",
        "compare",
        "-d",
        str(new),
        "-bp",
        str(base),
        "-o",
        str(out / "rlprof_out"),
    ]
    runs = {"rlprof": [], "floor": []}
    cold = {"rlprof": round(measured(rlprof, sample=False)[0], 2)}  # untimed warm-up round (see ingest.py)
    if floor:
        cold["floor"] = round(measured(floor_cmd(new, base), sample=False)[0], 2)
    for _ in range(pairs):  # alternating, timed without the memory sampler
        runs["rlprof"].append(measured(rlprof, sample=False)[0])
        if floor:
            runs["floor"].append(measured(floor_cmd(new, base), sample=False)[0])
    rl_s, rl_mb = statistics.median(runs["rlprof"]), measured(rlprof)[1]
    result = {"rlprof_s": round(rl_s, 2), "rlprof_peak_mb": rl_mb, "cold_s": cold}
    if floor:
        floor_s = statistics.median(runs["floor"])
        result.update({"floor_s": round(floor_s, 2), "rlprof_over_floor": round(rl_s / floor_s, 2)})
    if use_msprof:
        from msprof import ensure_msprof

        exe = ensure_msprof()
        ms_s, ms_mb, _ = measured([str(exe), "compare", "-d", str(new), "-bp", str(base), "-o", str(out / "msprof")])
        result.update(
            {
                "msprof_s": round(ms_s, 2),
                "msprof_peak_mb": ms_mb,
                "speedup": round(ms_s / rl_s, 1),
                "memory_ratio": {k: round(rl_mb[k] / ms_mb[k], 3) for k in ms_mb},
            }
        )
    return result


def kineto_case(tmp: Path, mb: float, use_msprof: bool) -> dict:
    from synth_trace import write_trace

    (tmp / "base").mkdir()
    (tmp / "new").mkdir()
    base, new = tmp / "base" / "rank0.pt.trace.json", tmp / "new" / "rank0.pt.trace.json"
    info = write_trace(base, mb, seed=0)
    write_trace(new, mb, seed=1)
    size_mb = min(base.stat().st_size, new.stat().st_size) / 1e6
    return {"size_mb": round(size_mb, 1), "events": info["events"], **time_pair(base, new, tmp, use_msprof, floor=True)}


def db_case(tmp: Path, mb: float, use_msprof: bool) -> dict:
    base, new = tmp / "base" / "ascend_pytorch_profiler_0.db", tmp / "new" / "ascend_pytorch_profiler_1.db"
    base.parent.mkdir()
    new.parent.mkdir()
    tasks = grow_db(DB_PAIR[0], base, mb), grow_db(DB_PAIR[1], new, mb)
    size_mb = min(base.stat().st_size, new.stat().st_size) / 1e6
    return {"size_mb": round(size_mb, 1), "device_tasks": min(tasks), **time_pair(base, new, tmp, use_msprof)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", choices=("kineto", "db", "both"), default="both")
    ap.add_argument("--mb", type=float, default=48, help="size of each synthetic Kineto trace (uncompressed)")
    ap.add_argument("--db-mb", type=float, default=40, help="size of each db of the pair")
    ap.add_argument("--no-msprof", action="store_true", help="time rlprof only")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    result = {}
    for case, run, mb in (("kineto", kineto_case, args.mb), ("db", db_case, args.db_mb)):
        if args.case in (case, "both"):
            with tempfile.TemporaryDirectory(prefix=f"rlprof-compare-{case}-") as tmp:
                result[case] = run(Path(tmp), mb, not args.no_msprof)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Ingestion speed and peak memory: `rlprof analyze` vs the one-core decode floor and holistictraceanalysis.

Generates a synthetic GPU-style Kineto trace (bench/synth_trace.py, shaped like the real NCCL rank), then in
one run measures, each in its own process:
- rlprof: `rlprof analyze TRACE --json` (all cores; a large plain trace is read in byte ranges in parallel),
- rlprof one core: the same with `--workers 1`,
- floor: bench/decode_floor.py (read the file and msgspec-decode it into a minimal typed struct, one core),
alternating rlprof / floor / rlprof-one-core for --pairs rounds (medians reported), then HTA's TraceAnalysis
load + get_temporal_breakdown once. Wall time is the process's; peak memory is the largest sum of RSS over
the whole process tree (workers included), sampled every 10 ms. Prints one JSON object.
HTA runs from bench/.venv-hta (created here on first use: pip install holistictraceanalysis "pandas<2.3").

    python3 bench/ingest.py                      # 300 MB case: rlprof vs floor vs HTA
    python3 bench/ingest.py --mb 2000 --no-hta --pairs 1   # the 2 GB case: memory of the process tree
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
HTA_VENV = HERE / ".venv-hta"
HTA_SCRIPT = """
import sys
from hta.trace_analysis import TraceAnalysis
analyzer = TraceAnalysis(trace_dir=sys.argv[1])
frame = analyzer.get_temporal_breakdown(visualize=False)
print(frame.to_json(orient="records"))
"""


def ensure_hta() -> Path:
    python = HTA_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(HTA_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "holistictraceanalysis", "pandas<2.3"],
                       check=True)
    return python


def measured(cmd: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak MB of the summed RSS of the process and all its descendants, stdout tail)."""
    t = time.perf_counter()
    proc = psutil.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak = 0
    done = threading.Event()

    def sample():
        nonlocal peak
        while not done.is_set():
            try:
                tree = [proc] + proc.children(recursive=True)
                peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
            except psutil.Error:
                pass
            done.wait(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    seconds = time.perf_counter() - t
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} failed: {err.decode()[-2000:]}")
    return seconds, peak / 2**20, out.decode()[-4000:]


def floor_cmd(*traces: Path) -> list[str]:
    return [sys.executable, str(HERE / "decode_floor.py"), *map(str, traces)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=300, help="size of the synthetic trace (uncompressed)")
    ap.add_argument("--pairs", type=int, default=3, help="alternating rounds of rlprof / floor (medians)")
    ap.add_argument("--no-hta", action="store_true", help="skip holistictraceanalysis (the 2 GB memory case)")
    ap.add_argument("--keep", type=Path, help="directory to keep the trace in (default: a temporary one)")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from synth_trace import write_trace

    with tempfile.TemporaryDirectory(prefix="rlprof-ingest-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        trace = folder / "rank0.pt.trace.json"
        info = write_trace(trace, args.mb)
        rlprof = [sys.executable, "-m", "rlprof.cli", "analyze", str(trace), "--json"]
        runs: dict[str, list[tuple[float, float]]] = {"rlprof": [], "floor": [], "rlprof_one_core": []}
        for _ in range(args.pairs):
            runs["rlprof"].append(measured(rlprof)[:2])
            runs["floor"].append(measured(floor_cmd(trace))[:2])
            runs["rlprof_one_core"].append(measured(rlprof + ["--workers", "1"])[:2])
        result = {"size_mb": round(trace.stat().st_size / 1e6, 1), "events": info["events"], "pairs": args.pairs}
        for name, values in runs.items():
            result[f"{name}_s"] = round(statistics.median(s for s, _ in values), 2)
            result[f"{name}_peak_mb"] = round(max(mb for _, mb in values), 1)
        result["rlprof_over_floor"] = round(result["rlprof_s"] / result["floor_s"], 2)
        if not args.no_hta:
            python = ensure_hta()
            hta_s, hta_mb, _ = measured([str(python), "-c", HTA_SCRIPT, str(folder)])
            result.update({"hta_s": round(hta_s, 2), "hta_peak_mb": round(hta_mb, 1),
                           "speedup_vs_hta": round(hta_s / result["rlprof_s"], 1),
                           "memory_vs_hta": round(result["rlprof_peak_mb"] / hta_mb, 3)})
    result["machine"] = f"{psutil.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB"
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

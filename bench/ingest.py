"""Ingestion speed and peak memory: `rlprof analyze` vs holistictraceanalysis on the same trace.

Generates a synthetic GPU-style Kineto trace (bench/synth_trace.py, shaped like the real NCCL rank),
then in one run times `rlprof analyze` and HTA's TraceAnalysis load + get_temporal_breakdown, each in
its own process under /usr/bin/time-style accounting (peak RSS from wait4). Prints one JSON object.
HTA runs from bench/.venv-hta (created here on first use: pip install holistictraceanalysis "pandas<2.3").

    python3 bench/ingest.py                 # 300 MB case, against HTA
    python3 bench/ingest.py --mb 2000 --no-hta   # the 2 GB case: rlprof's peak RSS only
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

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


def isolated(cmd: list[str]) -> tuple[float, float, str]:
    """Run `cmd` under a fresh interpreter that reports its own child's peak RSS (no cross-talk)."""
    wrapper = ("import json,resource,subprocess,sys,time\n"
               "t=time.perf_counter(); p=subprocess.run(sys.argv[1:],capture_output=True)\n"
               "s=time.perf_counter()-t\n"
               "sys.stderr.write(p.stderr.decode()[-2000:]) if p.returncode else None\n"
               "print(json.dumps({'rc':p.returncode,'s':s,'kb':resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,"
               "'out':p.stdout.decode()[-4000:]}))")
    proc = subprocess.run([sys.executable, "-c", wrapper, *cmd], capture_output=True, text=True)
    res = json.loads(proc.stdout)
    if res["rc"] != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} failed: {proc.stderr[-2000:]}")
    return res["s"], res["kb"] / 1024, res["out"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=300, help="size of the synthetic trace (uncompressed)")
    ap.add_argument("--no-hta", action="store_true", help="measure rlprof only (the 2 GB memory case)")
    ap.add_argument("--keep", type=Path, help="directory to keep the trace in (default: a temporary one)")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from synth_trace import write_trace

    with tempfile.TemporaryDirectory(prefix="rlprof-ingest-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        trace = folder / "rank0.pt.trace.json"
        info = write_trace(trace, args.mb)
        size_mb = trace.stat().st_size / 1e6
        rl_s, rl_mb, _ = isolated([sys.executable, "-m", "rlprof.cli", "analyze", str(trace), "--json"])
        result = {"size_mb": round(size_mb, 1), "events": info["events"], "rlprof_s": round(rl_s, 2),
                  "rlprof_peak_mb": round(rl_mb, 1)}
        if not args.no_hta:
            python = ensure_hta()
            hta_s, hta_mb, _ = isolated([str(python), "-c", HTA_SCRIPT, str(folder)])
            result.update({"hta_s": round(hta_s, 2), "hta_peak_mb": round(hta_mb, 1),
                           "speedup": round(hta_s / rl_s, 1), "memory_ratio": round(rl_mb / hta_mb, 3)})
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

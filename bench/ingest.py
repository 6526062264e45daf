"""Ingestion speed and peak memory: `rlprof analyze` vs the one-core decode floor and holistictraceanalysis.

Generates a synthetic GPU-style Kineto trace (bench/synth_trace.py, shaped like the real NCCL rank), then in
one run measures, each in its own process:
- rlprof: `rlprof analyze TRACE --json` (all cores; a large plain trace is read in byte ranges in parallel),
- rlprof one core: the same with `--workers 1`,
- floor: bench/decode_floor.py (read the file and msgspec-decode it into a minimal typed struct, one core),
after one untimed round of each (reported as `cold_s`: see the comment in main), alternating rlprof / floor /
rlprof-one-core for --pairs rounds (medians reported), then HTA's TraceAnalysis
load + get_temporal_breakdown once. Wall time is the process's; peak memory is the largest sum of RSS over
the whole process tree (workers included: pss, rss_sum and rss_max, see `measured`), sampled every 10 ms in
one more run of each (the timed runs are
not sampled: the sampler would take CPU from the command that uses every core). Prints one JSON object.
HTA runs from bench/.venv-hta (created here on first use: pip install holistictraceanalysis "pandas<2.3").

    python3 bench/ingest.py                      # 300 MB case: rlprof vs floor vs HTA
    python3 bench/ingest.py --mb 2000 --no-hta --pairs 1   # the 2 GB case: memory of the process tree
    python3 bench/ingest.py --gzip --no-hta      # the same 300 MB, gzip-compressed
"""

from __future__ import annotations

import argparse
import json
import signal
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
        subprocess.run([str(python), "-m", "pip", "install", "-q", "holistictraceanalysis", "pandas<2.3"], check=True)
    return python


def measured(
    cmd: list[str], env: dict | None = None, tree: bool = True, sample: bool = True
) -> tuple[float, dict, str]:
    """(wall seconds, peak memory in MB, stdout). Peaks, sampled every 10 ms over the process and all its
    descendants (the process alone with tree=False): `pss` the summed proportional set size (shared pages,
    such as a forked worker's copy of its parent, counted once: the tree's real footprint), `rss_sum` the summed
    RSS (shared pages counted in every process), `rss_max` the largest single process (what /usr/bin/time
    reports). sample=False times the command alone (the sampler takes CPU from a command that uses every core)."""
    t = time.perf_counter()
    proc = psutil.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peaks = {"pss": 0, "rss_sum": 0, "rss_max": 0}
    done = threading.Event()

    def watch():
        while not done.is_set():
            try:
                procs = [proc] + (proc.children(recursive=True) if tree else [])
                mems = [p.memory_full_info() for p in procs if p.is_running()]
                peaks["pss"] = max(peaks["pss"], sum(m.pss for m in mems))
                peaks["rss_sum"] = max(peaks["rss_sum"], sum(m.rss for m in mems))
                peaks["rss_max"] = max([peaks["rss_max"]] + [m.rss for m in mems])
            except psutil.Error:
                pass
            done.wait(0.01)

    sampler = threading.Thread(target=watch, daemon=True)
    if sample:
        sampler.start()
    out, err = proc.communicate()
    seconds = time.perf_counter() - t
    done.set()
    if sample:
        sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} failed: {err.decode()[-2000:]}")
    return seconds, {k: round(v / 2**20, 1) for k, v in peaks.items()}, out.decode()


def stop_tree(proc: psutil.Process) -> None:
    """Kill a process and every process under it, by PID (a `ray start --block` and its raylet, workers...)."""
    try:
        tree = [proc] + proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for p in tree:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(tree, timeout=30)


def floor_cmd(*traces: Path) -> list[str]:
    return [sys.executable, str(HERE / "decode_floor.py"), *map(str, traces)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=300, help="size of the synthetic trace (uncompressed)")
    ap.add_argument("--pairs", type=int, default=3, help="alternating rounds of rlprof / floor (medians)")
    ap.add_argument("--no-hta", action="store_true", help="skip holistictraceanalysis (the 2 GB memory case)")
    ap.add_argument("--keep", type=Path, help="directory to keep the trace in (default: a temporary one)")
    ap.add_argument("--gzip", action="store_true", help="write the trace gzip-compressed (.json.gz), as most are")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from synth_trace import write_trace

    with tempfile.TemporaryDirectory(prefix="rlprof-ingest-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        trace = folder / ("rank0.pt.trace.json" + (".gz" if args.gzip else ""))
        info = write_trace(trace, args.mb)
        rlprof = [sys.executable, "-m", "rlprof.cli", "analyze", str(trace), "--json"]
        commands = {"rlprof": rlprof, "floor": floor_cmd(trace), "rlprof_one_core": rlprof + ["--workers", "1"]}
        result = {
            "size_mb": round(info["bytes"] / 1e6, 1),
            "file_mb": round(trace.stat().st_size / 1e6, 1),
            "events": info["events"],
            "pairs": args.pairs,
        }
        # One untimed round first: this VM's host backs guest memory on first touch, so a process's first use of
        # memory nothing touched before costs up to 2x (the floor's 850 MB of structs: 1.5 s warm, up to 3.7 s
        # cold). Every command is then timed warm; the cold round is printed too.
        result["cold_s"] = {name: round(measured(cmd, sample=False)[0], 2) for name, cmd in commands.items()}
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.pairs):  # alternating, timed without the memory sampler
            for name, cmd in commands.items():
                times[name].append(measured(cmd, sample=False)[0])
        for name, cmd in commands.items():
            result[f"{name}_s"] = round(statistics.median(times[name]), 2)
            result[f"{name}_peak_mb"] = measured(cmd)[1]  # a run of its own, sampled
        result["rlprof_over_floor"] = round(result["rlprof_s"] / result["floor_s"], 2)
        if not args.no_hta:
            python = ensure_hta()
            hta_s, hta_mb, _ = measured([str(python), "-c", HTA_SCRIPT, str(folder)])
            result.update(
                {
                    "hta_s": round(hta_s, 2),
                    "hta_peak_mb": hta_mb,
                    "speedup_vs_hta": round(hta_s / result["rlprof_s"], 1),
                    "memory_vs_hta": {k: round(result["rlprof_peak_mb"][k] / hta_mb[k], 3) for k in hta_mb},
                }
            )
    result["machine"] = f"{psutil.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB"
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

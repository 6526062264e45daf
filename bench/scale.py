"""Many ranks: `rlprof analyze RUN` over 16, 64 and 256 synthetic rank files, locally and with --ray.

Each rank file is a synthetic GPU-style Kineto trace (bench/synth_trace.py, --rank-mb each, its own seed and
rank) listed in the run's manifest.jsonl, as rlprof's collection writes it. For each count the run is analysed
by the local process pool and by Ray (a one-node cluster started here with `ray start --head --block`, stopped
by PID at the end; rlprof connects through RAY_ADDRESS). Reported per case: wall seconds, the driver's own
peak RSS (workers excluded: they hold one file each and exit), and the size of the merged analysis it returns.
The driver holds only the per-window tables: its peak must track the merged document, not the trace bytes.
Prints one JSON object.

    python3 bench/scale.py                    # 16, 64, 256 ranks of 2 MB
    python3 bench/scale.py --counts 16 --no-ray
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from ingest import measured, stop_tree  # noqa: E402


def make_run(folder: Path, ranks: int, rank_mb: float) -> float:
    """A run directory of `ranks` rank traces and their manifest rows; returns the MB written."""
    from synth_trace import write_trace

    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "manifest.jsonl", "w") as manifest:
        for rank in range(ranks):
            name = f"step1_actor_actor_update_rank{rank}.pt.trace.json"
            write_trace(folder / name, rank_mb, seed=rank, rank=rank)
            manifest.write(
                json.dumps(
                    {
                        "run_id": folder.name,
                        "step": 1,
                        "steps": [1],
                        "role": "actor",
                        "stage": "actor_update",
                        "rank": rank,
                        "world_size": ranks,
                        "window": 0,
                        "path": name,
                        "status": "ok",
                        "host": socket.gethostname(),
                    }
                )
                + "\n"
            )
    return sum(p.stat().st_size for p in folder.iterdir()) / 1e6


class RayHead:
    """A one-node Ray cluster for the --ray cases; every process under it is stopped by PID."""

    def __init__(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.env = {
            "RAY_ADDRESS": f"127.0.0.1:{self.port}",
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(32),
            "RAY_USAGE_STATS_ENABLED": "0",
        }
        self.temp = f"/tmp/rlprof-ray-{self.port}"
        self.proc = psutil.Popen(
            [
                shutil.which("ray"),
                "start",
                "--head",
                "--block",
                f"--port={self.port}",
                "--include-dashboard=false",
                f"--temp-dir={self.temp}",
            ],
            env=dict(os.environ, **self.env),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        probe = "import ray; ray.init(); print(len(ray.nodes()))"
        for _ in range(60):
            ok = subprocess.run(
                [sys.executable, "-c", probe], env=dict(os.environ, **self.env), capture_output=True, text=True
            )
            if ok.returncode == 0:
                return
            time.sleep(2)
        self.stop()
        raise SystemExit("the Ray head did not come up")

    def stop(self) -> None:
        stop_tree(self.proc)
        shutil.rmtree(self.temp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--counts", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--rank-mb", type=float, default=2.0, help="size of each rank's trace")
    ap.add_argument("--no-ray", action="store_true")
    args = ap.parse_args()
    head = None if args.no_ray or shutil.which("ray") is None else RayHead()
    result = {"rank_mb": args.rank_mb, "cases": []}
    try:
        with tempfile.TemporaryDirectory(prefix="rlprof-scale-") as tmp:
            for count in args.counts:
                run = Path(tmp) / f"ranks{count}"
                total_mb = make_run(run, count, args.rank_mb)
                cmd = [sys.executable, "-m", "rlprof.cli", "analyze", str(run), "--json"]
                case = {"ranks": count, "trace_mb": round(total_mb, 1)}
                s, mb, out = measured(cmd, dict(os.environ), tree=False)
                case.update(local_s=round(s, 2), local_driver_peak_mb=mb["rss_max"], doc_mb=round(len(out) / 1e6, 2))
                if head is not None:
                    s, mb, out = measured(cmd + ["--ray"], dict(os.environ, **head.env), tree=False)
                    case.update(ray_s=round(s, 2), ray_driver_peak_mb=mb["rss_max"])
                result["cases"].append(case)
                shutil.rmtree(run)
    finally:
        if head is not None:
            head.stop()
    result["machine"] = f"{psutil.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB"
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

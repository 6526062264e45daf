"""Compare speed and peak memory: `rlprof compare` vs `msprof-analyze compare` on one pair of traces.

Writes a pair of synthetic GPU-style Kineto traces (bench/synth_trace.py, different seeds: a different
operator mix and timings), then in one run times `rlprof compare --json` and msprof-analyze's compare
(GPU traces accepted), each in its own process with its peak RSS. Prints one JSON object.
msprof-analyze runs from bench/.venv-msprof (created on first use: pip install msprof-analyze).

    python3 bench/compare.py              # 48 MB per side
    python3 bench/compare.py --mb 40
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MSPROF_VENV = HERE / ".venv-msprof"


def ensure_msprof() -> Path:
    exe = MSPROF_VENV / "bin" / "msprof-analyze"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(MSPROF_VENV)], check=True)
        subprocess.run([str(MSPROF_VENV / "bin" / "python"), "-m", "pip", "install", "-q", "msprof-analyze"],
                       check=True)
    return exe


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=48, help="size of each synthetic trace (uncompressed)")
    ap.add_argument("--no-msprof", action="store_true", help="time rlprof only")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from ingest import isolated
    from synth_trace import write_trace

    with tempfile.TemporaryDirectory(prefix="rlprof-compare-") as tmp:
        tmp = Path(tmp)
        (tmp / "base").mkdir()
        (tmp / "new").mkdir()
        base, new = tmp / "base" / "rank0.pt.trace.json", tmp / "new" / "rank0.pt.trace.json"
        info = write_trace(base, args.mb, seed=0)
        write_trace(new, args.mb, seed=1)
        size_mb = min(base.stat().st_size, new.stat().st_size) / 1e6
        rl_s, rl_mb, _ = isolated([sys.executable, "-m", "rlprof.cli", "compare", "-d", str(new), "-bp", str(base),
                                   "-o", str(tmp / "rlprof_out")])
        result = {"size_mb": round(size_mb, 1), "events": info["events"], "rlprof_s": round(rl_s, 2),
                  "rlprof_peak_mb": round(rl_mb, 1)}
        if not args.no_msprof:
            exe = ensure_msprof()
            ms_s, ms_mb, _ = isolated([str(exe), "compare", "-d", str(new), "-bp", str(base),
                                       "-o", str(tmp / "msprof_out")])
            result.update({"msprof_s": round(ms_s, 2), "msprof_peak_mb": round(ms_mb, 1),
                           "speedup": round(ms_s / rl_s, 1), "memory_ratio": round(rl_mb / ms_mb, 3)})
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

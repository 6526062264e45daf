"""One rlprof command, this checkout against an earlier commit, interleaved: A (the commit) then B (this
checkout), `--pairs` times, each run its own process. On a machine whose speed drifts within minutes, only runs
taken side by side say whether a change made a command faster. Prints one JSON object: median and min seconds
of each side and the median of the per-pair ratios B/A.

    python3 bench/ab.py b771b70 -- analyze /tmp/big/rank0.pt.trace.json --json
    python3 bench/ab.py b771b70 --pairs 5 -- compare -d NEW -bp BASE -o /tmp/out

The commit is checked out with `git worktree` in a temporary directory (removed after) and run from its `src/`
with the libraries installed here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(args: list[str], src: Path) -> float:
    env = dict(os.environ, PYTHONPATH=str(src))
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "rlprof.cli", *args], stdout=subprocess.DEVNULL, env=env, check=True)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("commit", help="the earlier commit (A)")
    ap.add_argument("--pairs", type=int, default=7, help="A/B rounds")
    argv = sys.argv[1:]
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        ap.error("give the rlprof command after --, without 'rlprof'")
    cut = argv.index("--")
    args = ap.parse_args(argv[:cut])
    args.command = argv[cut + 1 :]
    with tempfile.TemporaryDirectory(prefix="rlprof-ab-") as tmp:
        tree = Path(tmp) / "a"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree), args.commit], check=True
        )
        try:
            runs: dict[str, list[float]] = {"a": [], "b": []}
            for _ in range(args.pairs):
                runs["a"].append(timed(args.command, tree / "src"))
                runs["b"].append(timed(args.command, ROOT / "src"))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
    out = {"commit": args.commit, "command": " ".join(args.command), "pairs": args.pairs}
    for side, times in runs.items():
        out[f"{side}_median_s"] = round(statistics.median(times), 3)
        out[f"{side}_min_s"] = round(min(times), 3)
    out["b_over_a"] = round(statistics.median(b / a for a, b in zip(runs["a"], runs["b"])), 3)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

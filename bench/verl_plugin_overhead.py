"""Does rlprof's verl plugin, installed but not asked for anything, cost verl's compute_log_prob time?

verl 0.9.1's own ActorRolloutRefWorker (bench/verl_plugin_run.py: tiny Qwen2 on CPU, in process) times N
compute_log_prob calls of the same batch with profiling off, in fresh processes, alternating: verl alone (verl loads
only the CPU harness's entry point: VERL_USE_EXTERNAL_PLUGINS=rlprof_test_cpu_shim) and verl with rlprof installed
(VERL_USE_EXTERNAL_PLUGINS=auto: verl imports rlprof's plugin on `import verl`). The first call of each run is
dropped as warm-up. Prints one JSON object: the median call per variant, their difference, and the spread of the
per-run medians of verl alone (the run-to-run noise the difference is to be read against).

    python3 bench/verl_plugin_overhead.py            # 3 pairs x 20 calls (makes bench/.venv-verl on first use)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import verl_side  # noqa: E402

VARIANTS = {"verl_alone": "rlprof_test_cpu_shim", "plugin_installed_inactive": "auto"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--pairs", type=int, default=3)
    args = ap.parse_args()
    side = verl_side.Side("0.9.1").ensure()
    calls = {k: [] for k in VARIANTS}
    run_medians = {k: [] for k in VARIANTS}
    loaded = {}
    with tempfile.TemporaryDirectory(prefix="rlprof-verl-overhead-") as tmp:
        for i in range(args.pairs):
            for name, policy in VARIANTS.items():  # interleaved: A B A B ...
                out = Path(tmp) / f"{name}{i}"
                out.mkdir()
                result = side.run(
                    out,
                    steps=0,
                    extra=("--time-log-prob", str(args.calls + 1)),
                    env={"VERL_USE_EXTERNAL_PLUGINS": policy},
                )
                times = [t * 1e3 for t in result.data["log_prob_s"][1:]]
                calls[name] += times
                run_medians[name].append(statistics.median(times))
                loaded[name] = "rlprof.integrations.verl.loader" in result.data["plugins_loaded"]
    assert loaded == {"verl_alone": False, "plugin_installed_inactive": True}, loaded
    median = {k: statistics.median(v) for k, v in calls.items()}
    base = run_medians["verl_alone"]
    print(
        json.dumps(
            {
                "verl": "0.9.1",
                "what": "compute_log_prob of ActorRolloutRefWorker, profiling off, tiny Qwen2 on CPU",
                "pairs": args.pairs,
                "calls_per_run": args.calls,
                "median_ms": {k: round(v, 3) for k, v in median.items()},
                "difference_ms": round(median["plugin_installed_inactive"] - median["verl_alone"], 3),
                "difference_pct": round(100 * (median["plugin_installed_inactive"] / median["verl_alone"] - 1), 2),
                "run_medians_ms": {k: [round(x, 3) for x in v] for k, v in run_medians.items()},
                "noise_ms": round(max(base) - min(base), 3),
                "plugin_loaded": loaded,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

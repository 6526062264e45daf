"""The run over time at scale: `rlprof analyze RUN` over a synthetic watch timeline of 1,000 ranks x 10,000 steps x 8
stages (the format collect/watch.py writes: analyze/inputs/timeline_file.py), in at most 10 s and 1 GB on this machine;
then `rlprof report` of its analysis.json, and the report opened in Chromium without a GPU (no WebGL), as a cluster
login node's or a VM's browser would, in seconds.

The synthetic run holds what the analysis must find: rank 617 straggles in reward_compute from step 6,000, a spike
of actor_update at step 4,321 (the same shares of a smaller run), rollout_generate drifting up by half over the run, and 2% of steps flagged busy.
Reported: wall seconds and the peak memory of the command's process tree (bench/ingest.py's sampler), the bytes of
the timeline, and whether the analysis named what was planted; the report's seconds and size; the browser's
seconds from opening the file to every chart drawn, the run over time's traces that ask for WebGL (none) and the
points its lines draw (where playwright and Debian's chromium are installed, else why not). Prints one JSON object.

    python3 bench/timeline_scale.py                    # 1000 x 10000 x 8
    python3 bench/timeline_scale.py --ranks 64 --steps 1000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))
from ingest import measured  # noqa: E402

from rlprof.analyze.inputs.timeline_file import BUSY, DTYPE, TIMELINE_DIR, WARMUP, columns, rank_file  # noqa: E402
from rlprof.vocab import STAGES  # noqa: E402

USED = (
    "weight_sync",
    "rollout_generate",
    "reward_compute",
    "ref_compute_log_prob",
    "actor_compute_log_prob",
    "advantage_compute",
    "actor_update",
    "critic_update",
)  # 8 stages, in the order a step runs them
BASE_S = {
    "weight_sync": 0.05,
    "rollout_generate": 2.0,
    "reward_compute": 0.3,
    "ref_compute_log_prob": 0.6,
    "actor_compute_log_prob": 0.6,
    "advantage_compute": 0.01,
    "actor_update": 1.5,
    "critic_update": 0.8,
}
FRACTIONS = (0.617, 0.6, 0.4321)  # the straggling rank, the step it starts at, the spike's step: shares of the run


def planted(ranks: int, steps: int) -> tuple[int, int, int]:
    return int(FRACTIONS[0] * ranks), int(FRACTIONS[1] * steps), int(FRACTIONS[2] * steps)


def make_run(folder: Path, ranks: int, steps: int) -> int:
    straggler, straggle_from, spike_step = planted(ranks, steps)
    (folder / TIMELINE_DIR).mkdir(parents=True)
    (folder / TIMELINE_DIR / "columns.json").write_text(json.dumps(columns()))
    rng = np.random.default_rng(0)
    busy = rng.random(steps) < 0.02
    drift = np.linspace(1.0, 1.5, steps)
    total = 0
    for rank in range(ranks):
        rec = np.zeros(steps, DTYPE)
        rec["step"] = np.arange(1, steps + 1)
        rec["flags"] = np.where(busy, BUSY, 0) | np.where(rec["step"] <= 3, WARMUP, 0)
        rec["stage_s"] = np.nan
        rec["stage_start_s"] = np.nan
        at = 0.0
        for name in USED:
            i = STAGES.index(name)
            t = BASE_S[name] * (1 + 0.05 * rng.standard_normal(steps)).astype(np.float32)
            if name == "rollout_generate":
                t = t * drift
            if name == "reward_compute" and rank == straggler:
                t[straggle_from - 1 :] *= 3
            if name == "actor_update":
                t[spike_step - 1] *= 4
            rec["stage_s"][:, i] = t
            rec["stage_start_s"][:, i] = at
            at = at + t
        rec["step_s"] = at
        path = rank_file(folder, rank)
        rec.tofile(path)
        total += path.stat().st_size
    return total


def opened(report: Path) -> dict:
    """The report in headless Chromium without a GPU: seconds until every chart is drawn, the run over time's traces
    that ask for WebGL, the points its lines draw; or why it could not be opened."""
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    try:
        from playwright import sync_api
    except ImportError:
        return {"skipped": "playwright is not installed (pip install playwright)"}
    if not Path(chromium).exists():
        return {"skipped": "Debian's chromium is not installed (apt-get install chromium)"}
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        t = time.perf_counter()
        page.goto(report.as_uri())
        page.wait_for_function(
            "() => document.querySelectorAll('.js-plotly-plot').length === document.querySelectorAll('.chart').length"
        )
        seconds = time.perf_counter() - t
        traces = page.evaluate(
            "() => document.getElementById('chart-over_time')._fullData.map(t => [t.type, t.mode, t.x.length])"
        )
        browser.close()
    return {
        "seconds_to_drawn": round(seconds, 2),
        "webgl_traces": sum(kind.endswith("gl") for kind, _, _ in traces),
        "line_points": max(n for _, mode, n in traces if mode == "lines"),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=10000)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rlprof-timeline-"))
    try:
        run = tmp / "run"
        size = make_run(run, args.ranks, args.steps)
        cmd = [sys.executable, "-m", "rlprof.cli", "analyze", str(run), "-o", str(tmp / "out")]
        env = dict(os.environ, PYTHONPATH=str(HERE.parent / "src"))
        seconds, peaks, _ = measured(cmd, env=env)
        doc = json.loads((tmp / "out" / "analysis.json").read_text())["timeline"]
        report = tmp / "report.html"
        report_seconds, _, _ = measured(
            [sys.executable, "-m", "rlprof.cli", "report", str(tmp / "out" / "analysis.json"), "-o", str(report)],
            env=env,
        )
        straggler, _, spike_step = planted(args.ranks, args.steps)
        found = {
            "straggler": any(s["rank"] == straggler and s["stage"] == "reward_compute" for s in doc["stragglers"]),
            "other_stragglers": [s for s in doc["stragglers"] if s["rank"] != straggler][:5],
            "spike": any(s["step"] == spike_step and s["stage"] == "actor_update" for s in doc["spikes"]),
            "spikes": len(doc["spikes"]),
            "drift": [d["stage"] for d in doc["drift"]],
            # the straggler's slow rank makes reward_compute's job time (its slowest rank) rise from its first step
            "level_shifts": [(s["stage"], s["from_step"]) for s in doc["level_shifts"]],
        }
        print(
            json.dumps(
                {
                    "ranks": args.ranks,
                    "steps": args.steps,
                    "stages": len(USED),
                    "timeline_mb": round(size / 1e6, 1),
                    "seconds": round(seconds, 2),
                    "peak_mb": {k: round(v, 1) for k, v in peaks.items()},
                    "limit": {"seconds": 10, "peak_mb": 1000},
                    "found": found,
                    "report": {"seconds": round(report_seconds, 2), "mb": round(report.stat().st_size / 1e6, 1)},
                    "browser": opened(report),
                }
            )
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

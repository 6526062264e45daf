"""docs/trackers.md's picture: rlprof's per-step scalars in TensorBoard beside the reward curve. Trains the reference
trainer with the watch on and `trainer.logger=[tensorboard]` (one sample of each step made long from step 14, the
test aid trainer.debug.long_sample, so the rollout's tail shows), serves the event files with TensorBoard's own
server on localhost and screenshots its Time Series dashboard in Debian's chromium (playwright, no download).

    python3 bench/tracker_picture.py [--out docs/img] [--steps 28]   (needs rlprof[tracking])
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TAGS = "reward_mean|rlprof/rollout/sample_ms/p99|rlprof/rollout/tail_share|rlprof/time/rollout_generate/max_s"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    parser.add_argument("--steps", type=int, default=28)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as work:
        env = {k: v for k, v in os.environ.items() if k != "TENSORBOARD_DIR"}
        subprocess.run(
            [
                sys.executable,
                "-m",
                "rlprof.trainer",
                f"trainer.steps={args.steps}",
                "trainer.logger=[tensorboard]",
                f"trainer.output_dir={work}/train",
                "trainer.experiment_name=picture",
                "global_profiler.tool=torch",
                f"global_profiler.save_path={work}/profile",
                "actor_rollout_ref.actor.profiler.enable=true",
                "+global_profiler.trigger.slow.factor=2.0",
                "rollout.max_new_tokens=8",
                "trainer.debug.long_sample.from_step=14",
                "trainer.debug.long_sample.tokens=40",
                "actor.lr=2e-3",
            ],
            cwd=work,
            check=True,
            stdout=subprocess.DEVNULL,
            env=env,
        )
        port = free_port()
        board = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tensorboard.main",
                "--logdir",
                f"{work}/train/tensorboard_log",
                "--port",
                str(port),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            args.out.mkdir(parents=True, exist_ok=True)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox", "--disable-gpu"])
                page = browser.new_page(viewport={"width": 1500, "height": 1000})
                for _ in range(60):  # the server takes a few seconds to listen
                    try:
                        page.goto(f"http://127.0.0.1:{port}/#timeseries")
                        break
                    except Exception:
                        time.sleep(0.5)
                tags = "input[placeholder='Filter tags (regex)']"
                page.wait_for_selector(tags, timeout=60000)
                page.click(tags)
                page.keyboard.type(TAGS)
                page.keyboard.press("Enter")
                page.click("[aria-label='Close side pane']")  # the settings pane, open on a first visit
                page.wait_for_timeout(5000)  # the charts load their points
                page.screenshot(path=str(args.out / "tracker_tensorboard.png"))
                browser.close()
        finally:
            board.terminate()
            board.wait(timeout=30)
    print(os.fspath(args.out / "tracker_tensorboard.png"), re.sub(r"\s+", " ", TAGS))


if __name__ == "__main__":
    main()

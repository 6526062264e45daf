"""The README's pictures of the report: trains the reference trainer with a slow verifier (`reward.cost_ms=3`, so
the report opens with a cause), renders its report.html in Debian's chromium and writes two PNGs to docs/img/.

    python3 bench/report_picture.py [--out docs/img]
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as work:
        subprocess.run(
            [sys.executable, "-m", "rlprof.trainer", "reward.cost_ms=3"],
            cwd=work,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        report = next(Path(work, "outputs", "profile").glob("*/report.html"))
        args.out.mkdir(parents=True, exist_ok=True)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.goto(report.resolve().as_uri())
            page.wait_for_timeout(2000)  # plotly draws after load
            page.screenshot(
                path=str(args.out / "report_findings.png"), clip={"x": 0, "y": 0, "width": 1100, "height": 560}
            )
            timeline = page.query_selector_all("h2")[1].bounding_box()["y"] - 20
            page.screenshot(
                path=str(args.out / "report_timeline.png"),
                full_page=True,
                clip={"x": 0, "y": timeline, "width": 1100, "height": 1030},
            )
            browser.close()
    print(os.fspath(args.out))


if __name__ == "__main__":
    main()

"""Background analysis worker: reads {"path", "run_dir"} lines on stdin, analyses each window.

Runs in its own process with no torch import; a failure on one window is reported and skipped.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    from ..analyze.window import analyze_window_file

    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        job = json.loads(line)
        try:
            analyze_window_file(job["path"])
        except Exception as exc:  # one bad window must not stop the others
            print(f"rlprof: analysis of {job['path']} failed: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

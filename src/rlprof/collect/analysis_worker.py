"""Background analysis worker: reads {"path", "run_dir", "meta"} lines on stdin, analyses each window.

Runs in its own process with no torch import; a failure on one window is reported and skipped.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> int:
    from ..analyze.per_file import analyze_file, cache_key, cache_path

    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        job = json.loads(line)
        try:
            path, meta = Path(job["path"]), job.get("meta") or {}
            result = analyze_file(path, meta)
            result["cache"] = cache_key(meta, 50, False)  # `rlprof analyze` reuses it for the same window
            out = cache_path(path)
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps(result))
            tmp.replace(out)
        except Exception as exc:  # one bad window must not stop the others
            print(f"rlprof: analysis of {job['path']} failed: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Background analysis worker: reads {"path", "run_dir", "meta"} lines on stdin, analyses each window.

Runs in its own process with no torch import; a failure on one window is reported and skipped.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> int:
    from ..analyze.window.per_file import analyze_file, cache_key, cache_path

    failed: dict[str, list[str]] = {}  # kind of failure -> the windows it failed: the first said, the rest counted
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        job = json.loads(line)
        tmp = None
        try:
            path, meta = Path(job["path"]), job.get("meta") or {}
            result = analyze_file(path, meta)
            result["cache"] = cache_key(meta, 50, False)  # `rlprof analyze` reuses it for the same window
            out = cache_path(path)
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps(result))
            tmp.replace(out)
        except Exception as exc:  # one bad window must not stop the others
            if tmp is not None:
                tmp.unlink(missing_ok=True)  # a full disk leaves no temporary behind
            kind = f"{type(exc).__name__} {getattr(exc, 'errno', '')}"
            failed.setdefault(kind, []).append(job["path"])
            if len(failed[kind]) == 1:
                print(f"rlprof: analysis of {job['path']} failed: {exc}", file=sys.stderr)
    for names in failed.values():
        if len(names) > 1:
            print(f"rlprof: the analysis of {len(names) - 1} more window(s) failed the same way", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

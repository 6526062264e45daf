"""Analysis on collection, off the training critical path.

One background worker process per Profiler (started on first use) receives finished windows over
a pipe and analyses them; the training loop only writes one line to the pipe.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys

log = logging.getLogger("rlprof")


class AnalysisHook:
    def __init__(self):
        self._proc: subprocess.Popen | None = None

    def submit(self, path: str, run_dir: str, meta: dict | None = None) -> None:
        if self._proc is None:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "rlprof.collect.analysis_worker"], stdin=subprocess.PIPE, text=True
            )
        try:
            self._proc.stdin.write(json.dumps({"path": path, "run_dir": run_dir, "meta": meta or {}}) + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            log.warning("rlprof: analysis worker is gone (%s); windows are kept, run `rlprof analyze` later", exc)

    def close(self, timeout: float | None = 600) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()
            proc.wait(timeout=timeout)
        except (subprocess.TimeoutExpired, OSError):
            log.warning("rlprof: background analysis still running after %ss; leaving it to finish", timeout)

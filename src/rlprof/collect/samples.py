"""The rollout's samples as the hosts record them: one record per sample (analyze/inputs/samples_file.py says the layout and
the fields), appended as one write() per step (or per engine iteration) to the host's own file in the run directory,
so that a crash loses at most the records in flight.

On whenever the watch or a window is on for the step (`Profiler.samples_wanted`); off, nothing here runs and no
file is made. A fault writing them is the profiler's, never the training's (as a window's, collect/window.py): a
full disk or a vanished directory is one line, the first time, and the training goes on; each later step tries
again, and a write the disk cut short is taken back, so the file never holds half a record before a whole one."""

from __future__ import annotations

import errno
import logging
import os
import time
from pathlib import Path

import msgspec

from ..analyze.inputs.samples_file import samples_path
from ..warn_once import warn_once

log = logging.getLogger("rlprof")
_encoder = msgspec.json.Encoder()


def wall_us() -> int:
    """The records' clock: this host's wall clock, microseconds since the epoch (the manifest's start_ns / 1000)."""
    return time.time_ns() // 1000


def record(**fields) -> dict:
    """A sample's record: the fields its host knows (None: not known, left out)."""
    return {k: v for k, v in fields.items() if v is not None}


class SampleWriter:
    """One host's sample file (`samples/<source>_<who>.jsonl` of `run_dir`), made on the first write."""

    def __init__(self, run_dir: Path, source: str, *, said=None, **who: int | None):
        self.path = samples_path(run_dir, source, **who)  # who: rank, replica or worker
        self.said = said  # warn_once's scope (a Profiler's; None: the process)
        self.written = 0  # records on disk
        self.lost = 0  # records a fault cost
        self._fd: int | None = None

    def write(self, records: list[dict]) -> bool:
        """Append `records` in one write(); False (said once) where a fault cost them."""
        if not records:
            return True
        data = _encoder.encode_lines(records)
        try:
            self._append(data)
        except Exception as exc:
            self.lost += len(records)
            self.close()  # a vanished directory: the next write opens the file again
            warn_once(
                ("samples", type(exc).__name__, getattr(exc, "errno", None)),
                "rlprof: could not write %d sample records to %s (%s: %s); training goes on, the samples of later "
                "steps are tried again without another line",
                len(records),
                self.path,
                type(exc).__name__,
                getattr(exc, "strerror", None) or exc,
                said=self.said,
            )
            return False
        self.written += len(records)
        return True

    def _append(self, data: bytes) -> None:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        end = os.fstat(self._fd).st_size
        try:
            written = os.write(self._fd, data)
        except OSError:
            written = -1
            raise
        finally:
            if written != len(data):  # cut by a full disk: taken back, so the next step's records start a line
                try:
                    os.ftruncate(self._fd, end)
                except OSError:
                    pass
        if written != len(data):
            raise OSError(
                errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: only {written} of {len(data)} bytes were written"
            )

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

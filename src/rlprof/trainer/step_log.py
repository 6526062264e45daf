"""Rank 0's record of each step as it ends: its metrics appended to metrics.jsonl (the trainer's own output directory,
never the profile's disk: a job preempted at step 900 keeps its 899 steps), and, to the trackers `trainer.logger`
names (verl's key and meaning: `[console, tensorboard, wandb, mlflow]`), its GRPO metrics and rlprof's measures of
the step (analyze/over_time/step_measures.py: the watch's stage times over every
rank, the rollout's samples, the trigger's verdict, a capture's cause) sent to the trackers named, as the step ends.

rlprof's measures are read from the run directory (every rank has written its timeline record and samples of the
step by then: the step's last all-reduce waits for them), so a tracker holds what the run directory holds. A tracker
that is not installed or cannot start is one line and the training goes on without it; so is one that fails while
logging. The console: the progress line is the GRPO metrics' already; it adds a line of rlprof's measures."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from ..analyze.over_time.step_measures import PAST_STEPS, RunReader, finite
from ..report.trackers import Unavailable, open_tracker, step_scalars
from ..warn_once import warn_once


class StepLog:
    def __init__(self, cfg, prof, output_dir: Path, console=None):
        t = cfg.trainer
        self.prof = prof
        run_dir = Path(output_dir) / (prof.run_id or time.strftime("%Y%m%d-%H%M%S"))
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / "metrics.jsonl"
        self._file = open(self.path, "w")
        self.reader = RunReader(prof.watch_dir)
        self.trackers = []
        config = dataclasses.asdict(cfg)
        experiment = t.experiment_name or prof.run_id or "train"
        for name in t.logger:
            try:
                self.trackers.append(
                    open_tracker(
                        name, output_dir, project=t.project_name, experiment=experiment, config=config, console=console
                    )
                )
            except Unavailable as exc:
                print(f"rlprof train: {exc}; training goes on without it", flush=True)

    def append(self, metrics: dict) -> None:
        """One step's metrics: a line of metrics.jsonl, flushed; then to every tracker with rlprof's measures."""
        self._file.write(json.dumps(metrics) + "\n")
        self._file.flush()
        self.log(metrics)

    def log(self, metrics: dict) -> None:
        """One step's metrics and rlprof's measures of it, to every tracker."""
        if not self.trackers:
            return
        step = metrics["step"]
        try:
            self.reader.read()
            measures = finite(self.reader.measures(step, self.prof.step_captures))
            late = self.reader.late()
        except Exception as exc:
            warn_once(
                "step-measures",
                "rlprof train: rlprof's measures of the step could not be read (%s: %s)",
                type(exc).__name__,
                exc,
            )
            measures, late = {}, {}
        grpo = step_scalars(metrics)
        for tracker in list(self.trackers):
            data = measures if tracker.name == "console" else {**grpo, **measures}
            self._send(tracker, data, step)
            for k, m in late.items():
                if tracker.name in PAST_STEPS:
                    self._send(tracker, finite(m), k)
                else:
                    warn_once(
                        ("late", tracker.name),
                        "rlprof train: step %d's samples arrived after it was logged; %s takes no earlier step: they "
                        "are in the run directory (rlprof export)",
                        k,
                        tracker.name,
                    )

    def _send(self, tracker, data: dict, step: int) -> None:
        try:
            tracker.log(data, step)
        except Exception as exc:
            self.trackers.remove(tracker)
            print(
                f"rlprof train: the {tracker.name} logger failed ({type(exc).__name__}: {exc}); training goes on without it",
                flush=True,
            )

    def close(self) -> None:
        self._file.close()
        for tracker in self.trackers:
            try:
                tracker.close()
            except Exception as exc:
                print(
                    f"rlprof train: the {tracker.name} logger did not close ({type(exc).__name__}: {exc})", flush=True
                )
        self.trackers = []

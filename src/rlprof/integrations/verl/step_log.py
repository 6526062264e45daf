"""rlprof's measures of each step in the metrics main_ppo's driver logs: verl builds the step's metrics dict in its
v1 trainer's `_compute_metrics` and hands it to `Tracking.log(data=metrics, step=...)`, which sends it to every
backend `trainer.logger` names (console, tensorboard, wandb, mlflow, swanlab, ...). trigger.py wraps
`_compute_metrics`; here, the step's `rlprof/...` measures (analyze/over_time/step_measures.py: the watch's timeline,
the agent loop's samples, the trigger's verdict, the capture taken) join that dict, numbers only, so that every
backend the job names takes them and nothing is sent anywhere else. No new config: on where the job watches
(`global_profiler.trigger`) or profiles steps (`global_profiler.steps` with a role's profiler enabled).

Samples of a step that arrive after it was logged (an async trainer's rollout running ahead or behind) go to their
own step on the backends that take an earlier step (`PAST_STEPS`: tensorboard, mlflow, console, file), through
verl's own backend objects; for the others (wandb, ...) one line says so: they are in the run directory."""

from __future__ import annotations

from pathlib import Path

from ...analyze.over_time.step_measures import PAST_STEPS, RunReader, finite
from ...warn_once import warn_once


class StepLog:
    def __init__(self, run_dir: Path):
        self.reader = RunReader(run_dir)

    def add(self, trainer, metrics: dict, step: int, captures) -> None:
        """The step's measures into verl's metrics dict; late samples to their own step where a backend allows."""
        self.reader.read()
        metrics.update(finite(self.reader.measures(step, list(captures))))
        late = self.reader.late()
        if not late:
            return
        backends = getattr(getattr(trainer, "logger", None), "logger", None) or {}
        for name, backend in backends.items():
            for k, m in late.items():
                if name in PAST_STEPS:
                    backend.log(data=finite(m), step=k)
                else:
                    warn_once(
                        ("late", name),
                        f"rlprof: step {k}'s samples reached the run directory after verl logged step {k}; {name} "
                        "takes no earlier step, so they are only in the run directory (rlprof export)",
                    )

"""Experiment trackers as rlprof writes to them: TensorBoard event files, a W&B run, an MLflow run and the console,
behind one `log(data, step)` / `text(name, markdown)` / `close()` interface, for rlprof's trainer
(`trainer.logger`, verl's key and meaning) and `rlprof export` (a past run written as a tracker run).

The trackers are optional (`pip install rlprof[tracking]`, or the user's own install): one that is not installed,
or that cannot start (W&B online without a login), is `Unavailable`, said in one line naming it. None imports torch:
TensorBoard's events are written with tensorboard's own EventFileWriter. Where each writes, as verl's
Tracking does: TensorBoard in TENSORBOARD_DIR, else `<dir>/tensorboard_log/<project>/<experiment>`; W&B in `<dir>`,
in the mode WANDB_MODE says (`offline` needs no network; `rlprof export` always writes offline); MLflow to
MLFLOW_TRACKING_URI, else a SQLite store `<dir>/mlflow.db` (`rlprof export`: always the latter), a new experiment's
artifacts (the findings' text) in `<dir>/mlartifacts`."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

LOGGERS = ("console", "tensorboard", "wandb", "mlflow")
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow-skinny"}
INSTALL = "pip install 'rlprof[tracking]'"


class Unavailable(Exception):
    """A tracker that cannot be written to here: the one line that says why."""


def _need(name: str):
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise Unavailable(
            f"the {name} logger needs {PACKAGES[name]}, which is not installed ({exc}): {INSTALL}"
        ) from None


class Console:
    """verl's console line: `step:N - key:value - ...`, the numbers only (`out`: where a line goes, print's
    default)."""

    name = "console"

    def __init__(self, out=None):
        self.out = out or (lambda line: print(line, flush=True))

    def log(self, data: dict, step: int) -> None:
        parts = [f"{k}:{v:.6g}" if isinstance(v, float) else f"{k}:{v}" for k, v in data.items() if _number(v)]
        if parts:
            self.out(f"step:{step} - " + " - ".join(parts))

    def text(self, name: str, markdown: str) -> None:
        self.out(f"{name}:\n{markdown}")

    def close(self) -> None:
        pass


class TensorBoard:
    """Scalars (and a text panel) in a TensorBoard event file, through tensorboard's own writer (no torch)."""

    name = "tensorboard"

    def __init__(self, logdir: Path):
        _need("tensorboard")
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        self._event, self._summary = Event, Summary
        self._writer = EventFileWriter(str(self.logdir))

    def log(self, data: dict, step: int) -> None:
        values = [self._summary.Value(tag=k, simple_value=float(v)) for k, v in data.items() if _number(v)]
        if values:
            self._writer.add_event(
                self._event(wall_time=time.time(), step=int(step), summary=self._summary(value=values))
            )

    def text(self, name: str, markdown: str) -> None:
        from tensorboard.compat.proto.summary_pb2 import SummaryMetadata
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto

        meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
        tensor = TensorProto(dtype=7, string_val=[markdown.encode()], tensor_shape=TensorShapeProto())  # DT_STRING
        value = self._summary.Value(tag=name, metadata=meta, tensor=tensor)
        self._writer.add_event(self._event(wall_time=time.time(), step=0, summary=self._summary(value=[value])))

    def close(self) -> None:
        self._writer.close()


class Wandb:
    """A W&B run (offline where asked: no network)."""

    name = "wandb"

    def __init__(self, directory: Path, project: str, experiment: str, config: dict | None, offline: bool = False):
        wandb = _need("wandb")
        Path(directory).mkdir(parents=True, exist_ok=True)
        mode = "offline" if offline else os.environ.get("WANDB_MODE") or None
        try:
            self.run = wandb.init(
                project=project,
                name=experiment,
                dir=str(directory),
                config=config,
                mode=mode,
                entity=os.environ.get("WANDB_ENTITY"),
                reinit="create_new",
            )
        except Exception as exc:
            raise Unavailable(
                f"the wandb logger could not start ({type(exc).__name__}: {exc}); WANDB_MODE=offline needs no network"
            ) from None

    def log(self, data: dict, step: int) -> None:
        self.run.log({k: v for k, v in data.items() if _number(v)}, step=int(step))

    def text(self, name: str, markdown: str) -> None:
        self.run.summary[name] = markdown

    def close(self) -> None:
        self.run.finish()


class Mlflow:
    """An MLflow run, in the tracking store the URI names."""

    name = "mlflow"

    def __init__(self, uri: str, project: str, experiment: str, config: dict | None, artifacts: Path):
        _need("mlflow")
        from mlflow.tracking import MlflowClient

        try:
            self.client = MlflowClient(tracking_uri=uri)
            found = self.client.get_experiment_by_name(project)
            exp = (
                found.experiment_id
                if found is not None
                else self.client.create_experiment(project, artifact_location=artifacts.resolve().as_uri())
            )
            self.run_id = self.client.create_run(exp, run_name=experiment).info.run_id
        except Exception as exc:
            raise Unavailable(f"the mlflow logger could not start at {uri} ({type(exc).__name__}: {exc})") from None
        self.uri = uri
        for key, value in _flat(config or {}).items():
            self.client.log_param(self.run_id, key[:250], str(value)[:6000])

    def log(self, data: dict, step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, int(step)) for k, v in data.items() if _number(v)]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def text(self, name: str, markdown: str) -> None:
        self.client.log_text(self.run_id, markdown, f"{name.replace('/', '_')}.md")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _flat(config: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        out |= _flat(v, key + ".") if isinstance(v, dict) else {key: v}
    return out


def open_tracker(
    name: str,
    directory: Path,
    *,
    project: str,
    experiment: str,
    config: dict | None = None,
    export: bool = False,
    console=None,
):
    """The tracker `name` (one of LOGGERS) writing under `directory`, as the module's text says; `export`: a past
    run's own store in `directory` (TensorBoard's event files right there, W&B offline, MLflow's SQLite file);
    `console`: where the console's lines go.
    Unavailable when it cannot be had here; ValueError for a name that is no tracker."""
    directory = Path(directory)
    if name == "console":
        return Console(console)
    if name == "tensorboard":
        where = os.environ.get("TENSORBOARD_DIR") if not export else None
        return TensorBoard(
            Path(where) if where else directory if export else directory / "tensorboard_log" / project / experiment
        )
    if name == "wandb":
        return Wandb(directory, project, experiment, config, offline=export)
    if name == "mlflow":
        uri = (
            os.environ.get("MLFLOW_TRACKING_URI") if not export else None
        ) or f"sqlite:///{directory.resolve()}/mlflow.db"
        directory.mkdir(parents=True, exist_ok=True)
        return Mlflow(uri, project, experiment, config, artifacts=directory / "mlartifacts")
    raise ValueError(f"{name!r} is no tracker; allowed: {', '.join(LOGGERS)}")


def step_scalars(metrics: dict) -> dict:
    """rlprof's trainer's own metrics of a step as a tracker's numbers: its GRPO metrics and each stage's time
    (`timing_ms/<stage>`; the step number and the profiled flag left out)."""
    out = {k: v for k, v in metrics.items() if k not in ("step", "profiled") and _number(v)}
    return out | {f"timing_ms/{stage}": ms for stage, ms in (metrics.get("stage_ms") or {}).items() if _number(ms)}


def export_run(run_dir: Path, to: str, out_dir: Path, say=print) -> dict:
    """A finished or crashed run directory written as a tracker run in `out_dir`: each step's measures
    (analyze/over_time/step_measures.py), its trainer metrics where metrics.jsonl is beside them, what the analysis
    found at its steps and its findings as a text panel. {steps, keys, findings, analysis}: what was written.
    RLProfError (one line) for a directory with nothing to export; Unavailable for a tracker not installed."""
    import json

    from ..analyze.over_time.step_measures import finding_measures, findings_text, finite, run_measures
    from ..analyze.over_time.timeline import triggered_windows
    from ..analyze.inputs.samples_file import sample_files
    from ..analyze.inputs.timeline_file import timeline_ranks
    from ..errors import AnalyzeError, RLProfError

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RLProfError(
            f"{run_dir} is not a directory; allowed: a run directory rlprof's watch or a profiled run wrote"
        )
    if not timeline_ranks(run_dir) and not sample_files(run_dir):
        raise RLProfError(
            f"{run_dir} holds no watch timeline (timeline/) and no sample records (samples/): nothing to export; "
            "allowed: a run directory of a watched run (global_profiler.trigger) or of profiled steps"
        )
    tracker = open_tracker(to, out_dir, project="rlprof", experiment=run_dir.name, config=None, export=True)
    at: dict[int, dict] = {}
    for step, m in run_measures(run_dir, triggered_windows(run_dir)):
        at.setdefault(step, {}).update(m)
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a line a crash cut
            if isinstance(row, dict) and isinstance(row.get("step"), int):
                at.setdefault(row["step"], {}).update(step_scalars(row))
    doc, why = None, None
    try:
        from ..analyze.pipeline import analyze

        doc = analyze(run_dir)
    except AnalyzeError as exc:
        why = str(exc)
    text = ""
    if doc is not None:
        for step, m in finding_measures(doc):
            at.setdefault(step, {}).update(m)
        text = findings_text(doc)
    keys = set()
    try:
        for step in sorted(at):
            data = finite(at[step])
            keys |= set(data)
            tracker.log(data, step)
        if text:
            tracker.text("rlprof/findings", text)
    finally:
        tracker.close()
    if why:
        say(f"rlprof: the run's analysis is not in the export ({why}); its steps' measures are")
    return {
        "steps": sorted(at),
        "keys": sorted(keys),
        "findings": len((doc or {}).get("findings") or ()),
        "analysis": doc is not None,
    }

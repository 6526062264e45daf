"""The model a run computed with (the document's `model`, in Hugging Face's terms: frameworks/hf_models.py), from the
first of: what the user gave (`rlprof analyze --model PATH_OR_CONFIG`), what a collector recorded with its windows
(vLLM's engine through rlprof's plugin: the model it loaded), what rlprof's trainer left beside its traces
(trainer_config.json: the model it built or loaded). Where none is known, the record says why and how to give it; the
rest of the analysis stands."""

from __future__ import annotations

import json
from pathlib import Path

from ...errors import AnalyzeError
from ...frameworks.hf_models import model_record, trainer_model
from .find import MODEL_FILE

ALLOWED = "a checkpoint directory holding config.json, a config.json file, or its JSON text"
UNKNOWN = (
    "no model known: the run recorded none (rlprof's trainer and vLLM through rlprof's plugin record theirs); "
    "give it with `rlprof analyze --model PATH` (a checkpoint directory or its config.json)"
)


def given_model(spec: str) -> dict:
    """The model the user named: a checkpoint directory, a config.json, or the config's JSON text (one line naming
    what is wrong and what is allowed otherwise)."""
    text, source = spec, "given as JSON"
    if not spec.lstrip().startswith("{"):
        path = Path(spec)
        path = path / "config.json" if path.is_dir() else path
        try:
            text, source = path.read_text(), f"given: {path}"
        except (OSError, UnicodeDecodeError) as exc:
            raise AnalyzeError(f"--model {spec}: cannot be read ({exc}); allowed: {ALLOWED}") from None
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise AnalyzeError(f"--model {spec}: not JSON ({exc}); allowed: {ALLOWED}") from None
    record = model_record(config, source)
    if record is None:
        raise AnalyzeError(
            f"--model {spec}: not a model's config (hidden_size, num_hidden_layers, num_attention_heads and "
            f"vocab_size needed); allowed: {ALLOWED}"
        )
    return record


def run_model(path, recorded: list, run_config: dict | None, given: dict | None = None) -> dict:
    """The document's `model`: `given`, else the first a window recorded (`recorded`: the windows' `model` records
    in input order), else a run directory's MODEL_FILE under `path`, else rlprof's trainer's, else a record saying why
    none is known."""
    if given is not None:
        return given
    for record in [*recorded, *_model_files(path)]:
        if isinstance(record, dict) and record.get("hidden_size"):
            return record
    data = _trainer_config(run_config)
    if data is not None:
        source = f"rlprof's trainer: {run_config['source']}"
        if isinstance(data.get("model"), dict) and data["model"].get("hidden_size"):
            return {**data["model"], "source": source}
        model_cfg = (data.get("config") or {}).get("model") or {}
        built = trainer_model(model_cfg, source + " (built from its model settings)")
        if built is not None:
            return built
        checkpoint = model_cfg.get("path") if isinstance(model_cfg, dict) else None
        if checkpoint:
            try:
                loaded = given_model(str(checkpoint))  # the trainer loads a checkpoint in float32 (trainer/model.py)
                return loaded | {"source": f"rlprof's trainer's checkpoint: {checkpoint}", "dtype": "float32"}
            except AnalyzeError as exc:
                return {"source": None, "why": f"the trainer's checkpoint {checkpoint} cannot be read now: {exc}"}
    return {"source": None, "why": UNKNOWN}


def _trainer_config(run_config: dict | None) -> dict | None:
    """trainer_config.json as the trainer wrote it (run_config keeps only part of it)."""
    if not run_config or not run_config.get("source"):
        return None
    try:
        data = json.loads(Path(run_config["source"]).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_model_file(run_dir, record: dict) -> None:
    """A collector's model record as its run directory's MODEL_FILE, whole or not at all (several processes of one job
    may write the same record)."""
    import os
    import tempfile

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=".model.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    os.replace(tmp, run_dir / MODEL_FILE)


def _model_files(path) -> list[dict]:
    """The model records a run directory (or its run directories, one level down: a save_path) holds."""
    path = Path(path)
    if not path.is_dir():
        return []
    out = []
    for f in sorted([*path.glob(MODEL_FILE), *path.glob(f"*/{MODEL_FILE}")]):
        try:
            out.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue
    return out

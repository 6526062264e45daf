"""`rlprof analyze`: find the inputs, schedule them (worker processes, byte ranges or Ray), analyse each, and
assemble one analysis document per path. Each job is its own module: inputs, per_file, schedule / distributed,
document."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import AnalyzeError
from .document import document
from .tables.schema import SCHEMA_VERSION
from .diagnosis.findings import diagnose
from .inputs.find import find_inputs, is_analysis_file
from .workers.schedule import run_inputs
from .over_time.timeline import timeline_only


def analyze(
    path: str | Path,
    *,
    workers: int | None = None,
    use_ray: bool = False,
    progress=None,
    top: int | None = 50,
    by_shape: bool = False,
    model: dict | None = None,
) -> dict:
    """`top`: operators kept per window (None: all, as compare needs); `by_shape`: keep input shapes; `model`: the
    model the run computed with, where the user gave it (analyze/inputs/model_config.py: given_model)."""
    return analyze_each(
        [path], workers=workers, use_ray=use_ray, progress=progress, top=top, by_shape=by_shape, model=model
    )[0]


def analyze_each(
    paths: list,
    *,
    workers: int | None = None,
    use_ray: bool = False,
    progress=None,
    top: int | None = 50,
    by_shape: bool = False,
    model: dict | None = None,
) -> list[dict]:
    """One analysis document per path, their files scheduled together (compare's two sides share the cores)."""
    if use_ray:  # the inputs are listed by the nodes that hold them
        from .workers.distributed import analyze_on_cluster

        docs = []
        for path in paths:
            results, warnings = analyze_on_cluster(str(path), top, by_shape, progress)
            docs.append(document(path, results, warnings, model=model))
        return docs
    side_inputs = [
        [] if timeline_only(path) else [(p, meta, top, by_shape) for p, meta in find_inputs(path)] for path in paths
    ]
    results = run_inputs([job for inputs in side_inputs for job in inputs], workers or os.cpu_count() or 1, progress)
    docs, at = [], 0
    for path, inputs in zip(paths, side_inputs):
        docs.append(document(path, results[at : at + len(inputs)], model=model))
        at += len(inputs)
    return docs


def load_analysis(
    path: str | Path, *, top: int | None = 50, by_shape: bool = False, workers: int | None = None, use_ray: bool = False
) -> dict:
    """An analysis document from anything `rlprof analyze` reads, or from its analysis.json."""
    path = Path(path)
    if is_analysis_file(path):
        return read_document(path)
    return analyze(path, workers=workers, top=top, by_shape=by_shape, use_ray=use_ray)


def read_document(path: str | Path) -> dict:
    """An analysis.json's JSON, its schema version checked: one line naming the file and what is allowed."""
    import json

    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise AnalyzeError(
            f"{path}: cannot be read ({exc.strerror or exc}); allowed: an analysis.json written by rlprof analyze"
        ) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise AnalyzeError(f"{path}: not JSON ({exc}); allowed: an analysis.json written by rlprof analyze") from None
    if not isinstance(doc, dict) or "schema_version" not in doc:
        raise AnalyzeError(
            f"{path}: not an analysis (no schema_version); allowed: an analysis.json written by rlprof analyze"
        )
    if doc["schema_version"] != SCHEMA_VERSION or "rows" not in doc:
        raise AnalyzeError(
            f"{path}: analysis schema {doc['schema_version']!r} is not readable; "
            f"allowed: schema {SCHEMA_VERSION} (re-run rlprof analyze on the traces)"
        )
    if "findings" not in doc:  # written before findings existed: made from its tables, as then
        try:
            doc["measures"], doc["findings"] = diagnose(doc)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # tables findings cannot read
            raise AnalyzeError(
                f"{path}: not an analysis of schema {SCHEMA_VERSION} (its tables lack what findings "
                f"read: {type(exc).__name__}: {exc}); allowed: an analysis.json written by rlprof "
                "analyze"
            ) from None
    return doc

"""The analysable inputs in tests/data, named once: the invariants, the typed result's tests and
bench/same_documents.py all read every one of them (no torch or rlprof import here: the bench loads this alone)."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"

# the frameworks' own layouts: verl's discrete and e2e traces, MindSpeed-RL's torch_npu collections (db, mstx ranges)
FRAMEWORK_OUTPUTS = [
    "verl/output/discrete",
    "verl/output/e2e",
    "ascend/mindspeed/profiler_data/integrated",
    "ascend/mindspeed/profiler_data_mstx",
    "ascend/real/kernel_details",
    "ascend/real/trace_view",
]
RUN_GROUPS = ("runs", "h100", "compare", "samples", "sol")  # folders of run directories


def analysable_inputs() -> list[str]:
    """Every input, relative to tests/data: run directories, single real traces, a real torch_npu collection, the
    frameworks' output folders."""
    found = [f"{group}/{p.name}" for group in RUN_GROUPS for p in sorted((DATA / group).iterdir()) if p.is_dir()]
    found += [f"real/{p.name}" for p in sorted((DATA / "real").glob("*.json.gz"))]
    return found + ["real/ascend", *FRAMEWORK_OUTPUTS]

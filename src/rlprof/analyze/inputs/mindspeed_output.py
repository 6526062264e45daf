"""A MindSpeed-RL `profile_save_path`: which stage and rank each torch_npu collection holds.

MindSpeed-RL passes `profile_save_path/{role}` to torch_npu, where role is the stage name for a per-stage
collection (`stage: actor_update`) or the worker's role for `stage: all`; torch_npu writes one
`{host}_{pid}_{ts}_ascend_pt/` per process below it, parsed into ASCEND_PROFILER_OUTPUT/ unless
`profile_analysis: false` left only raw data.
"""

from __future__ import annotations

from pathlib import Path

from ...vocab import STAGE_ROLE
from ...frameworks import mindspeed
from .readers.ascend import is_unparsed


def dir_meta(path: Path) -> dict | None:
    """Stage metadata for a `*_ascend_pt` directory under a MindSpeed-RL stage directory, else None."""
    stage = mindspeed.STAGES.get(path.parent.name)
    if not path.name.endswith(mindspeed.ASCEND_DIR_SUFFIX) or stage is None:
        return None
    return {
        "framework": "MindSpeed-RL",
        "stage": stage,
        "role": STAGE_ROLE.get(stage, mindspeed.EXTRA_STAGE_ROLE.get(stage)),
        "mode": "discrete",
    }


def unparsed(collections: list[Path]) -> list[Path]:
    return [p for p in collections if is_unparsed(p)]


def unparsed_message(root: Path, raw: list[Path], total: int) -> str:
    return (
        f"{len(raw)} of {total} torch_npu collection(s) under {root} are not parsed yet "
        f"(profile_analysis: false); parse them with: {mindspeed.offline_parse_command(str(root))}"
    )

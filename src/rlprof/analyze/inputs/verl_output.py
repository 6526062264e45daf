"""A directory written by verl's own profiler: which step, role, stage and rank each file holds.

verl names its torch traces `{worker}_{scope}_step{N}_rank{R}-of-{W}_..._pid{P}_{ts}[_mbA-B].json.gz`, moves
rollout engine traces up as `rollout-replica{r}[-globalrank{g}]_{engine name}` (or leaves them in
`agent_loop_rollout_replica_{r}/`), and writes npu output as `{scope}/{host}_{pid}_{ts}_ascend_pt/`. Inside an
end-to-end trace the stages are verl's record_function ranges (`actor_compute_log_prob`, ..., `mini_batch{i}`);
breakdown.framework_ranges reads those.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from ...vocab import STAGE_ROLE
from ...frameworks import verl


def file_meta(path: Path, root: Path) -> dict | None:
    """Metadata for one file under a verl save_path, or None when verl did not name it."""
    name = path.name
    relocated = verl.RELOCATED_ROLLOUT.match(name)
    if relocated:
        meta = _engine_meta(int(relocated.group("replica")))
        if relocated.group("global_rank") is not None:
            meta["rank"] = int(relocated.group("global_rank"))
        return meta
    for parent in path.relative_to(root).parents:
        replica_dir = verl.ROLLOUT_REPLICA_DIR.match(parent.name)
        if replica_dir:
            return _engine_meta(int(replica_dir.group("replica")))
    if name.endswith(verl.ASCEND_DIR_SUFFIX):
        scope = path.parent.name
        stage = verl.stage_of_annotation(scope)
        if stage is None and scope not in verl.E2E_SCOPES:
            return None
        meta = {
            "framework": "verl",
            "stage": stage,
            "role": STAGE_ROLE.get(stage or ""),
            "mode": "discrete" if stage else "e2e",
        }
        info = sorted(path.glob("profiler_info_*.json"))
        rank = re.match(r"profiler_info_(\d+)\.json$", info[0].name) if info else None
        if rank:
            meta["rank"] = int(rank.group(1))
        return meta
    meta = verl.parse_trace_name(name)
    if meta is None:
        return None
    meta["ts"] = name  # verl's timestamp sorts within one (worker, step, rank)
    return meta


def _engine_meta(replica: int) -> dict:
    return {"framework": "verl", "role": "rollout", "stage": "rollout_generate", "mode": "discrete", "replica": replica}


def number_units(inputs: list[tuple[Path, dict]]) -> None:
    """Per-mini-batch files (a critic's discrete train_batch traces carry no index of their own): number them
    in time order within (worker, step, rank)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for _, meta in inputs:
        if meta.get("unit") == "mini_batch" and meta.get("index") is None:
            groups[(meta.get("worker"), meta.get("step"), meta.get("rank"))].append(meta)
    for metas in groups.values():
        for k, meta in enumerate(sorted(metas, key=lambda m: m["ts"])):
            meta["index"] = k
    for _, meta in inputs:
        meta.pop("ts", None)

"""A cause found in several stages, said once: the per-stage findings of one cause grouped into one finding (its
stages inside it, `evidence.stages`), their savings combined, and the per-stage findings read back out of a document's
finding (what `rlprof advise --fix` and a captured window's verdict take stage by stage). Symptoms of one root, said
once: a cause whose record names a root (causes.py, `root`) found beside that root is said inside the root's finding
(`evidence.symptoms`), whose levers act on both."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from .causes import CAUSES
from .finding import Finding
from .prediction import share_of


def one_per_cause(pairs: list[tuple[Finding, dict | None]], rank) -> list[tuple[Finding, dict | None]]:
    """A cause found in several stages is one finding, its stages inside it (`evidence.stages`, most saving first),
    as idle is: the same cause said once per stage only repeats itself, and its first lever differs by stage. The
    finding's own fields are its first stage's (its measure record as it was); its impact and saving are the
    stages' sums (each stage's first lever turned). A slow rank stays one finding per rank. `rank`: the findings'
    ranking key, (finding, saving) -> sortable, which orders the stages."""
    groups: dict[tuple, list[tuple[Finding, dict | None]]] = defaultdict(list)
    out = []
    for f, saving in pairs:
        if f.kind in CAUSES:
            groups[(f.kind, f.rank if f.kind == "slow_rank" else None)].append((f, saving))
        else:
            out.append((f, saving))
    for group in groups.values():
        if len(group) == 1:
            out.append(group[0])
            continue
        group.sort(key=lambda pair: rank(*pair))
        top, top_saving = group[0]
        stages = [
            {
                **f.evidence,
                "role": f.role,
                "stage": f.stage,
                "rank": f.rank,
                "impact_ms": f.impact_ms,
                "saving_ms": (saving or {}).get("saving_ms"),
            }
            for f, saving in group
        ]
        merged = replace(top, impact_ms=sum(f.impact_ms for f, _ in group), evidence={**top.evidence, "stages": stages})
        out.append((merged, summed_saving([saving for _, saving in group]) if top_saving is not None else None))
    return out


def one_per_root(pairs: list[tuple[Finding, dict | None]]) -> list[tuple[Finding, dict | None]]:
    """Each finding whose cause names a root (Cause.roots) that was found in its stage too goes inside the (first such)
    root's finding (`evidence.symptoms`: its kind, where, impact, saving and evidence): one root, one finding, with
    the root's levers and its saving (the root's lever removes the symptom with it)."""
    found = {(f.kind, stage) for f, _ in pairs for stage in _stages(f)}
    inside: dict[str, list[dict]] = defaultdict(list)
    out = []
    for f, saving in pairs:
        roots = CAUSES[f.kind].roots if f.kind in CAUSES else ()
        root = next((r for r in roots if (r, f.stage) in found), None)
        if root is not None:
            inside[root].append(
                {
                    "kind": f.kind,
                    "role": f.role,
                    "stage": f.stage,
                    "impact_ms": f.impact_ms,
                    "saving_ms": (saving or {}).get("saving_ms"),
                    "evidence": f.evidence,
                }
            )
        else:
            out.append((f, saving))
    return [
        (replace(f, evidence={**f.evidence, "symptoms": inside[f.kind]}), saving) if inside.get(f.kind) else (f, saving)
        for f, saving in out
    ]


def _stages(f: Finding) -> list:
    """The stages a finding is about: its own, and those of a cause found in several (one_per_cause)."""
    return [f.stage] + [s.get("stage") for s in f.evidence.get("stages", ())]


def summed_saving(savings: list[dict | None]) -> dict | None:
    """The saving of a cause found in several stages: each stage's first lever turned, what each stage saves the most
    any of them saves there (one lever can act on several stages: rlprof's kept gathers do on every forward stage,
    and the same saving is not counted once per stage it was found in), summed over the stages; the first stage's
    reason where none was predicted."""
    done = [s for s in savings if s and s.get("status") == "predicted"]
    if not done:
        return savings[0]
    out = {**done[0], "by_stage_ms": {}, "profiled_ms": {}, "setting": {}}
    for s in done:
        for key in ("by_stage_ms", "profiled_ms"):
            for stage, ms in (s.get(key) or {}).items():
                out[key][stage] = max(ms, out[key].get(stage, ms))
        for key, value in (s.get("setting") or {}).items():
            mine = out["setting"].get(key)
            merged = {**mine, **value} if isinstance(mine, dict) and isinstance(value, dict) else None
            out["setting"][key] = merged if merged is not None else (value if mine is None else mine)
    basis = {"basis": out.get("basis", "window"), "step_ms": out.get("step_ms") or 0.0}
    total = sum(out["by_stage_ms"].values())
    if basis["basis"] != "window" and 0 < basis["step_ms"] < total:  # the stages' parts at most the step together
        out["by_stage_ms"] = {k: v * basis["step_ms"] / total for k, v in out["by_stage_ms"].items()}
    out["saving_ms"] = sum(out["by_stage_ms"].values())
    out["saving_share"] = share_of(out["saving_ms"], basis)
    out["assumption"] = " / ".join(dict.fromkeys(s["assumption"] for s in done))
    left = [s for s in savings if not (s and s.get("status") == "predicted")]
    if left:
        out["assumption"] += f"; {len(left)} of its stages not predicted ({left[0]['why'] if left[0] else ''})"
    return out


def finding_parts(entry: dict) -> list[dict]:
    """The per-stage findings a document's finding holds (a cause found in several stages), else the finding
    itself: what `rlprof advise --fix` and a captured window's verdict take stage by stage."""
    stages = entry.get("evidence", {}).get("stages")
    if entry.get("kind") not in CAUSES or not stages:
        return [entry]
    return [
        {
            **entry,
            "evidence": {k: v for k, v in s.items() if k not in ("impact_ms", "saving_ms")},
            "role": s["role"],
            "stage": s["stage"],
            "rank": s["rank"],
            "impact_ms": s["impact_ms"],
        }
        for s in stages
    ]

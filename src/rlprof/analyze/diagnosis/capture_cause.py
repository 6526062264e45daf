"""Why a captured window was slow: the causes rlprof names (analyze/diagnosis/causes.py, judged by analyze/diagnosis/findings.py,
with their levers from frameworks/levers.py and predicted savings from their formulas in analyze/diagnosis/savings.py),
judged on the captured window and on the normal window beside it (analyze/over_time/beside.py builds both as small
documents of their own).

This module is the one place the capture analysis calls the cause machinery (`cause_findings`); the rest is the
contrast, documented in docs/analysis_schema.md ("timeline", `beside`):
- a cause found in the captured window and not in the normal one is why the step was slow (`new`);
- a cause found in both is why only where its time (`impact_ms`) grew by at least GREW_SHARE of what the
  captured stage's wall time grew (`grew`); else it is the run's own, there in a normal step too, and said so
  (`in_both`: not why this step was slow).
For a straggler, the slow rank's window is judged beside the healthy rank's at the same step, and the two together
for a slow rank: findings' own rule (excess compute, the others waiting in the same stage's collectives) where it
holds, else the straggler the timeline's rule saw (a stage slower on that rank, the others waiting for it at their
next collective, wherever that is), its excess and the others' extra wait measured on the two windows.
"""

from __future__ import annotations

from ...frameworks.levers import levers
from .causes import CAUSES, predict
from .finding import Finding
from .findings import findings_of, prediction_context
from .sentences import saving_text, timeline_slow_rank_sentence, verdict_sentence

GREW_SHARE = 0.5


def cause_findings(window_doc: dict) -> list[dict]:
    """The cause findings (each with `cause`, `levers` per dialect and `saving` in the run's dialect) of one small
    document holding a window's rows, operators and the run's config."""
    return [f for f in findings_of(window_doc) if f.get("actionable")]


def _key(f: dict) -> tuple:
    """A cause is said once per window (findings.one_per_cause: its stages inside it); a slow rank once per rank."""
    return f["kind"], f.get("rank") if f["kind"] == "slow_rank" else None


def _entry(f: dict, normal: dict | None, how: str) -> dict:
    saving = f.get("saving") or {}
    return {
        "cause": f["kind"],
        "title": f.get("cause"),
        "how": how,
        "role": f.get("role"),
        "stage": f.get("stage"),
        "rank": f.get("rank"),
        "text": f["text"],
        "impact_ms": f["impact_ms"],
        "normal_impact_ms": normal["impact_ms"] if normal else None,
        "levers": f.get("levers") or {},
        "saving": saving or None,
        "saving_ms": saving.get("saving_ms"),
        "saving_text": f.get("saving_text"),
    }


def slow_rank_cause(pair_doc: dict, slow: int, healthy: int, stage: str) -> dict | None:
    """The slow rank of a straggler capture as a cause finding (with its levers and saving): findings' own where its
    rule holds on the two windows, else from the straggler the timeline saw: its excess wall time in `stage` over
    the healthy rank's, and the healthy rank's extra wait in collectives over the whole window."""
    own = [f for f in cause_findings(pair_doc) if f["kind"] == "slow_rank" and f.get("rank") == slow]
    if own:
        return own[0]

    def total(rank, bucket, only=None):
        return sum(
            r[bucket]
            for r in pair_doc["rows"]
            if r.get("unit") is None
            and r.get("rank") == rank
            and r.get("file") is not None
            and (only is None or r.get("stage") == only)
        )

    excess = total(slow, "wall_ms", stage) - total(healthy, "wall_ms", stage)
    wait, others_wait = total(slow, "comm_ms"), total(healthy, "comm_ms")
    if excess <= 0:
        return None
    f = {
        "kind": "slow_rank",
        "role": next((r.get("role") for r in pair_doc["rows"] if r.get("stage") == stage), None),
        "stage": stage,
        "rank": slow,
        "impact_ms": excess,
        "cause": CAUSES["slow_rank"].title,
        "levers": levers("slow_rank", stage),
        "actionable": True,
        "evidence": {"excess_ms": excess, "wait_ms": wait, "others_wait_ms": others_wait, "rule": "timeline"},
        "text": timeline_slow_rank_sentence(slow, healthy, stage, excess, others_wait - wait),
    }
    if others_wait - wait <= 0:
        f["saving"] = {
            "status": "not predictable",
            "saving_ms": None,
            "saving_share": None,
            "setting": {},
            "why": f"rank {healthy} waits no longer than rank {slow} in the collectives the trace shows",
        }
    else:
        f["saving"] = predict(prediction_context(pair_doc), Finding.of(f))
    f["saving_text"] = saving_text(f["saving"])
    return f


def judge(captured_doc: dict, normal_doc: dict | None, wall_growth_ms: float, slow_rank: dict | None = None) -> dict:
    """{verdict, causes, in_both, text}: the causes that explain the captured window against its normal window.
    verdict: `cause` (at least one new or grown cause), `in_both` (causes only a normal step has too), `none` (no
    cause rlprof names in the captured window); `uncontrasted` where no normal window was there to judge against
    (the causes are the captured window's, not told from the run's own). `slow_rank`: a straggler's slow rank
    (slow_rank_cause), which its healthy rank's window cannot have. The sentence is analyze/diagnosis/sentences.py's."""
    found = cause_findings(captured_doc) + ([slow_rank] if slow_rank else [])
    if normal_doc is None:
        causes = [_entry(f, None, "uncontrasted") for f in found]
        verdict = {"verdict": "uncontrasted" if causes else "none", "causes": causes, "in_both": []}
        return {**verdict, "text": verdict_sentence(verdict, contrasted=False)}
    normal = {_key(f): f for f in cause_findings(normal_doc)}
    causes, in_both = [], []
    for f in found:
        base = normal.get(_key(f))
        if base is None:
            causes.append(_entry(f, None, "new"))
        elif wall_growth_ms > 0 and f["impact_ms"] - base["impact_ms"] >= GREW_SHARE * wall_growth_ms:
            causes.append(_entry(f, base, "grew"))
        else:
            in_both.append(_entry(f, base, "in_both"))
    # as findings rank them: a slow rank first (the others' times hold their wait for it), then by predicted saving
    causes.sort(key=lambda c: (c["cause"] != "slow_rank", c["saving_ms"] is None, -(c["saving_ms"] or 0.0)))
    verdict = {"verdict": "cause" if causes else "in_both" if in_both else "none", "causes": causes, "in_both": in_both}
    return {**verdict, "text": verdict_sentence(verdict, contrasted=True)}

"""The plan: one run's cause findings read as one set of levers applied together, as a senior engineer would apply
them. Each finding's saving is already bounded by the stages it acts on and by the step (prediction.py, `bounded`);
here the savings of several levers are counted once where they act on the same stage: each takes its share of what
the levers before it left of that stage's time,

    stage's saving = T x (1 - prod_i (1 - s_i / T)),   T: the stage's time per step (its bound),

so that two levers that each remove half of the rollout remove three quarters together, not all of it; the plan's
total is the stages' sum, at most the step. The findings' levers pull no key two ways (frameworks/levers.py,
`pulled_both_ways`: checked here for the document, and for every pair of causes by tests/test_plan.py).
"""

from __future__ import annotations

from collections import defaultdict

from ...frameworks.levers import DIALECTS, pulled_both_ways
from .findings import prediction_context
from .prediction import BASES, PredictionContext, share_of


def plan_of(ctx: PredictionContext, entries: list[dict]) -> dict:
    """The plan of `entries` ({kind, stage, saving, levers?}: cause findings in their rank order): the savings
    predicted counted once per stage, their total and its share of the step (its basis named), the causes whose
    saving the data cannot predict, and the keys the levers pull two ways (none)."""
    basis = ctx.basis()
    parts: dict = defaultdict(list)
    counted, left = [], []
    for e in entries:
        s = e.get("saving") or {}
        if s.get("status") != "predicted":
            left.append({"kind": e["kind"], "stage": e.get("stage"), "why": s.get("why", "no saving predicted")})
            continue
        counted.append({"kind": e["kind"], "stage": e.get("stage"), "saving_ms": s["saving_ms"]})
        for stage, ms in (s.get("by_stage_ms") or {}).items():
            parts[stage].append(ms)
    by_stage = {}
    for stage, savings in parts.items():
        top = ctx.stage_bound(stage) or sum(savings)
        kept = 1.0
        for ms in savings:
            kept *= max(0.0, 1.0 - ms / top) if top > 0 else 0.0
        by_stage[stage] = top * (1.0 - kept)
    total = sum(by_stage.values())
    if basis["basis"] != "window" and 0 < basis["step_ms"] < total:
        by_stage = {k: v * basis["step_ms"] / total for k, v in by_stage.items()}
        total = basis["step_ms"]
    return {
        "basis": basis["basis"],
        "basis_words": BASES[basis["basis"]],
        "step_ms": basis["step_ms"],
        "total_ms": total,
        "total_share": share_of(total, basis),
        "by_stage_ms": by_stage,
        "causes": counted,
        "not_predicted": left,
        "conflicts": conflicts(entries),
    }


def conflicts(entries: list[dict]) -> dict[str, dict[str, list[str]]]:
    """{dialect: {key: the ways its findings turn it}} where a key is turned two ways ({}: one consistent config)."""
    out = {}
    for dialect in DIALECTS:
        turned = [(lv["key"], lv["set"]) for e in entries for lv in (e.get("levers") or {}).get(dialect, [])]
        both = pulled_both_ways(turned)
        if both:
            out[dialect] = {k: sorted(v) for k, v in both.items()}
    return out


def document_plan(doc: dict) -> dict:
    """The plan of a document's cause findings (their savings in the run's own dialect)."""

    entries = [f for f in doc.get("findings", []) if f.get("actionable")]
    return plan_of(prediction_context(doc), entries)


def plan_text(plan: dict) -> str:
    """The plan in one sentence."""
    n = len(plan["causes"])
    if not n:
        return "the plan: no cause's saving could be predicted"
    share = (
        f" ({plan['total_share']:.0%} of the step: {plan['basis_words']})" if plan["total_share"] is not None else ""
    )
    text = (
        f"the plan: the first lever of {n} cause(s) ({', '.join(c['kind'] for c in plan['causes'])}) applied together "
        f"save {plan['total_ms']:.1f} ms per step{share}, savings on the same stage counted once"
    )
    if plan["not_predicted"]:
        text += "; not counted (saving not predictable): " + ", ".join(c["kind"] for c in plan["not_predicted"])
    return text

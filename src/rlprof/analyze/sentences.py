"""The rendering step of the analysis: a computed finding (analyze/finding.py: numbers and evidence) and its
predicted saving become the document's finding, with its sentence made from its kind's template in the registry
(analyze/causes.py), the cause's title, its levers and the saving said in words. Nothing here computes a number
the findings rank by; the calculations make no text."""

from __future__ import annotations

from ..frameworks.levers import levers
from .causes import CAUSES, template, where
from .finding import Finding


def sentence(f: Finding) -> str:
    """The finding's sentence, from its template and fields (its evidence, what only the sentence uses, where)."""
    fields = {**f.evidence, **f.said, "role": f.role, "stage": f.stage, "rank": f.rank, "impact_ms": f.impact_ms,
              "where": where(f.role, f.stage)}
    form = template(f.kind)
    return form(fields) if callable(form) else form.format(**fields)


def render(f: Finding, saving: dict | None = None) -> dict:
    """The document's finding: kind, impact, text, evidence, where; the cause's title and levers (none for a
    descriptive finding); and, for a cause whose saving was predicted or said unpredictable, the saving."""
    out = {"kind": f.kind, "impact_ms": float(f.impact_ms), "text": sentence(f), "evidence": f.evidence,
           "role": f.role, "stage": f.stage, "rank": f.rank}
    cause = CAUSES.get(f.kind)
    found = levers(cause.name, f.stage) if cause else {}
    out.update(cause=cause.title if cause else None, levers=found, actionable=bool(found),
               levers_text="; ".join(f"{d}: " + ", ".join(lv["text"] for lv in lvs) for d, lvs in found.items()))
    if saving is not None:
        out.update(saving=saving, saving_ms=saving["saving_ms"], saving_share=saving["saving_share"],
                   saving_text=saving_text(saving))
    return out


def saving_text(s: dict) -> str:
    """A predicted saving in one sentence (or why it is not predictable)."""
    if s["status"] != "predicted":
        return f"saving not predictable from this data: {s['why']}"
    share = f" ({s['saving_share']:.0%} of the step)" if s.get("saving_share") is not None else ""
    return f"predicted saving {s['saving_ms']:.1f} ms per step{share}: {s['assumption']}"

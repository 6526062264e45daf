"""`rlprof advise --check NEW_RUN --advice NEXT.advice.json`: the size the advice predicted against what the run
made with it wrote."""

from __future__ import annotations

from pathlib import Path

from .shared import AdviseError, run_windows


def check(new_run: str | Path, advice: dict) -> dict:
    """Predicted vs what NEW_RUN wrote, per window and in total, with what to change when they part."""
    rows = [w for w in run_windows(Path(new_run)) if w.get("status") in ("complete", "truncated")]
    if not rows:
        raise AdviseError(
            f"{new_run} holds no rlprof manifest with collected windows; allowed: the run directory "
            "that `rlprof train NEXT.yaml` wrote"
        )
    actual = sum(w["bytes"] for w in rows)
    predicted = advice["predicted_bytes"]
    ratio = actual / predicted if predicted else None
    notes = []
    if actual > advice["budget_bytes"] * max(1, len(advice["target"]["ranks"])):
        notes.append(
            f"over the budget: lower {advice['unit'] or 'the steps or ranks'} ({advice['active'] or 'whole'} now)"
        )
    if ratio is not None and not 0.7 <= ratio <= 1.3:
        notes.append(
            "the size model is off by more than 30% for this run: re-run `rlprof advise` on this run "
            "(its own traces now calibrate the stage)"
        )
    return {
        "predicted_bytes": predicted,
        "actual_bytes": actual,
        "ratio": ratio,
        "windows": [{k: w.get(k) for k in ("step", "role", "stage", "rank", "bytes", "status")} for w in rows],
        "notes": notes or ["within 30% of the prediction and inside the budget"],
    }

"""One finding as the analysis computes it: numbers and evidence, no sentence yet (analyze/diagnosis/sentences.py renders
it into the document's finding, from the template its kind has in analyze/diagnosis/causes.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Finding:
    kind: str
    impact_ms: float  # the time it costs per step (what ranks the findings whose saving is unknown)
    evidence: dict  # kept in the document as it is
    role: str | None = None
    stage: str | None = None
    rank: object = None
    said: dict = field(default_factory=dict)  # numbers only its sentence uses (not kept in the document)

    @classmethod
    def of(cls, entry: Mapping) -> "Finding":
        """The finding behind a document's entry (what `rlprof advise --fix` reads from analysis.json)."""
        return cls(
            entry["kind"],
            entry["impact_ms"],
            entry["evidence"],
            entry.get("role"),
            entry.get("stage"),
            entry.get("rank"),
        )

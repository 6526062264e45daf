"""`rlprof cluster`: the same buckets per rank and stage, their spread, and who holds the others up
(the analyses themselves are analyze/diagnosis/ranks.py; findings use them too)."""

from __future__ import annotations

from .analyze.diagnosis.ranks import THRESHOLD, per_rank, slow_ranks, spread


def cluster(doc: dict, threshold: float = THRESHOLD) -> dict:
    ranks = per_rank(doc)
    return {
        "ranks": ranks,
        "stages": spread(ranks),
        "slow_ranks": slow_ranks(ranks, doc, threshold),
        "threshold": threshold,
        "warnings": doc.get("warnings", []),
        "partial": doc.get("partial", False),
    }

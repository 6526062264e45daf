"""Contention in the run over time: where the busy ranks' waits for a core explain a spike or a straggler
(analyze/inputs/busy_machine.py's rule, the live trigger's too), the evidence on that step and rank, and the spikes it
explains said once (for the whole machine, or per rank)."""

from __future__ import annotations

import warnings

import numpy as np

from ..inputs.busy_machine import expected_wait_ms, explains
from ..inputs.timeline_file import BUSY
from .watched import Loaded


def _at(t: Loaded, name: str, ranks, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The `ranks`' (time on a core, wait for one, others' share) in `name` at step index i."""
    got = [t.sched(name, k, [i]) for k in ranks]
    return tuple(np.asarray([g[j][0] for g in got], float) for j in range(3))


def rank_evidence(t: Loaded, name: str, i: int, usual: np.ndarray) -> dict:
    """Step i's contention evidence in `name` (a stage or the step): the busy ranks' wait there and the wait expected
    at their usual share, summed; others' share of the host (median over them); how many ranks were busy."""
    busy = np.flatnonzero((t.rank_flags[:, i] & BUSY) != 0)
    cpu, waits, others = _at(t, name, busy, i)
    known = np.isfinite(waits) & np.isfinite(cpu)
    expected = [expected_wait_ms(c, u) for c, u in zip(cpu[known], usual[busy][known])]
    return {
        "cause": "contention",
        "run_wait_ms": float(waits[known].sum()) if known.any() else None,
        "expected_wait_ms": float(sum(expected)) if known.any() else None,
        "others_share": float(np.median(others[np.isfinite(others)])) if np.isfinite(others).any() else None,
        "ranks_busy": len(busy),
    }


def contention_evidence(t: Loaded, name: str, i: int, usual: np.ndarray, excess_s: float) -> dict | None:
    """Step i's contention evidence in `name` where it explains `excess_s` (busy_machine.py's rule: the busy ranks'
    wait there beyond the wait expected at their usual share, summed), else None."""
    busy = np.flatnonzero((t.rank_flags[:, i] & BUSY) != 0)
    if not len(busy):
        return None
    cpu, waits, _ = _at(t, name, busy, i)
    known = np.isfinite(waits) & np.isfinite(cpu)
    if not known.any():
        return None
    extra = sum(max(0.0, w - expected_wait_ms(c, u)) for c, w, u in zip(cpu[known], waits[known], usual[busy][known]))
    return rank_evidence(t, name, i, usual) if explains(extra, excess_s) else None


def straggler_contention(t: Loaded, name: str, k: int, at: np.ndarray, excess_s: np.ndarray) -> dict:
    """A straggler's cause where its wait for a core in the stage beyond the wait expected at the other ranks' share
    explains its excess at half of its steps or more: `cause: contention` with its median wait there and the median
    expected ({} otherwise)."""
    shares = []
    for other in range(len(t.ranks)):
        if other != k:
            cpu, wait, _ = t.sched(name, other, at)
            with np.errstate(invalid="ignore", divide="ignore"):
                shares.append(np.where(cpu + wait > 0, wait / (cpu + wait), np.nan))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        theirs = np.nanmedian(np.asarray(shares), axis=0) if shares else np.full(len(at), np.nan)
    cpu, mine, others = t.sched(name, k, at)
    expected = np.asarray([expected_wait_ms(c, s) for c, s in zip(cpu, theirs)])
    busy = (t.rank_flags[k, at] & BUSY) != 0
    explained = [j for j in range(len(at)) if busy[j] and explains(mine[j] - expected[j], float(excess_s[j]))]
    if not len(at) or len(explained) * 2 < len(at):
        return {}
    share = others[explained]
    return {
        "cause": "contention",
        "run_wait_ms": float(np.median(mine[explained])),
        "expected_wait_ms": float(np.nanmedian(expected[explained])),
        "others_share": float(np.nanmedian(share)) if np.isfinite(share).any() else None,
    }


def contention_records(contended: list[dict], ranks: list) -> list[dict]:
    """The spikes contention explained, said once: one record where every rank was busy at each of them (the whole
    machine), else one per rank; each with its steps, stages and the median of its evidence."""
    groups: dict = {}
    for c in contended:
        whole = c["ranks_busy"] >= len(ranks) > 0
        groups.setdefault(None if whole else c["rank"], []).append(c)
    out = []
    for rank, items in groups.items():
        out.append(
            {
                "every_rank": rank is None,
                "ranks": list(ranks) if rank is None else [rank],
                "steps": sorted({c["step"] for c in items}),
                "stages": sorted({c["stage"] for c in items}),
                "excess_seconds": float(np.median([c["seconds"] - c["baseline_seconds"] for c in items])),
                "run_wait_ms": median_of(items, "run_wait_ms"),
                "expected_wait_ms": median_of(items, "expected_wait_ms"),
                "others_share": median_of(items, "others_share"),
            }
        )
    return out


def median_of(items: list[dict], key: str) -> float | None:
    known = [c[key] for c in items if c[key] is not None]
    return float(np.median(known)) if known else None

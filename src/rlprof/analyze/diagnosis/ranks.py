"""Ranks against each other: per-rank means of each bucket, their spread, and the ranks that hold the others up.

A rank that is slow in compute reaches each collective late: it waits little there while every other
rank waits for it. So a suspect is a rank whose compute in a stage exceeds the other ranks' median
by a clear margin (15% of their compute and a tenth of the stage's wall time), *and* whose collective
wait is shorter than theirs by at least half that excess, *and* who is that far behind in most of the
profiled steps, not in one: a single hiccup (a page fault, a busy core) is not a straggler.
Async rollout replicas count as the ranks of the rollout role.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from ..window.breakdown import BUCKETS, order_key

THRESHOLD = 0.15  # excess compute, as a fraction of the other ranks' median, before a rank is suspected
MIN_EXCESS_MS = 1.0  # below this, differences are timer noise
MIN_SHARE_OF_WALL = 0.1  # and it must hold the stage up by a tenth of its length: small stages are noisy
WAIT_SHARE = 0.5  # the others must wait at least this share of the excess longer than the suspect


def _rank(r: dict):
    return r["replica"] if r.get("role") == "rollout" and r.get("replica") is not None else r.get("rank")


def per_rank(doc: dict) -> list[dict]:
    """Per (role, stage, rank): the mean per step of each bucket."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in doc["rows"]:
        if r.get("unit") is None:
            groups[(r.get("role"), r.get("stage"), _rank(r))].append(r)
    out = []
    for (role, stage, rank), rows in groups.items():
        out.append(
            {
                "role": role,
                "stage": stage,
                "rank": rank,
                "steps": len(rows),
                **{b: statistics.fmean(r[b] for r in rows) for b in BUCKETS},
            }
        )
    out.sort(key=lambda r: (str(r["role"]), str(r["stage"]), order_key(r["rank"])))
    return out


def spread(ranks: list[dict]) -> list[dict]:
    """Per (role, stage) and bucket: min, max, max-min and the coefficient of variation across ranks."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in ranks:
        groups[(r["role"], r["stage"])].append(r)
    out = []
    for (role, stage), rows in groups.items():
        for b in BUCKETS:
            values = [r[b] for r in rows]
            mean = statistics.fmean(values)
            cv = statistics.pstdev(values) / mean if mean else 0.0
            lo, hi = min(values), max(values)
            out.append(
                {
                    "role": role,
                    "stage": stage,
                    "bucket": b.removesuffix("_ms"),
                    "ranks": len(values),
                    "mean_ms": mean,
                    "min_ms": lo,
                    "max_ms": hi,
                    "spread_ms": hi - lo,
                    "cv": cv,
                    "min_rank": rows[values.index(lo)]["rank"],
                    "max_rank": rows[values.index(hi)]["rank"],
                }
            )
    return out


def _collective_waits(doc: dict) -> dict[tuple, dict[str, float]]:
    """(role, stage, rank) -> collective name -> mean ms per step."""
    steps: dict[tuple, set] = defaultdict(set)
    total: dict[tuple, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for c in doc.get("collectives", []):
        key = (c.get("role"), c.get("stage"), c.get("rank"))
        steps[key].add(c.get("step"))
        total[key][c["name"]] += c["total_ms"]
    return {k: {name: ms / max(1, len(steps[k])) for name, ms in v.items()} for k, v in total.items()}


def _compute_per_step(doc: dict) -> dict[tuple, dict]:
    """(role, stage, rank) -> step -> compute ms in that step."""
    out: dict[tuple, dict] = defaultdict(lambda: defaultdict(float))
    for r in doc["rows"]:
        if r.get("unit") is None:
            out[(r.get("role"), r.get("stage"), _rank(r))][r.get("step")] += r["compute_ms"]
    return out


def _steps_behind(rank: dict, others: list[dict], per_step: dict, floor: float) -> tuple[int, int]:
    """In how many of the steps that every one of these ranks profiled is `rank` `floor` ms behind the others."""
    key = (rank["role"], rank["stage"])
    mine = per_step.get((*key, rank["rank"]), {})
    theirs = [per_step.get((*key, o["rank"]), {}) for o in others]
    common = [s for s in mine if all(s in t for t in theirs)]
    behind = sum(mine[s] - statistics.median(t[s] for t in theirs) >= floor for s in common)
    return behind, len(common)


def slow_ranks(ranks: list[dict], doc: dict, threshold: float = THRESHOLD) -> list[dict]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in ranks:
        groups[(r["role"], r["stage"])].append(r)
    waits = _collective_waits(doc)
    per_step = _compute_per_step(doc)
    found = []
    for (role, stage), rows in groups.items():
        if len(rows) < 2:
            continue
        for r in rows:
            others = [o for o in rows if o is not r]
            others_compute = statistics.median(o["compute_ms"] for o in others)
            others_wait = statistics.median(o["comm_ms"] for o in others)
            excess = r["compute_ms"] - others_compute
            waited = others_wait - r["comm_ms"]
            wall = statistics.median(o["wall_ms"] for o in rows)
            floor = max(threshold * others_compute, MIN_SHARE_OF_WALL * wall, MIN_EXCESS_MS)
            if excess < floor or waited < WAIT_SHARE * excess:
                continue
            behind, common = _steps_behind(r, others, per_step, floor)
            if common and 2 * behind <= common:
                continue
            mine = waits.get((role, stage, r["rank"]), {})
            theirs: dict[str, float] = defaultdict(float)
            for o in others:
                for name, ms in waits.get((role, stage, o["rank"]), {}).items():
                    theirs[name] += ms / len(others)
            colls = sorted(
                (
                    {"name": name, "rank_ms": mine.get(name, 0.0), "others_ms": ms}
                    for name, ms in theirs.items()
                    if ms > mine.get(name, 0.0)
                ),
                key=lambda c: c["rank_ms"] - c["others_ms"],
            )[:5]
            names = ", ".join(c["name"] for c in colls[:3]) or "collectives"
            found.append(
                {
                    "rank": r["rank"],
                    "role": role,
                    "stage": stage,
                    "evidence": {
                        "compute_ms": r["compute_ms"],
                        "others_compute_ms": others_compute,
                        "excess_ms": excess,
                        "wait_ms": r["comm_ms"],
                        "others_wait_ms": others_wait,
                        "steps": r["steps"],
                        "steps_behind": behind,
                        "collectives": colls,
                        "summary": (
                            f"rank {r['rank']} computes {excess:.1f} ms more per step in {role}/{stage} "
                            f"({r['compute_ms']:.1f} vs {others_compute:.1f} ms on the others) and waits "
                            f"{r['comm_ms']:.1f} ms in collectives while the others wait {others_wait:.1f} ms "
                            f"(in {names})" + (f"; behind in {behind} of {common} steps" if common else "")
                        ),
                    },
                }
            )
    found.sort(key=lambda f: -f["evidence"]["excess_ms"])
    return found

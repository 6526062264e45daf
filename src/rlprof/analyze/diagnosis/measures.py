"""RL measures: numbers about an RL step that say why it is slow, computed from the analysis rows.

Each measure is one function over the document, returning records {measure, role, stage, value, status, ...}
with the inputs of its formula (docs/analysis_schema.md gives each formula). Where the data cannot give the
number (no unit ranges with what they hold, a CPU-only trace for a device measure) the record says
`status: "not measurable"` and why, instead of a number.

Units carry what they hold in their range names (rlprof's trainer, TRL integration, engine adapter):
`seqs` rows, `tokens` computed (rows x width), `real_tokens` (not padding), `active` rows still decoding.
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

import numpy as np

from ..inputs.busy_machine import machine_load

from .samples import sample_measures

TAIL_ACTIVE = 0.5  # a decode step with fewer than this share of its rows still generating is in the tail
MIN_FIT_UNITS = 6  # units needed to fit wall = fixed + per_token x tokens
MIN_TOKEN_SPREAD = 1.2  # and their token counts must differ at least this much (max / min)
MIN_TOKEN_COUNTS = 3  # and take at least this many distinct values (two points make any line)
SLOWED = 3.0  # a unit this many robust deviations (1.4826 x MAD) above the first fit was slowed by something else
MAX_FIT_SCATTER = 0.25  # the units left scatter about the fit by at most this share of their mean time (RMS)


def _record(measure: str, role, stage, value, status: str = "measured", **inputs) -> dict:
    return {"measure": measure, "role": role, "stage": stage, "value": value, "status": status, **inputs}


def _units_by_stage(doc: dict, unit: str) -> dict[tuple, list[dict]]:
    out = defaultdict(list)
    for r in doc["rows"]:
        if r.get("unit") == unit and r.get("stage"):
            out[(r.get("role"), r["stage"])].append(r)
    return out


def _passes(units: list[dict]) -> int:
    """How many separate passes (stage windows: step x rank x repeat) the units come from."""
    return len({(u.get("step"), u.get("rank"), u.get("replica"), u.get("file")) for u in units}) or 1


def rollout_tail(doc: dict) -> list[dict]:
    """Share of decode-step time spent in steps where fewer than TAIL_ACTIVE of the rows still generate:
    sum(wall of tail steps) / sum(wall of all decode steps)."""
    out = []
    for (role, stage), units in _units_by_stage(doc, "decode_step").items():
        held = [u for u in units if u.get("active") is not None and u.get("seqs")]
        if not held:
            out.append(
                _record(
                    "rollout_tail",
                    role,
                    stage,
                    None,
                    "not measurable",
                    why="the decode steps do not say how many rows were active (rlprof's trainer and "
                    "engine adapter record it; other traces do not)",
                )
            )
            continue
        total = sum(u["wall_ms"] for u in held)
        tail = [u for u in held if u["active"] < TAIL_ACTIVE * u["seqs"]]
        tail_ms = sum(u["wall_ms"] for u in tail)
        out.append(
            _record(
                "rollout_tail",
                role,
                stage,
                tail_ms / total if total else 0.0,
                tail_ms=tail_ms / _passes(held),
                decode_ms=total / _passes(held),
                tail_steps=len(tail),
                decode_steps=len(held),
                mean_active_share=float(np.mean([u["active"] / u["seqs"] for u in held])),
            )
        )
    return out


def padding(doc: dict) -> list[dict]:
    """Share of the tokens computed in micro-batches that are padding: 1 - sum(real_tokens) / sum(tokens)."""
    out = []
    for (role, stage), units in _units_by_stage(doc, "micro_batch").items():
        held = [u for u in units if u.get("tokens") and u.get("real_tokens") is not None]
        if not held:
            out.append(
                _record(
                    "padding",
                    role,
                    stage,
                    None,
                    "not measurable",
                    why="the micro-batches do not say how many tokens they hold",
                )
            )
            continue
        tokens = sum(u["tokens"] for u in held)
        real = sum(u["real_tokens"] for u in held)
        out.append(
            _record("padding", role, stage, 1 - real / tokens, tokens=tokens, real_tokens=real, micro_batches=len(held))
        )
    return out


def fixed_cost(doc: dict) -> list[dict]:
    """The part of micro-batch time that does not grow with tokens: fit wall_ms = fixed + per_token x tokens
    over the stage's micro-batches (least squares over the units the load did not move: fit_fixed_cost); value =
    fixed / the mean wall of the units fitted. A fit with a negative part beyond its noise, too few different token
    counts or too scattered is not measurable, with its numbers, and nothing uses it. A large value with many
    units per pass: micro-batches too small to amortise their launches and Python. `units_per_pass` counts the
    micro-batches that could merge: those of one pass, or of one mini-batch where the stage has mini-batches
    (an optimizer step bounds how far micro-batches can grow)."""
    out = []
    minis = _units_by_stage(doc, "mini_batch")
    for (role, stage), units in _units_by_stage(doc, "micro_batch").items():
        held = [u for u in units if u.get("tokens")]
        mini = minis.get((role, stage), [])
        per_pass = len(held) / _passes(held) if held else 0
        if mini:
            per_pass /= max(1.0, len(mini) / _passes(mini))
        if len(held) < MIN_FIT_UNITS:
            out.append(
                _record(
                    "fixed_cost",
                    role,
                    stage,
                    None,
                    "not measurable",
                    units_per_pass=per_pass,
                    why=f"fewer than {MIN_FIT_UNITS} micro-batches with their token counts",
                )
            )
            continue
        x = np.array([u["tokens"] for u in held], float)
        y = np.array([u["wall_ms"] for u in held], float)
        if x.max() < MIN_TOKEN_SPREAD * x.min() or len(np.unique(x)) < MIN_TOKEN_COUNTS:
            out.append(
                _record(
                    "fixed_cost",
                    role,
                    stage,
                    None,
                    "not measurable",
                    units_per_pass=per_pass,
                    token_counts=int(len(np.unique(x))),
                    why=f"the micro-batches hold too few different token counts (fewer than {MIN_TOKEN_COUNTS}, or "
                    f"within {MIN_TOKEN_SPREAD:g}x of each other): the fixed part cannot be told from the per-token part",
                )
            )
            continue
        fit = fit_fixed_cost(x, y, busy=_mostly_busy(doc, held))
        numbers = dict(
            units_per_pass=per_pass,
            token_counts=int(len(np.unique(x))),
            fixed_ms=fit.fixed,
            per_token_us=fit.per_token * 1e3,
            fit_scatter=fit.scatter,
            micro_batches=int(fit.kept.sum()),
            fit=fit.how,
        )
        if fit.broken:
            out.append(_record("fixed_cost", role, stage, None, "not measurable", why=fit.broken, **numbers))
            continue
        share = fit.fixed / float(y[fit.kept].mean())  # of the units fitted
        out.append(
            _record(
                "fixed_cost",
                role,
                stage,
                share,
                mean_seqs=float(np.mean([u.get("seqs") or 0 for u in held])),
                fixed_ms_per_pass=fit.fixed * per_pass,
                **numbers,
            )
        )
    return out


class Fit(NamedTuple):
    per_token: float  # ms a token
    fixed: float  # ms a micro-batch
    kept: np.ndarray  # the units fitted
    scatter: float  # their RMS distance from the line over their mean time
    how: str  # `least_squares`, or `quickest` (a busy machine's window: the units the load moved least)
    broken: str  # why it is not a cost ('' where it is)


def fit_fixed_cost(x: np.ndarray, y: np.ndarray, busy: bool = False) -> Fit:
    """wall = fixed + per_token x tokens by least squares over the units the load did not move (load adds time and
    never takes it away): on a quiet machine every unit but those SLOWED robust deviations above a first fit (a
    neighbour's burst, a collective's wait); on a busy machine's window the quickest ones, the fit taken again over
    the units on or below it while MIN_FIT_UNITS with MIN_TOKEN_COUNTS token counts remain (up to 3 times). A part
    below 0 within twice its standard error is 0 (the line fitted again without it); beyond, the fit is no cost
    (`broken`), as is one whose units scatter more than MAX_FIT_SCATTER about it."""
    kept = np.ones(len(x), bool)
    per_token, fixed = np.polyfit(x, y, 1)
    if busy:
        for _ in range(3):
            lower = kept & (y <= fixed + per_token * x)
            if lower.sum() < MIN_FIT_UNITS or len(np.unique(x[lower])) < MIN_TOKEN_COUNTS:
                break
            kept = lower
            per_token, fixed = np.polyfit(x[kept], y[kept], 1)
    else:
        residual = y - (fixed + per_token * x)
        spread = 1.4826 * float(np.median(np.abs(residual - np.median(residual))))
        slowed = residual > np.median(residual) + SLOWED * spread if spread > 0 else ~kept
        if (~slowed).sum() >= MIN_FIT_UNITS and len(np.unique(x[~slowed])) >= MIN_TOKEN_COUNTS and slowed.any():
            kept = ~slowed
            per_token, fixed = np.polyfit(x[kept], y[kept], 1)
    per_token, fixed, broken = _physical(x[kept], y[kept], float(per_token), float(fixed))
    line = fixed + per_token * x[kept]
    scatter = float(np.sqrt(np.mean((y[kept] - line) ** 2)) / np.mean(y[kept]))
    if not broken and scatter > MAX_FIT_SCATTER:
        broken = (
            f"the micro-batches scatter {scatter:.0%} of their mean time about the fit (more than "
            f"{MAX_FIT_SCATTER:.0%}): too noisy to split into a fixed and a per-token part"
        )
    return Fit(per_token, fixed, kept, scatter, "quickest" if busy else "least_squares", broken)


def _physical(x: np.ndarray, y: np.ndarray, per_token: float, fixed: float) -> tuple[float, float, str]:
    """The fit with no negative part: a part below 0 within twice its standard error (noise about a cost of 0) is 0,
    the other fitted again alone; one beyond it breaks physics, said with the fit's numbers."""
    n = len(x)
    residual = y - (fixed + per_token * x)
    sigma = float(np.sqrt(np.sum(residual**2) / max(1, n - 2)))
    sxx = float(np.sum((x - x.mean()) ** 2))
    se_slope = sigma / np.sqrt(sxx) if sxx > 0 else float("inf")
    se_fixed = sigma * float(np.sqrt(1 / n + x.mean() ** 2 / sxx)) if sxx > 0 else float("inf")
    if (per_token < -2 * se_slope) or (fixed < -2 * se_fixed):
        return (
            per_token,
            fixed,
            (
                f"the fit gives {fixed:.2f} ms fixed + {per_token * 1e3:.1f} us per token: a negative cost beyond its "
                "noise, so the micro-batches' times do not split into a fixed and a per-token part"
            ),
        )
    if per_token < 0:
        return 0.0, float(y.mean()), ""
    if fixed < 0:
        return float(np.sum(x * y) / np.sum(x * x)), 0.0, ""
    return per_token, fixed, ""


def _mostly_busy(doc: dict, units: list[dict]) -> bool:
    """Whether most of these units were recorded in a window on a busy machine (inputs/busy_machine.py's rule)."""
    busy = {str(i["path"]).rsplit("/", 1)[-1] for i in doc.get("inputs", []) if (machine_load(i) or {}).get("busy")}
    return 2 * sum(u.get("file") in busy for u in units) > len(units)


def stage_share(doc: dict, means: dict, stage: str, measure: str) -> list[dict]:
    """A stage's share of the staged step time (mean per step over ranks): weight sync, reward."""
    total = sum(v["wall_ms"] for k, v in means.items() if k[1] is not None)
    return [
        _record(measure, role, s, m["wall_ms"] / total, stage_ms=m["wall_ms"], step_ms=total)
        for (role, s), m in means.items()
        if s == stage and total > 0
    ]


def recompute(doc: dict, means: dict) -> list[dict]:
    """Forward passes that only recompute log-probs (reference, old policy) against the update:
    (ref + old-log-prob wall) / update wall, with whether the run needs the reference (its config)."""
    get = lambda s: sum(v["wall_ms"] for k, v in means.items() if k[1] == s)  # noqa: E731
    update, ref, old = get("actor_update"), get("ref_compute_log_prob"), get("actor_compute_log_prob")
    if not update or not (ref or old):
        return []
    cfg = doc.get("run_config") or {}
    return [
        _record(
            "recompute",
            "actor",
            "actor_update",
            (ref + old) / update,
            ref_ms=ref,
            old_log_prob_ms=old,
            update_ms=update,
            reference_needed=(cfg.get("kl_coef", 1.0) > 0) if cfg else None,
        )
    ]


def launch_bound(doc: dict) -> list[dict]:
    """Device idle time in gaps the host had not yet filled (the next event launched after the device went
    idle), per stage: sum(launch_bound_ms) / sum(wall_ms). GPU/NPU traces with launch flows only."""
    out = []
    per: dict[tuple, list[dict]] = defaultdict(list)
    for r in doc["rows"]:
        if r.get("unit") is None and "launch_bound_ms" in r:
            per[(r.get("role"), r.get("stage"))].append(r)
    for (role, stage), rows in per.items():
        wall = sum(r["wall_ms"] for r in rows)
        if wall <= 0:
            continue
        bound = sum(r["launch_bound_ms"] for r in rows)
        out.append(
            _record(
                "launch_bound",
                role,
                stage,
                bound / wall,
                launch_bound_ms=bound / _passes(rows),
                device_gap_ms=sum(r["device_gap_ms"] for r in rows) / _passes(rows),
                unlinked_ms=sum(r["launch_unlinked_ms"] for r in rows) / _passes(rows),
                wall_ms=wall / _passes(rows),
            )
        )
    return out


def memory_headroom(doc: dict) -> list[dict]:
    """Peak allocated bytes against the device's capacity (the trace's deviceProperties, else the device memory its
    window recorded: a torch_memory snapshot's is only there): peak / capacity."""
    out = []
    for m in doc.get("memory", []):
        if m.get("peak_bytes") is None:
            continue
        if not m.get("capacity_bytes"):
            out.append(
                _record(
                    "memory_use",
                    m.get("role"),
                    m.get("stage"),
                    None,
                    "not measurable",
                    rank=m.get("rank"),
                    file=m.get("file"),
                    peak_bytes=m["peak_bytes"],
                    why=m.get("capacity_why")
                    or "the trace does not give the device's memory capacity (deviceProperties), or "
                    "the memory recorded is host memory",
                )
            )
            continue
        out.append(
            _record(
                "memory_use",
                m.get("role"),
                m.get("stage"),
                m["peak_bytes"] / m["capacity_bytes"],
                rank=m.get("rank"),
                file=m.get("file"),
                device=m.get("device"),
                peak_bytes=m["peak_bytes"],
                capacity_bytes=m["capacity_bytes"],
            )
        )
    return out


HOST_CAUSES = ("host_sync", "data_transfer", "host_wait", "garbage_collection")  # analyze/window/idle_frames.py


def host_time(doc: dict) -> list[dict]:
    """The stage thread's time in each host-side cause, per stage (rows with the host's stacks sampled beside them:
    analyze/window/idle_frames.py): sum(host_time[cause].ms) / sum(wall_ms), with the cause's top call site (the
    site that holds the most of it in any one row)."""
    per: dict[tuple, list[dict]] = defaultdict(list)
    for r in doc["rows"]:
        if r.get("unit") is None and r.get("host_time") is not None:
            per[(r.get("role"), r.get("stage"))].append(r)
    out = []
    for (role, stage), rows in per.items():
        wall = sum(r["wall_ms"] for r in rows)
        for cause in HOST_CAUSES:
            sites = [r["host_time"][cause] for r in rows if cause in r["host_time"]]
            if not sites or wall <= 0:
                continue
            ms = sum(site["ms"] for site in sites)
            top = max(sites, key=lambda site: site["ms"])
            out.append(
                _record(
                    cause,
                    role,
                    stage,
                    ms / wall,
                    host_ms=ms / _passes(rows),
                    wall_ms=wall / _passes(rows),
                    **{k: top[k] for k in ("function", "file", "line", "library")},
                )
            )
    return out


def measures(doc: dict, means: dict) -> list[dict]:
    """Every RL measure of the document (`means`: findings.stage_means). The rollout's tail is measured from its
    decode steps where they say how many rows were active, else from its samples (diagnosis/samples.py)."""
    from_samples = sample_measures(doc)
    tails = rollout_tail(doc)
    if any(m["status"] == "measured" for m in tails):
        from_samples = [m for m in from_samples if m["measure"] != "rollout_tail"]
    elif any(m["measure"] == "rollout_tail" for m in from_samples):
        tails = [m for m in tails if m["stage"] != "rollout_generate"]
    return (
        tails
        + from_samples
        + padding(doc)
        + fixed_cost(doc)
        + recompute(doc, means)
        + stage_share(doc, means, "reward_compute", "reward_share")
        + stage_share(doc, means, "weight_sync", "weight_sync_share")
        + launch_bound(doc)
        + memory_headroom(doc)
        + host_time(doc)
    )

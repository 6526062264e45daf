"""The rollout, sample by sample: the hosts' per-sample records (inputs/samples_file.py) as the document's `samples`
table on the trace's clock, and each step's distribution (`sample_steps`): how long its samples took and how many
tokens they generated (p50/p90/p99/max), the share of its rollout the batch spent with fewer than half of its samples
still running (the tail), its slowest samples, its phases summed and its preemptions.

A step's rollout lasts as long as its slowest sample: the tail is where the batch waits for a few. Each generation
pass of a step (DAPO's refills: `rollout_pass`) is one batch; a step's tail and span are its passes' sums. Where a vLLM
engine recorded what its scheduler said over the step (inputs/samples_file.py, ENGINE_FIELDS), the step holds it
(`engine`: its engines' counts summed, their limits): what tells a queue held by the KV cache from one held by the
engine's slots.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..inputs.samples_file import INSIDE_FROM, PHASE_PLACES, PHASES
from ..inputs.samples_file import ENGINE_FIELDS

TAIL_RUNNING = 0.5  # fewer than this share of a pass's samples still running: the batch is in its tail
SLOWEST = 3  # the slowest samples a step names
TABLE_FIELDS = (
    "step",
    "rank",
    "replica",
    "sample",
    "source",
    "start_us",
    "end_us",
    "prompt_tokens",
    "response_tokens",
    "turns",
    *PHASES,
    "preemptions",
    "rollout_pass",
    "group",
    "group_filtered",
    "first_decode_step",
    "last_decode_step",
    "request_id",
    "finish_reason",
    "cached_tokens",
    "worker",
)


def sample_table(records: list[dict], clock_base_us: float | None) -> list[dict]:
    """The records as the document keeps them: their known fields only (an unknown one stays absent), times moved
    onto the trace's clock (the host's epoch microseconds less the traces' `baseTimeNanoseconds`, where the run's
    traces have one), ordered by step, rank or replica, and sample."""
    base = clock_base_us or 0.0
    out = []
    for r in records:
        row = {k: r[k] for k in TABLE_FIELDS if k in r}
        for k in ("start_us", "end_us"):
            if k in row:
                row[k] = float(row[k]) - base
        out.append(row)
    key = lambda r: (r["step"], r.get("rank", -1), r.get("replica", -1), r.get("rollout_pass", 0), r["sample"])  # noqa: E731
    return sorted(out, key=key)


def duration_ms(r: dict) -> float | None:
    return (r["end_us"] - r["start_us"]) / 1e3 if "start_us" in r and "end_us" in r else None


UNTIMED = "untimed"  # a sample's life in no phase its host times (vLLM: after its last token until returned)
UNTIMED_US = 2.0  # a gap this small is the records' rounding (whole microseconds, milliseconds as floats), not time


def phase_spans(r: dict) -> list[tuple[str, float, float, bool]]:
    """A sample's life on its clock, cut into its phases in the order they ran: (phase, start_us, end_us, placed).
    The phases its host places between start and end follow each other from the end its host anchors them to
    (INSIDE_FROM), what they leave of the span is UNTIMED, and where they sum to more than the span (two clocks)
    they are scaled into it; a queue before the start ends at the start; a phase after the batch (the trainer's
    reward) follows the end, `placed` False: its length is recorded, not its place. [] for a sample without start
    and end."""
    if "start_us" not in r or "end_us" not in r:
        return []
    source = r.get("source")
    places = PHASE_PLACES.get(source, {})
    held = [p for p in PHASES if isinstance(r.get(p), (int, float))]
    start, end = r["start_us"], r["end_us"]
    out: list[tuple[str, float, float, bool]] = []
    before = [p for p in held if places.get(p) == "before"]
    t = start - sum(r[p] for p in before) * 1e3
    for p in before:
        out.append((p, t, t + r[p] * 1e3, True))
        t += r[p] * 1e3
    inside = [p for p in held if places.get(p, "inside") == "inside"]
    total = sum(r[p] for p in inside) * 1e3
    scale = min(1.0, (end - start) / total) if total > 0 else 1.0
    gap = (end - start) - total * scale
    untimed = [(UNTIMED, 0.0, gap)] if gap > UNTIMED_US else []
    lengths = [(p, 0.0, r[p] * 1e3 * scale) for p in inside]
    t = start
    for p, _, length in untimed + lengths if INSIDE_FROM.get(source, "start") == "end" else lengths + untimed:
        out.append((p, t, t + length, True))
        t += length
    t = end
    for p in (p for p in held if places.get(p) == "after"):
        out.append((p, t, t + r[p] * 1e3, False))
        t += r[p] * 1e3
    return out


def unrecorded_phases(samples: list[dict]) -> dict[str, tuple[list[str], list[str]]]:
    """Per host (source): the phases of a sample's life (queue, prefill, decode, tools, reward; prefill and decode
    apart where it times generation whole) it never records (PHASE_PLACES: what each host times), and those it may
    record but none of these samples holds (no tool ran, no queue in a synchronous rollout)."""
    out: dict[str, tuple[list[str], list[str]]] = {}
    for source in sorted({s.get("source") for s in samples if s.get("source")}):
        knows = PHASE_PLACES.get(source, {})
        held = {p for s in samples if s.get("source") == source for p in PHASES if p in s}
        never = [p for p in PHASES if p not in knows and p != "generate_ms"]
        if "generate_ms" in knows:  # generation timed whole: prefill and decode are not apart
            never = [p for p in never if p not in ("prefill_ms", "decode_ms")] + ["prefill_ms/decode_ms"]
        out[source] = (never, [p for p in PHASES if p in knows and p not in held])
    return out


def quantiles(values: list[float]) -> dict | None:
    if not values:
        return None
    a = np.asarray(values, float)
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "max": float(a.max())}


def tail_of(timed: list[dict]) -> tuple[float, float]:
    """(the batch's span, the time in it with fewer than TAIL_RUNNING of its samples still running), in ms: a sweep
    over the samples' starts and ends."""
    if not timed:
        return 0.0, 0.0
    edges = sorted([(r["start_us"], 1) for r in timed] + [(r["end_us"], -1) for r in timed])
    limit = TAIL_RUNNING * len(timed)
    running, tail, last = 0, 0.0, edges[0][0]
    for t, change in edges:
        if running < limit:
            tail += t - last
        running += change
        last = t
    return (edges[-1][0] - edges[0][0]) / 1e3, tail / 1e3


ENGINE_MAX = ("max_running", "max_waiting", "peak_kv_usage")  # the most over the step; the other counts: summed
ENGINE_LIMITS = ("max_num_seqs", "max_num_batched_tokens", "kv_cache_tokens", "block_size")


def engine_summaries(records: list[dict]) -> dict:
    """step -> what its engines' schedulers said over it (inputs/samples_file.py, ENGINE_FIELDS): counts summed over
    its engines and passes, the most of each maximum, the limits (the first engine's)."""
    out: dict = {}
    for r in records:
        mine = out.setdefault(r["step"], {})
        for k in ENGINE_FIELDS:
            if k not in r or k == "rollout_pass":
                continue
            if k in ENGINE_LIMITS:
                mine.setdefault(k, r[k])
            elif k in ENGINE_MAX:
                mine[k] = max(mine.get(k, r[k]), r[k])
            else:
                mine[k] = mine.get(k, 0) + r[k]
    return out


def step_summaries(samples: list[dict], engine: list[dict] = ()) -> list[dict]:
    """Per step: its samples' distribution, its tail, its slowest samples, its phases summed and its preemptions,
    and what its engines' schedulers said (`engine`) where they recorded it."""
    engines = engine_summaries(list(engine))
    by_step: dict = defaultdict(list)
    for r in samples:
        by_step[r["step"]].append(r)
    out = []
    for step, rows in sorted(by_step.items()):
        timed = [r for r in rows if duration_ms(r) is not None]
        passes: dict = defaultdict(list)
        for r in timed:
            passes[(r.get("rollout_pass", 0), r.get("replica") if r.get("source") != "rlprof" else None)].append(r)
        span = tail = 0.0
        for batch in passes.values():
            s, t = tail_of(batch)
            span, tail = span + s, tail + t
        slowest = sorted(timed, key=lambda r: -duration_ms(r))[:SLOWEST]
        summary = {
            "step": step,
            "samples": len(rows),
            "duration_ms": quantiles([duration_ms(r) for r in timed]),
            "response_tokens": quantiles([r["response_tokens"] for r in rows if "response_tokens" in r]),
            "span_ms": span if timed else None,
            "tail_ms": tail if timed else None,
            "tail_share": tail / span if span > 0 else None,
            "slowest": [
                {
                    k: r[k]
                    for k in ("sample", "rank", "replica", "worker", "response_tokens", "tool_ms", "turns")
                    if k in r
                }
                | {"duration_ms": duration_ms(r)}
                for r in slowest
            ],
            "phases_ms": {p: sum(r[p] for r in rows if p in r) for p in PHASES if any(p in r for r in rows)},
        }
        if any("prompt_tokens" in r for r in rows):
            summary["prompt_tokens"] = quantiles([r["prompt_tokens"] for r in rows if "prompt_tokens" in r])
        if any("preemptions" in r for r in rows):
            summary["preemptions"] = sum(r.get("preemptions", 0) for r in rows)
            summary["preempted_samples"] = sum(1 for r in rows if r.get("preemptions", 0) > 0)
        if step in engines:
            summary["engine"] = engines[step]
        out.append(summary)
    return out


def clock_base_us(inputs: list[dict]) -> float | None:
    """The traces' clock origin (Kineto's `baseTimeNanoseconds`, in µs): where the run's traces have one."""
    bases = {i["clock_base_ns"] for i in inputs if i.get("clock_base_ns") is not None}
    return min(bases) / 1e3 if bases else None


# ---- measures over the samples (measures.py lists them with the rest; docs/analysis_schema.md gives each formula) ----
ROLLOUT = ("rollout", "rollout_generate")


def _record(measure: str, value, status: str = "measured", **inputs) -> dict:
    return {"measure": measure, "role": ROLLOUT[0], "stage": ROLLOUT[1], "value": value, "status": status, **inputs}


def sample_measures(doc: dict) -> list[dict]:
    """The causes a rollout's samples show: its tail (where no decode step says how many rows were active), its
    slowest samples' tool calls, preemptions and a queue before generation. Only where the host recorded what each
    needs: a measure of a field no sample has is not made."""
    steps = doc.get("sample_steps") or []
    samples = doc.get("samples") or []
    out = []
    timed = [s for s in steps if s.get("span_ms")]
    if timed:
        span, tail = sum(s["span_ms"] for s in timed), sum(s["tail_ms"] for s in timed)
        out.append(
            _record(
                "rollout_tail",
                tail / span,
                basis="samples",
                tail_ms=tail / len(timed),
                decode_ms=span / len(timed),
                steps=len(timed),
                samples_per_step=sum(s["samples"] for s in timed) / len(timed),
                tail_running=TAIL_RUNNING,
            )
        )
    slow = [(s, s["slowest"][0]) for s in timed if s["slowest"] and "tool_ms" in s["slowest"][0]]
    if slow:
        tool = sum(x["tool_ms"] for _, x in slow)
        out.append(
            _record(
                "tool_share",
                tool / sum(x["duration_ms"] for _, x in slow),
                tool_ms=tool / len(slow),
                slowest_ms=sum(x["duration_ms"] for _, x in slow) / len(slow),
                steps=len(slow),
            )
        )
    refills = _refills(samples) or _refills_of(doc.get("rollout_account") or [])
    if refills:
        out.append(_record("refill_share", **refills))
    outside = _outside(doc.get("rollout_account") or [])
    if outside:
        out.append(_record("outside_share", **outside))
    known = [r for r in samples if "preemptions" in r]
    if known:
        hit = [r for r in known if r["preemptions"] > 0]
        out.append(
            _record(
                "preempted_share",
                len(hit) / len(known),
                preempted=len(hit),
                samples=len(known),
                preemptions=sum(r["preemptions"] for r in hit),
                excess_ms=_preempted_excess(hit, steps),
            )
        )
    waited = [r for r in samples if "queue_ms" in r and duration_ms(r) is not None]
    if waited:
        queue = sum(r["queue_ms"] for r in waited)
        longest: dict = defaultdict(float)
        for r in waited:
            longest[r["step"]] = max(longest[r["step"]], r["queue_ms"])
        out.append(
            _record(
                "queue_share",
                queue / (queue + sum(duration_ms(r) for r in waited)),
                queue_ms=queue / len(waited),
                longest_queue_ms=sum(longest.values()) / len(longest),
                steps=len(longest),
                **queue_where(waited, steps),
            )
        )
    return out


def queue_where(waited: list[dict], steps: list[dict]) -> dict:
    """Where the samples waited: `in_engine` (vLLM's queued time: in its scheduler's waiting queue) or not (rlprof's
    async replicas: from the driver's submission to a replica's start), and, inside an engine, what its scheduler
    said over the steps they waited in (their engines' counts summed: the iterations that left requests waiting, of
    them those with the KV cache full or with max_num_seqs running, the requests preempted, and the limits)."""
    in_engine = all(r.get("source") == "vllm" for r in waited)
    out: dict = {"in_engine": in_engine}
    said = [s["engine"] for s in steps if s.get("engine") and s["step"] in {r["step"] for r in waited}]
    if in_engine and said:
        for k in ("iterations", "waiting_iterations", "kv_full_iterations", "slots_full_iterations", "preempted"):
            out[k] = sum(e.get(k, 0) for e in said)
        for k in ENGINE_MAX:
            out[k] = max(e.get(k, 0) for e in said)
        for k in ENGINE_LIMITS:
            if any(k in e for e in said):
                out[k] = next(e[k] for e in said if k in e)
    return out


def _preempted_excess(hit: list[dict], steps: list[dict]) -> float:
    """Per step, how much longer its slowest preempted sample took than the step's median sample (mean over steps)."""
    median = {s["step"]: s["duration_ms"]["p50"] for s in steps if s.get("duration_ms")}
    worst: dict = {}
    for r in hit:
        if duration_ms(r) is not None and r["step"] in median:
            worst[r["step"]] = max(worst.get(r["step"], 0.0), duration_ms(r) - median[r["step"]])
    return sum(worst.values()) / len(worst) if worst else 0.0


def _refills(samples: list[dict]) -> dict | None:
    """DAPO's dynamic sampling, from the passes its host numbered (`rollout_pass`): the share of the rollout's
    generation time its refill passes took (each pass's span, first start to last end, summed per step), the refill
    time per step, and per pass the groups it generated and those the filter dropped (`group_filtered`, where the
    host says it), summed over the steps; None where no step refilled."""
    by_step: dict = defaultdict(lambda: defaultdict(list))
    for r in samples:
        if duration_ms(r) is not None and "rollout_pass" in r:
            by_step[r["step"]][r["rollout_pass"]].append(r)
    refilled = {step: passes for step, passes in by_step.items() if len(passes) > 1}
    if not refilled:
        return None
    total = refill = 0.0
    per_pass: dict = defaultdict(lambda: {"samples": 0, "groups": 0, "dropped": 0})
    for passes in by_step.values():
        for k, rows in passes.items():
            span = (max(r["end_us"] for r in rows) - min(r["start_us"] for r in rows)) / 1e3
            total += span
            refill += span if k > 0 else 0.0
            p = per_pass[k]
            p["samples"] += len(rows)
            grouped = {r["group"]: r.get("group_filtered") for r in rows if "group" in r}
            p["groups"] += len(grouped)
            p["dropped"] += sum(1 for dropped in grouped.values() if dropped)
    steps = len(by_step)
    return {
        "value": refill / total if total > 0 else 0.0,
        "refill_ms": refill / steps,
        "rollout_ms": total / steps,
        "steps": steps,
        "refilled_steps": len(refilled),
        "passes": [{"pass": k, **per_pass[k]} for k in sorted(per_pass)],
    }


def _outside(account: list[dict]) -> dict | None:
    """The rollout stage's time outside its samples' generation, over the watched steps no window profiled (the
    profiler's start and stop are in the others'): its share of the stage, per step, and the parts the host names
    (medians); None where no such step was accounted for."""
    steps = [a for a in account if not a["profiled"] and a["stage_ms"] > 0]
    if not steps:
        return None
    stage, outside = sum(a["stage_ms"] for a in steps), sum(a["outside_ms"] for a in steps)
    out = {
        "value": outside / stage,
        "outside_ms": outside / len(steps),
        "stage_ms": stage / len(steps),
        "generation_ms": sum(a["generation_ms"] for a in steps) / len(steps),
        "steps": len(steps),
    }
    for part in ("handover_ms", "release_ms"):
        known = [a[part] for a in steps if part in a]
        if known:
            out[part] = float(np.median(known))
    return out


def _refills_of(account: list[dict]) -> dict | None:
    """DAPO's dynamic sampling where the host's passes overlap (verl's v1 replay buffer dispatches refills while the
    first batch runs): the generation time its refills added after the first batch had ended, over the generation
    time (rollout_account.py), per step; the filter's dropped groups summed. None where no step refilled."""
    steps = [a for a in account if a["generation_ms"] > 0]
    refilled = [a for a in steps if a.get("refills")]
    if not refilled:
        return None
    refill, total = sum(a.get("refill_ms", 0.0) for a in steps), sum(a["generation_ms"] for a in steps)
    samples = sum(a["samples"] for a in steps)
    again = sum(a.get("refill_samples", 0) for a in steps)
    return {
        "value": refill / total,
        "refill_ms": refill / len(steps),
        "rollout_ms": total / len(steps),
        "steps": len(steps),
        "refilled_steps": len(refilled),
        "passes": [
            {"pass": 0, "samples": samples - again, "groups": 0, "dropped": 0},
            {"pass": 1, "samples": again, "groups": 0, "dropped": 0},
        ],
        "filtered_groups": sum(a.get("filtered_groups", 0) for a in steps),
    }

"""How far each stage, micro-batch and decode step runs from what its device can do.

Per row with work (a micro-batch of a training pass, a decode step, the stage made of them; a training stage without
units from its step's samples): `model_flops` on its real tokens, `padded_flops` on the tokens it computed (padding
included), `min_bytes` it must move (diagnosis/model_work.py, in verl's and vLLM's conventions), and where the
window's device is known (analyze/inputs/hardware.py): achieved TFLOP/s and GB/s, `mfu` and `mbu` (against the
device's peak for the model's dtype and its memory bandwidth), `mfu_verl` (against the peak verl's own perf/mfu
divides by), the speed-of-light time `sol_ms` = max(FLOPs / peak, bytes / bandwidth) and which limit sets it
(`bound`), and the gap `gap_ms` = wall - sol_ms split into what rlprof measures, taken in this order and each at most
what is left of the gap, the rest being the kernels' own distance from the limit:

    idle (not waiting on a launch), launch-bound, exposed communication, memcpy, padding (the compute time of the
    padding's share of the FLOPs), small micro-batches (the fixed cost per micro-batch the fixed_cost measure fits),
    kernels below their limit (the rest)

so the parts sum to the gap exactly. A row that ran faster than its speed of light (a peak or a measured CPU below
what the kernels reached) has no gap; its mfu or mbu above 1 says so. Each (role, stage) is summed into one
`stage_limits` record (sums over its stage rows; ratios of sums). A saving that would bring a stage below its
speed-of-light time is cut there (`within_speed_of_light`, applied where savings are made).
"""

from __future__ import annotations

from collections import defaultdict

from .measures import fixed_cost
from .model_work import PASSES, UPDATE_PASSES, Shape

KEY = ("step", "role", "stage", "rank", "replica")
WORK_UNITS = ("micro_batch", "decode_step")
# the gap's parts in the order they are taken (each at most what is left): the row's field, what it is
GAP_PARTS = (
    ("gap_idle_ms", "idle"),
    ("gap_launch_ms", "launch-bound"),
    ("gap_comm_ms", "exposed communication"),
    ("gap_memcpy_ms", "memcpy"),
    ("gap_padding_ms", "padding"),
    ("gap_small_batches_ms", "small micro-batches"),
    ("gap_kernels_ms", "kernels below their limit"),
)
SUMMED = ("model_flops", "padded_flops", "min_bytes", "wall_ms", "sol_ms", "gap_ms", *(f for f, _ in GAP_PARTS))
# every field this module gives a row (analyze/result.py: Limits)
ROW_FIELDS = (
    "work_from",
    "model_flops",
    "padded_flops",
    "min_bytes",
    "achieved_tflops",
    "achieved_gbps",
    "mfu",
    "mbu",
    "mfu_verl",
    "sol_ms",
    "bound",
    "gap_ms",
    *(f for f, _ in GAP_PARTS),
    "gap_largest",
)


def speed_of_light(doc: dict, model: dict) -> list[dict]:
    """Each row's work and limits (in place) and the per-stage records (`stage_limits`)."""
    shape = Shape.of(model)
    if shape is None:
        return []
    dtype = model.get("dtype") or "float32"
    hardware = _hardware_by_file(doc)
    units = defaultdict(list)
    for r in doc["rows"]:
        if r.get("unit") in WORK_UNITS:
            work = unit_work(shape, r)
            if work is not None:
                r.update(work)
                units[tuple(r.get(k) for k in KEY)].append(r)
    epochs = _ppo_epochs(doc)
    for r in doc["rows"]:
        if r.get("unit") is None and r.get("stage"):
            held = units.get(tuple(r.get(k) for k in KEY))
            work = _summed(held) if held else samples_work(shape, doc, r, epochs)
            if work is not None:
                r.update(work)
    fixed = {(m["role"], m["stage"]): m["fixed_ms"] for m in fixed_cost(doc) if m["status"] == "measured"}
    for r in doc["rows"]:
        if "model_flops" in r:
            hw = hardware.get(r.get("file")) or _units_hardware(units, r, hardware)
            small = fixed.get((r.get("role"), r.get("stage")), 0.0) * _micro_batches(units, r)
            r.update(limits(r, hw, dtype, small))
        if "call" in r:
            hw = hardware.get(r.get("file")) or _units_hardware(units, r, hardware)
            call_limits(shape, r, hw, dtype)
    return stage_limits(doc["rows"])


def call_limits(shape: Shape, row: dict, hw: dict | None, dtype: str) -> None:
    """The whole stage call a window kept some micro-batches of (in place, its `call`): the model FLOPs of all its
    micro-batches' real tokens over the call's wall time, against the device's peak and the one verl's own
    perf/mfu divides by: the rate the framework's own mfu states for that call, beside the kept units' own."""
    call, passes = row["call"], PASSES.get(row.get("stage"))
    if passes is None or "real_tokens" not in call or call.get("wall_ms", 0) <= 0:
        return
    call["model_flops"] = shape.train_flops(passes, call["real_tokens"], call["query_key_pairs"])
    rate = call["model_flops"] / (call["wall_ms"] / 1e3)
    peak = (hw or {}).get("peak_flops", {}).get(dtype)
    if peak:
        call["mfu"] = rate / peak
    if (hw or {}).get("verl_peak_flops"):
        call["mfu_verl"] = rate / hw["verl_peak_flops"]


def unit_work(shape: Shape, u: dict) -> dict | None:
    """A micro-batch's or a decode step's work from what its range says it held (None where it says too little)."""
    if u["unit"] == "micro_batch":
        passes = PASSES.get(u.get("stage"))
        if passes is None or not u.get("tokens"):
            return None
        tokens, seqs = u["tokens"], u.get("seqs") or 1
        real = u.get("real_tokens", tokens)
        pairs, how = u.get("query_key_pairs"), "micro-batch tokens"
        if pairs is None:  # equal lengths: the least pairs these tokens can make
            pairs, how = real * real / seqs, how + " (lengths taken equal: the unit did not record its pairs)"
        padded_pairs = pairs if tokens == real else tokens * tokens / seqs
        return {
            "work_from": how,
            "model_flops": shape.train_flops(passes, real, pairs),
            "padded_flops": shape.train_flops(passes, tokens, padded_pairs),
            "min_bytes": shape.train_bytes(passes, real),
        }
    computed = u.get("tokens") or u.get("seqs")
    if not computed:
        return None
    if "real_tokens" in u:
        real = u["real_tokens"]
    elif "tokens" in u:
        real = computed  # an engine's iteration computes only its scheduled rows
    else:  # rlprof's trainer before it said its tokens: one per row, the active rows real
        real = u.get("active", computed)
    seqs, prefill = u.get("prefill_seqs", 0), u.get("prefill_tokens", 0)
    context, pairs, how = u.get("context_tokens"), u.get("query_key_pairs"), "decode step"
    if context is None or pairs is None:
        context = pairs = 0
        how += " (no context recorded: the KV cache and the attention scores left out)"
    scale = computed / real if real else 1.0
    return {
        "work_from": how,
        "model_flops": shape.decode_flops(real, seqs, prefill, pairs),
        "padded_flops": shape.decode_flops(computed, seqs, prefill * scale, pairs * scale),
        "min_bytes": shape.decode_bytes(real, seqs, prefill, context),
    }


def _summed(units: list[dict]) -> dict:
    kinds = sorted({u["work_from"] for u in units})
    return {
        "work_from": f"{len(units)} units: " + "; ".join(kinds),
        **{k: sum(u[k] for u in units) for k in ("model_flops", "padded_flops", "min_bytes")},
    }


def samples_work(shape: Shape, doc: dict, row: dict, epochs: int) -> dict | None:
    """A training stage recorded without units: its step's samples' lengths (prompt + response), every pass over them
    (ppo_epochs for the update), on the row's rank where the samples say their rank."""
    passes = PASSES.get(row.get("stage"))
    if passes is None:
        return None
    samples = [s for s in doc.get("samples", []) if s.get("step") == row.get("step")]
    ranked = any("rank" in s for s in samples)
    if ranked:
        samples = [s for s in samples if s.get("rank") == row.get("rank")]
    lengths = [
        s["prompt_tokens"] + s["response_tokens"] for s in samples if "prompt_tokens" in s and "response_tokens" in s
    ]
    if not lengths:
        return None
    times = epochs if passes == UPDATE_PASSES else 1
    tokens, pairs = sum(lengths), sum(n * n for n in lengths)
    flops = times * shape.train_flops(passes, tokens, pairs)
    return {
        "work_from": f"the step's {len(lengths)} samples"
        + ("" if ranked else " (of every rank: they do not say theirs)" if _ranks(doc) > 1 else "")
        + (f" x {times} ppo_epochs" if times > 1 else ""),
        "model_flops": flops,
        "padded_flops": flops,  # how the stage padded them is not recorded: no padding said
        "min_bytes": times * shape.train_bytes(passes, tokens),
    }


def limits(row: dict, hw: dict | None, dtype: str, small_batches_ms: float = 0.0) -> dict:
    """A row's distance from its device's limits, and its gap split (nothing where the device's limits are not
    known: its work stands alone)."""
    peak = (hw or {}).get("peak_flops", {}).get(dtype)
    bandwidth = (hw or {}).get("bandwidth")
    wall = row["wall_ms"]
    if not peak or not bandwidth or wall <= 0:
        return {}
    seconds = wall / 1e3
    flops_ms, bytes_ms = row["model_flops"] / peak * 1e3, row["min_bytes"] / bandwidth * 1e3
    sol = max(flops_ms, bytes_ms)
    out = {
        "achieved_tflops": row["model_flops"] / seconds / 1e12,
        "achieved_gbps": row["min_bytes"] / seconds / 1e9,
        "mfu": row["model_flops"] / seconds / peak,
        "mbu": row["min_bytes"] / seconds / bandwidth,
        "sol_ms": sol,
        "bound": "compute" if flops_ms >= bytes_ms else "memory",
        "gap_ms": max(0.0, wall - sol),
    }
    if hw.get("verl_peak_flops"):
        out["mfu_verl"] = row["model_flops"] / seconds / hw["verl_peak_flops"]
    out.update(gap_parts(row, out["gap_ms"], small_batches_ms))
    return out


def gap_parts(row: dict, gap: float, small_batches_ms: float) -> dict:
    """The gap split into GAP_PARTS, in order, each at most what is left: they sum to the gap."""
    launch = row.get("launch_bound_ms", 0.0)
    padded, model = row["padded_flops"], row["model_flops"]
    measured = {
        "gap_idle_ms": max(0.0, row["idle_ms"] - launch),
        "gap_launch_ms": launch,
        "gap_comm_ms": row["comm_ms"],
        "gap_memcpy_ms": row["memcpy_ms"],
        "gap_padding_ms": row["compute_ms"] * (padded - model) / padded if padded > model else 0.0,
        "gap_small_batches_ms": small_batches_ms,
    }
    out, left = {}, gap
    for field, _ in GAP_PARTS[:-1]:
        out[field] = min(max(0.0, measured[field]), left)
        left -= out[field]
    out["gap_kernels_ms"] = left
    out["gap_largest"] = dict(GAP_PARTS)[max(out, key=out.get)] if gap > 0 else None
    return out


def stage_limits(rows: list[dict]) -> list[dict]:
    """One record per (role, stage): its stage rows' work, wall, speed of light and gap parts summed (`rows` of
    them), its ratios the sums' (mfu: FLOPs over the sum of each row's wall x peak)."""
    per: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("unit") is None and "sol_ms" in r:
            per[(r.get("role"), r.get("stage"))].append(r)
    out = []
    for (role, stage), held in per.items():
        rec = {"role": role, "stage": stage, "rows": len(held), **{k: sum(r[k] for r in held) for k in SUMMED}}
        seconds = rec["wall_ms"] / 1e3
        for ratio in ("mfu", "mbu", "mfu_verl"):
            # each row's ratio x its wall: the sum of its work over the sum of wall x the limit
            if all(ratio in r for r in held):
                rec[ratio] = sum(r[ratio] * r["wall_ms"] for r in held) / rec["wall_ms"]
        rec["achieved_tflops"] = rec["model_flops"] / seconds / 1e12
        rec["achieved_gbps"] = rec["min_bytes"] / seconds / 1e9
        compute = sum(r["sol_ms"] for r in held if r["bound"] == "compute")
        rec["bound"] = "compute" if compute >= rec["sol_ms"] - compute else "memory"
        parts = {f: rec[f] for f, _ in GAP_PARTS}
        rec["gap_largest"] = dict(GAP_PARTS)[max(parts, key=parts.get)] if rec["gap_ms"] > 0 else None
        calls = [r["call"] for r in held if "model_flops" in r.get("call", {})]
        if calls:
            rec["calls"] = calls_summed(calls)
        out.append(rec)
    return out


def calls_summed(calls: list[dict]) -> dict:
    """A stage's whole calls (`call_limits`) as one: their ratios the sums' (FLOPs over each call's time x peak)."""
    out = {
        "calls": len(calls),
        "units": sum(c["units"] for c in calls),
        "wall_ms": sum(c["wall_ms"] for c in calls),
        "model_flops": sum(c["model_flops"] for c in calls),
    }
    for ratio in ("mfu", "mfu_verl"):
        if all(c.get(ratio) for c in calls):
            out[ratio] = out["model_flops"] / sum(c["model_flops"] / c[ratio] for c in calls)
    return out


def sol_per_step(doc: dict) -> dict:
    """stage -> its speed-of-light time per step, as stage times are taken (findings.stage_means: the sum over its
    rows over steps x ranks, its roles added), where every row of it has one."""
    per: dict[tuple, list[dict]] = defaultdict(list)
    for r in doc["rows"]:
        if r.get("unit") is None and r.get("stage"):
            per[(r.get("role"), r["stage"])].append(r)
    out: dict[str, float] = {}
    for (role, stage), rows in per.items():
        if not all("sol_ms" in r for r in rows):
            continue
        ranks = {r["replica"] if role == "rollout" and r.get("replica") is not None else r.get("rank") for r in rows}
        steps = {r.get("step") for r in rows}
        out[stage] = out.get(stage, 0.0) + sum(r["sol_ms"] for r in rows) / (len(steps) * len(ranks))
    return out


def within_speed_of_light(by_stage: dict, stage_ms: dict, sol: dict) -> tuple[dict, dict]:
    """A saving's parts per stage, each cut where it would bring its stage (`stage_ms`: its time the saving is taken
    from) below its speed-of-light time (`sol`); and the stages cut, with their speed-of-light time."""
    out, cut = {}, {}
    for stage, ms in by_stage.items():
        room = stage_ms.get(stage, 0.0) - sol[stage] if stage in sol else None
        if room is not None and ms > max(0.0, room):
            out[stage], cut[stage] = max(0.0, room), sol[stage]
        else:
            out[stage] = ms
    return out, cut


def _hardware_by_file(doc: dict) -> dict:
    from pathlib import PurePath

    return {PurePath(i["path"]).name: i["hardware"] for i in doc["inputs"] if i.get("hardware")}


def _units_hardware(units: dict, row: dict, hardware: dict) -> dict | None:
    """An assembled stage row's device: its units' file's."""
    for u in units.get(tuple(row.get(k) for k in KEY), ()):
        if u.get("file") in hardware:
            return hardware[u["file"]]
    return None


def _micro_batches(units: dict, row: dict) -> int:
    if row.get("unit") == "micro_batch":
        return 1
    if row.get("unit") is not None:
        return 0
    return sum(1 for u in units.get(tuple(row.get(k) for k in KEY), ()) if u["unit"] == "micro_batch")


def _ranks(doc: dict) -> int:
    return len({r.get("rank") for r in doc["rows"] if r.get("role") != "rollout"})


def _ppo_epochs(doc: dict) -> int:
    cfg = (doc.get("run_config") or {}).get("config") or {}
    for path in (("actor", "ppo_epochs"), ("actor_rollout_ref", "actor", "ppo_epochs")):
        node = cfg
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, int) and node > 0:
            return node
    return 1

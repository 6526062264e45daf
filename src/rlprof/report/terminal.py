"""The terminal renderer: every document rlprof computes (analysis, cluster, compare, advice) as rich tables,
the answer first. The HTML renderer is page.py / fragments.py; CSV and DuckDB are analyze/export.py.

Over 400 lines because it is one renderer for every document, as page.py is for HTML: the terminal's words for a
document stay beside each other, so a number is said one way in all of them."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ..analyze.diagnosis.sentences import share_words
from ..analyze.window.breakdown import BUCKETS
from ..vocab import window_label
from .shape import (
    fmt,
    op_columns,
    ops_by_stage,
    pivot_columns,
    stage_pivot,
    units_differ,
    where,
    writer_words,
    writers_differ,
)
from .speed_of_light import speed_of_light_lines


def _console(width: int = 120) -> Console:
    return Console(width=max(width, Console().width))


MEASURE_WORDS = {
    "rollout_tail": "rollout tail",
    "padding": "padding",
    "fixed_cost": "fixed cost per micro-batch",
    "recompute": "log-prob recompute / update",
    "reward_share": "reward share of step",
    "weight_sync_share": "weight sync share of step",
    "launch_bound": "launch-bound",
    "memory_use": "memory use / capacity",
    "refill_share": "dynamic sampling's refills",
    "outside_share": "rollout outside generation",
}


def measures_line(measures: list[dict]) -> str:
    """The RL measures in one line: the largest value of each (where), or why it could not be measured."""
    best: dict[str, dict] = {}
    for m in measures:
        cur = best.get(m["measure"])
        if cur is None or (m["value"] is not None and (cur["value"] is None or m["value"] > cur["value"])):
            best[m["measure"]] = m
    parts = []
    for name, m in best.items():
        where = f" ({m['stage']})" if m.get("stage") and name not in ("reward_share", "weight_sync_share") else ""
        value = f"{m['value']:.0%}" if m["value"] is not None else "not measurable"
        parts.append(f"{MEASURE_WORDS.get(name, name)} {value}{where}")
    return "; ".join(parts)


def print_findings(
    console: Console, found: list[dict], limit: int = 6, measures: list[dict] | None = None, plan: dict | None = None
) -> None:
    if measures:
        console.print(
            f"[bold]RL measures[/] (largest per measure; formulas in docs/analysis_schema.md): "
            f"{measures_line(measures)}",
            highlight=False,
            soft_wrap=True,
        )
    if not any(f.get("actionable") for f in found):
        console.print(
            "[bold]causes:[/] none above its threshold (tail, padding, micro-batch size, reference, reward, "
            "weight sync, communication, launches, memory)",
            highlight=False,
        )
    if not found:
        console.print("[bold]findings:[/] none above their thresholds (docs/analysis_schema.md)")
        return
    console.print(
        "[bold]findings[/] (causes first, ranked by predicted saving per step; thresholds and formulas in "
        "docs/analysis_schema.md):"
    )
    for k, f in enumerate(found[:limit], 1):
        console.print(f"  {k}. {f['text']}", highlight=False, soft_wrap=True, markup=False)
        if f.get("cause"):
            console.print(f"     cause: {f['cause']}", highlight=False, soft_wrap=True, markup=False)
            if f.get("saving_text"):
                console.print(f"     saving: {_short_saving(f)}", highlight=False, soft_wrap=True, markup=False)
            for dialect in ("rlprof", "verl", "mindspeed"):
                for lv in f.get("levers", {}).get(dialect, []):
                    console.print(
                        f"     lever ({dialect}): {lv['text']}", highlight=False, soft_wrap=True, markup=False
                    )
    if len(found) > limit:
        console.print(f"  ... and {len(found) - limit} more in analysis.json (findings)")
    if plan and plan.get("causes"):
        from ..analyze.diagnosis.plan import plan_text

        console.print(f"  {plan_text(plan)}", highlight=False, soft_wrap=True, markup=False)


def _short_saving(f: dict) -> str:
    """The predicted saving in a few words (its assumption in full: analysis.json, `rlprof advise --fix`)."""
    s = f["saving"]
    if s["status"] != "predicted":
        return f"not predictable from this data: {s['why']}"
    share = share_words(s)
    setting = ", ".join(
        f"{k} {v if not isinstance(v, dict) else next(iter(v.values()))}" for k, v in s["setting"].items()
    )
    cut = (
        f", cutting {s['responses_cut_count']} responses ({s['responses_cut']:.0%}) and {s['tokens_cut']} tokens "
        f"({s['tokens_cut_share']:.0%})"
        if "tokens_cut" in s
        else ""
    )
    return (
        f"{s['saving_ms']:.1f} ms per step{share}"
        + (f" with {setting}{cut}" if setting else "")
        + f" [{s['dialect']}'s first lever; assumes: {s['assumption'].split('; ')[0]}]"
    )


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def memory_lines(doc: dict, limit: int = 4) -> list[str]:
    """Each window's peak allocated memory, and against the device's capacity its use and headroom (or why that
    cannot be said); the caching allocator's reservations where its window recorded them. The largest peaks first."""
    held = sorted((m for m in doc.get("memory", []) if m.get("peak_bytes") is not None), key=lambda m: -m["peak_bytes"])
    lines = []
    for m in held[:limit]:
        where = " ".join(
            str(part)
            for part in (
                f"step {m['step']}" if m.get("step") is not None else None,
                "/".join(str(x) for x in (m.get("role"), m.get("stage")) if x),
                f"rank {m['rank']}" if m.get("rank") is not None else None,
            )
            if part
        )
        device = m.get("device_name") or (f"device {m['device']}" if m.get("device") not in (None, "cpu") else "")
        head = f"memory ({where}{', ' + device if device else ''}): peak {_gib(m['peak_bytes'])} allocated"
        if m.get("capacity_bytes"):
            cap = m["capacity_bytes"]
            line = f"{head} of {_gib(cap)}, {m['peak_bytes'] / cap:.1%} used, headroom {_gib(cap - m['peak_bytes'])}"
        else:
            line = f"{head}; use of the device not measurable: {m.get('capacity_why') or 'no capacity recorded'}"
        if m.get("reserved_bytes"):
            line += f"; the caching allocator held {_gib(m['reserved_bytes'])} reserved"
            if m.get("max_reserved_bytes"):
                line += f" (at most {_gib(m['max_reserved_bytes'])})"
        lines.append(line)
    if len(held) > limit:
        lines.append(f"  ... and {len(held) - limit} more windows' memory in analysis.json (memory)")
    return lines


SAMPLE_STEPS_SAID = 5  # the steps with the longest tails, one line each


def sample_lines(doc: dict) -> list[str]:
    """The rollout's samples per step, where its host recorded them: their time and tokens, the tail, the slowest,
    the phases' shares (and what the host does not record), the preemptions."""
    from .samples import phase_shares, unrecorded_words

    steps = doc.get("sample_steps") or []
    if not steps:
        return []
    said = sorted(steps, key=lambda s: -(s.get("tail_ms") or 0.0))[:SAMPLE_STEPS_SAID]
    out = [
        f"samples: {len(doc['samples'])} over {len(steps)} step(s) (samples.csv); the "
        + (f"{len(said)} with the longest tails:" if len(steps) > len(said) else "steps:")
    ]
    for s in sorted(said, key=lambda s: s["step"]):
        took, tokens = s.get("duration_ms") or {}, s.get("response_tokens") or {}
        line = f"  step {s['step']}: {s['samples']} samples"
        if took:
            line += f", {took['p50']:.1f} ms median / {took['p90']:.1f} p90 / {took['max']:.1f} max"
        if tokens:
            line += f", {tokens['p50']:.0f} tokens median / {tokens['max']:.0f} max"
        if s.get("tail_share") is not None:
            line += f"; tail {s['tail_share']:.0%} of {s['span_ms']:.1f} ms with fewer than half still running"
        if s.get("slowest"):
            line += "; slowest: " + ", ".join(str(x["sample"]) for x in s["slowest"])
        shares = phase_shares(s)
        if shares:
            line += f"; phases {shares}"
        if s.get("preemptions"):
            line += f"; {s['preemptions']} preemptions of {s['preempted_samples']} samples"
        out.append(line)
    missing = unrecorded_words(doc["samples"])
    if missing:
        out.append(f"  ({missing})")
    return out


def account_lines(doc: dict) -> list[str]:
    """The rollout stage split per watched step, where the host timed it and recorded its samples."""
    from .samples import account_line

    account = doc.get("rollout_account") or []
    return (
        ["rollout stage accounted for (rollout_account):"] + ["  " + account_line(a) for a in account]
        if account
        else []
    )


def print_analysis(doc: dict, max_rows: int = 40) -> None:
    console = _console()
    print_findings(console, doc.get("findings", []), measures=doc.get("measures"), plan=doc.get("plan"))
    if doc.get("timeline"):
        from .over_time import print_over_time

        print_over_time(console, doc)
    for line in speed_of_light_lines(doc) + memory_lines(doc) + sample_lines(doc) + account_lines(doc):
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    if not doc["rows"] and not doc["inputs"]:  # a run directory of the watch's timeline and samples only
        return
    if not doc["rows"] and all(i.get("kind") == "memory_snapshot" for i in doc["inputs"]):
        console.print("no time windows: these inputs are memory snapshots (torch_memory records allocations, not time)")
        return
    rows = [r for r in doc["rows"] if r["unit"] is None][:max_rows]
    table = Table(title="time per window (ms)" + ("  [partial input]" if doc["partial"] else ""))
    writers = writers_differ(rows)  # a replica or the driver wrote some: who wrote each row is a column
    for col in ("step", "role", "stage", "rank") + (("writer",) if writers else ()) + BUCKETS:
        table.add_column(col.replace("_ms", ""), justify="right", no_wrap=col == "writer")
    for r in rows:
        table.add_row(
            *(str(r[c]) if r[c] is not None else "-" for c in ("step", "role", "stage", "rank")),
            *((writer_words(r),) if writers else ()),
            *(f"{r[b]:.2f}" for b in BUCKETS),
        )
    console.print(table)
    if not doc["ops"]:
        console.print("no operators in these windows (ranges only, e.g. the markers tool)")
        return
    ops = Table(title="top operators and kernels per stage (self time, summed over steps and ranks)")
    for col in ("stage", "kind", "name", "count", "self ms", "total ms"):
        ops.add_column(col)
    for op in ops_by_stage(doc["ops"])[:15]:
        ops.add_row(
            where(op["role"], op["stage"]),
            op["kind"],
            op["name"][:70],
            str(op["count"]),
            f"{op['self_ms']:.2f}",
            f"{op['total_ms']:.2f}",
        )
    console.print(ops)


def print_cluster(result: dict) -> None:
    console = _console()
    table = Table(title="spread across ranks, per stage (ms per step)")
    for col in ("role", "stage", "ranks", "bucket", "mean", "min", "max", "spread", "cv", "slowest"):
        table.add_column(col, justify="right")
    for s in result["stages"]:
        if s["bucket"] in ("wall", "compute", "comm"):
            table.add_row(
                str(s["role"]),
                str(s["stage"]),
                str(s["ranks"]),
                s["bucket"],
                f"{s['mean_ms']:.2f}",
                f"{s['min_ms']:.2f}",
                f"{s['max_ms']:.2f}",
                f"{s['spread_ms']:.2f}",
                f"{s['cv']:.2f}",
                str(s["max_rank"]),
            )
    console.print(table)
    if not result["slow_ranks"]:
        console.print(
            f"no slow rank: no rank's compute exceeds the others' by {result['threshold']:.0%} "
            "with them waiting for it in collectives"
        )
    for f in result["slow_ranks"]:
        console.print(f"[bold red]slow rank {f['rank']}[/] ({f['role']}/{f['stage']}): {f['evidence']['summary']}")


def print_compare(doc: dict, top: int = 20) -> None:
    from ..compare import partial_lines

    differ = units_differ(doc)
    console = _console(160 if differ else 140)  # two more columns where unit counts differ
    for line in partial_lines(doc):  # first: a damaged side's numbers are lower bounds
        console.print(line, highlight=False, markup=False)
    marks = {side: " (partial)" if doc[side].get("partial") else "" for side in ("baseline", "new")}
    table = Table(
        title=f"per stage: baseline {doc['baseline']['path']}{marks['baseline']} -> new "
        f"{doc['new']['path']}{marks['new']} (ms; bucket columns are the change"
        + ("; per: a window, or one unit where the windows hold different numbers of units)" if differ else ")")
    )
    columns = pivot_columns(doc)
    for col in columns:
        table.add_column(col.replace("_ms", ""), justify="right")
    for line in stage_pivot(doc):
        table.add_row(
            *(
                fmt(
                    line.get(c),
                    signed=c not in ("baseline_ms", "new_ms", "ratio") and c not in ("step", "role", "stage"),
                )
                for c in columns
            )
        )
    console.print(table)
    for u in differ:  # per window: the counts, the per-unit times and spread, and what is compared
        console.print(u["note"], highlight=False, markup=False)
    changed = [o for o in doc["ops"] if o["status"] != "same"][:top]
    columns = op_columns(doc)
    ops = Table(
        title=f"operators and kernels that moved (top {len(changed)} of "
        f"{sum(o['status'] != 'same' for o in doc['ops'])}, ms per window"
        + ("; per a unit where the per column says)" if "per" in columns else ")")
    )
    for col in columns:
        ops.add_column(col.replace("_ms", ""))
    for o in changed:
        ops.add_row(*(fmt(o.get(c), signed=c == "diff_ms") if c != "name" else o[c][:80] for c in columns))
    console.print(ops)
    colls = [c for c in doc["collectives"] if c["status"] != "same"][:10]
    if colls:
        t = Table(title="collectives (ms per window)")
        keys = ("status", "role", "stage", "name", "baseline_ms", "new_ms", "diff_ms")
        for col in keys:
            t.add_column(col.replace("_ms", ""))
        for c in colls:
            t.add_row(*(fmt(c[k], signed=k == "diff_ms") for k in keys))
        console.print(t)
    for m in doc["memory"]:
        console.print(
            f"memory peak {m['role']}/{m['stage']}: {fmt(m['baseline_peak_mb'])} MB -> "
            f"{fmt(m['new_peak_mb'])} MB ({fmt(m['diff_mb'], True)} MB)"
        )
    for u in doc["unmatched"]:
        console.print(f"only in {u['side']}: {window_label(u['step'], u['role'], u['stage'])}")


def print_advice(result: dict, plan_text: str) -> None:
    console = _console()
    metrics = result.get("metrics")
    if metrics:  # advice from step metrics alone: what they say first
        console.print(
            f"step metrics ({metrics['format']}), steps {metrics['steps'][0]}-{metrics['steps'][-1]}, mean "
            f"step {metrics['mean_step_s']:.3f} s:",
            highlight=False,
            markup=False,
        )
        for s in metrics["stages"][:6]:
            console.print(f"  {s['stage']:<24} {s['mean_s']:9.3f} s  {s['share']:5.0%}", highlight=False, markup=False)
        if metrics.get("busy"):
            console.print(
                "  busy machine: step(s) "
                + ", ".join(
                    f"{b['step']} (other processes used {b['external_share']:.0%} of the CPUs; {b['wait_share']:.0%} of "
                    "runnable time waiting for a core)"
                    for b in metrics["busy"]
                )
                + " left out of the means and outliers",
                highlight=False,
                markup=False,
            )
        for o in metrics["outliers"]:
            where = (
                f"{o['stage']} +{o['stage_extra_s']:.3f} s"
                if o["stage"]
                else "most of the extra time is outside the timed stages"
            )
            console.print(
                f"  outlier: step {o['step']} took {o['step_s']:.3f} s (median {o['median_step_s']:.3f} s); {where}",
                highlight=False,
                markup=False,
            )
        for t in metrics["trends"]:
            console.print(
                f"  trend: {t['stage']} grows with {t['with'].replace('_', ' ')} (r = {t['r']:.2f})",
                highlight=False,
                markup=False,
            )
    console.print("why:", highlight=False, markup=False)
    for reason in result["reasons"]:
        console.print(f"  - {reason}", highlight=False, soft_wrap=True, markup=False)
    console.print(f"sizes from: {'; '.join(result['size_sources'])}", highlight=False, soft_wrap=True, markup=False)
    console.print(plan_text, highlight=False, soft_wrap=True, markup=False)
    for w in result["windows"]:
        console.print(
            f"predicted: {w['role']}/{w['stage']} step {w['steps']}: {w['bytes'] / 1e6:.3f} MB per rank ({w['how']})",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
    console.print(
        f"predicted total: {result['predicted_bytes'] / 1e6:.3f} MB over {len(result['target']['ranks'])} rank(s)",
        highlight=False,
        markup=False,
    )


def print_check(result: dict) -> None:
    console = _console()
    ratio = f"{result['ratio']:.2f}x" if result["ratio"] is not None else "-"
    console.print(
        f"predicted {result['predicted_bytes'] / 1e6:.3f} MB, actual {result['actual_bytes'] / 1e6:.3f} MB "
        f"({ratio} of the prediction) over {len(result['windows'])} window(s)",
        highlight=False,
        markup=False,
    )
    for w in result["windows"]:
        console.print(
            f"  step {w['step']} {w['role']}/{w['stage']} rank {w['rank']}: {w['bytes'] / 1e6:.3f} MB ({w['status']})",
            highlight=False,
            markup=False,
        )
    for note in result["notes"]:
        console.print(f"-> {note}", highlight=False, soft_wrap=True, markup=False)


def print_fix(result: dict) -> None:
    """`rlprof advise --fix`: the cause, the lever with its value, the predicted saving and what it assumes."""
    console = _console()
    for line in result.get("skipped", []):
        console.print(f"passed over: {line}", highlight=False, soft_wrap=True, markup=False)
    fx = result["fix"]
    if fx is None:
        console.print(f"no fix: {result['reason']}", highlight=False, soft_wrap=True, markup=False)
        return
    from ..analyze.diagnosis.sentences import saving_text

    what = f"plan: {', '.join(fx['causes'])}" if fx["cause"] == "plan" else f"cause: {fx['cause']}"
    console.print(
        f"{what} ({', '.join(str(x) for x in fx['stages'])}): {fx['finding']}",
        highlight=False,
        soft_wrap=True,
        markup=False,
    )
    for text in fx["levers"]:
        console.print(f"lever ({fx['dialect']}): {text}", highlight=False, soft_wrap=True, markup=False)
    from ..advise import overrides_line

    console.print(f"fix: {overrides_line(fx['overrides'])}", highlight=False, soft_wrap=True, markup=False)
    console.print(saving_text(fx["saving"]), highlight=False, soft_wrap=True, markup=False)

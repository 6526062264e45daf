"""The run over time (the document's `timeline`, analyze/over_time/timeline.py): one chart of stage time per step with the
captures marked, the flagged spikes, drift and stragglers as a list, and the same in the terminal."""

from __future__ import annotations

from ..analyze.diagnosis.sentences import why_sentence
from .charts import STAGE_COLORS, _layout, esc


def stage_time_chart(timeline: dict) -> dict | None:
    """Stage time per step (the slowest rank's), one line per stage, the step dashed; captures and spikes marked."""
    steps = timeline["steps"]
    if not steps:
        return None
    traces = []
    kind = "scattergl" if len(steps) * len(timeline["per_step"]) > 50_000 else "scatter"  # WebGL only when large
    for name, series in timeline["per_step"].items():
        traces.append(
            {
                "type": kind,
                "mode": "lines",
                "name": esc(name),
                "x": steps,
                "y": series["max"],
                "line": {
                    "color": STAGE_COLORS.get(name, "#444444"),
                    "width": 1.5,
                    **({"dash": "dot"} if name == "step" else {}),
                },
                "hovertemplate": f"step %{{x}} {esc(name)}: %{{y:.3f}} s (slowest rank)<extra></extra>",
            }
        )
    at = {s: i for i, s in enumerate(steps)}

    def y_of(step, stage):
        series = timeline["per_step"].get(stage) or timeline["per_step"]["step"]
        i = at.get(step)
        return series["max"][i] if i is not None else None

    caps = timeline.get("captures") or []
    if caps:
        traces.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": "captured",
                "x": [c["step"] for c in caps],
                "y": [y_of(c["step"], c["trigger"].get("stage") if c["stage"] == "e2e" else c["stage"]) for c in caps],
                "marker": {"symbol": "star", "size": 14, "color": "#000000"},
                "text": [
                    esc(
                        f"rank {c['rank']} {c['role']}/{c['stage']}: {c['trigger'].get('reason')} "
                        f"(seen at step {c['trigger'].get('step')} in {c['trigger'].get('stage')})"
                    )
                    for c in caps
                ],
                "hovertemplate": "step %{x}: %{text}<extra></extra>",
            }
        )
    spikes = timeline.get("spikes") or []
    if spikes:
        traces.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": "spike",
                "x": [s["step"] for s in spikes],
                "y": [s["seconds"] for s in spikes],
                "marker": {"symbol": "circle-open", "size": 11, "color": "#e45756"},
                "text": [esc(f"{s['stage']} {s['seconds']:.3f} s vs {s['baseline_seconds']:.3f} s") for s in spikes],
                "hovertemplate": "step %{x}: %{text}<extra></extra>",
            }
        )
    shifts = timeline.get("level_shifts") or []
    if shifts:
        traces.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": "level shift",
                "x": [s["from_step"] for s in shifts],
                "y": [s["after_seconds"] for s in shifts],
                "marker": {"symbol": "triangle-up", "size": 13, "color": "#f58518"},
                "text": [
                    esc(f"{s['stage']} from {s['before_seconds']:.3f} s to {s['after_seconds']:.3f} s and stayed")
                    for s in shifts
                ],
                "hovertemplate": "from step %{x}: %{text}<extra></extra>",
            }
        )
    # grey: a busy machine; blue: the plan's own profiled steps (the profiler's cost is in them): neither is judged
    flagged = [(s, "#cccccc") for s in (timeline.get("busy_steps") or [])[:500]]
    flagged += [(s, "#9ecae1") for s in (timeline.get("profiled_steps") or [])[:500]]
    shapes = [
        {
            "type": "rect",
            "xref": "x",
            "yref": "paper",
            "x0": s - 0.5,
            "x1": s + 0.5,
            "y0": 0,
            "y1": 1,
            "fillcolor": colour,
            "opacity": 0.3,
            "line": {"width": 0},
        }
        for s, colour in flagged
    ]
    return {
        "data": traces,
        "layout": _layout(
            "Stage time per step (slowest rank); stars: captures, circles: spikes, triangles: level shifts, grey: busy"
            " machine, blue: profiled by the plan",
            shapes=shapes,
            xaxis={"title": {"text": "step"}},
            yaxis={"title": {"text": "seconds"}},
            margin={"l": 70},
            height=460,
        ),
    }


def flagged_lines(timeline: dict) -> list[str]:
    """One sentence per flagged straggler, level shift, drift, spike and capture (plain text; the caller escapes)."""
    out = []
    for s in timeline.get("stragglers", []):
        out.append(
            f"straggler: rank {s['rank']} in {s['stage']} at {s['steps']} steps from step {s['first_step']} "
            f"(x{s['median_ratio']:.2f} the other ranks' median)"
            + (
                f"; cause: contention, it waited {s['run_wait_ms']:.0f} ms a step for a core there, "
                f"{s['expected_wait_ms']:.0f} at the other ranks' share{_others(s)}"
                if s.get("cause") == "contention"
                else ""
            )
        )
    for c in timeline.get("contention", []):
        who = "every rank alike (the whole machine)" if c["every_rank"] else f"rank {c['ranks'][0]}"
        steps = c["steps"]
        listed = ", ".join(map(str, steps[:8])) + (f" and {len(steps) - 8} more" if len(steps) > 8 else "")
        wait = (
            f": {c['run_wait_ms']:.0f} ms a step waiting for a core there ({c['expected_wait_ms']:.0f} at the usual "
            f"share){_others(c)}"
            if c.get("run_wait_ms") is not None
            else ""
        )
        out.append(
            f"contention: step(s) {listed} slow by {c['excess_seconds']:.3f} s (median) in "
            f"{', '.join(c['stages'])} on a busy machine, {who}{wait}: the machine's load, not the job's"
        )
    for s in timeline.get("level_shifts", []):
        out.append(
            f"level shift: {s['stage']} went from {s['before_seconds']:.3f} s to {s['after_seconds']:.3f} s at step "
            f"{s['from_step']} and stayed ({s['steps']} judged steps since; slowest rank {s['rank']} there)"
            + (f": {why_sentence(s['why'])}" if s.get("why") else "")
        )
    for d in timeline.get("drift", []):
        out.append(
            f"drift: {d['stage']} went from {d['first_seconds']:.3f} s to {d['last_seconds']:.3f} s "
            "(first quarter vs last quarter of the judged steps)"
            + (f": {why_sentence(d['why'])}" if d.get("why") else "")
        )
    spikes = timeline.get("spikes", [])
    for s in spikes[:10]:
        out.append(
            f"spike: step {s['step']} {s['stage']} {s['seconds']:.3f} s vs a median of "
            f"{s['baseline_seconds']:.3f} s (slowest rank {s['rank']})"
            + (f": {why_sentence(s['why'])}" if s.get("why") else "")
        )
    if len(spikes) > 10:
        out.append(f"... and {len(spikes) - 10} more spikes")
    for c in timeline.get("captures", []):
        t = c["trigger"]
        out.append(
            f"captured: step {c['step']} rank {c['rank']} {c['role']}/{c['stage']} ({c['path']}): "
            f"{t.get('reason')} at step {t.get('step')} in {t.get('stage')}"
            + (
                f", {t['seconds']:.3f} s vs {t['baseline_seconds']:.3f} s"
                if t.get("seconds") is not None and t.get("baseline_seconds") is not None
                else ""
            )
        )
    return out


def _others(record: dict) -> str:
    share = record.get("others_share")
    return f", other processes used {share:.0%} of the host" if share is not None else ""


def summary_line(timeline: dict) -> str:
    return (
        f"run over time: {len(timeline['steps'])} watched steps x {len(timeline['ranks'])} rank(s), "
        f"{len(timeline['busy_steps'])} busy, {len(timeline['captures'])} captured window(s)"
        + (
            f", {len(timeline['profiled_steps'])} step(s) profiled by the plan"
            if timeline.get("profiled_steps")
            else ""
        )
    )


def over_time_html(doc: dict) -> str:
    timeline = doc["timeline"]
    lines = flagged_lines(timeline) or [
        "nothing flagged: no spike, drift or straggler by the rules in docs/analysis_schema.md"
    ]
    lines += beside_lines(captures_beside(doc))
    return (
        f'<p class="note">{esc(summary_line(timeline))}</p><ul>'
        + "".join(f"<li>{esc(line)}</li>" for line in lines)
        + "</ul>"
    )


def print_over_time(console, doc: dict) -> None:
    timeline = doc["timeline"]
    console.print(summary_line(timeline))
    lines = flagged_lines(timeline) or ["nothing flagged (no spike, drift or straggler)"]
    for line in lines + beside_lines(captures_beside(doc)):
        console.print("  " + line, markup=False, highlight=False, soft_wrap=True)


def captures_beside(doc: dict) -> list[dict]:
    """The document's `timeline.beside` (analyze/over_time/beside.py); computed here for an analysis.json written before it."""
    timeline = doc.get("timeline") or {}
    if "beside" in timeline:
        return timeline["beside"]
    from ..analyze.over_time.beside import captures_beside as compute

    return compute(doc)


def beside_lines(items: list[dict]) -> list[str]:
    """Per capture: what grew beside its normal window, then its cause with the lever and predicted saving."""
    out = []
    for it in items:
        if it["normal"] is None:
            out.append(f"{it['capture']} ({it['stage']}): {it['why']}")
        else:
            b = it["buckets"]
            grew = ", ".join(f"{g['name'][:40]} +{g['diff_ms']:.1f} ms" for g in it["grew"][:3]) or "no operator grew"
            out.append(
                f"{it['capture']} ({it['stage']}) beside {it['normal']} ({it['why']}): wall "
                f"{b['wall_ms']['normal_ms']:.1f} -> {b['wall_ms']['captured_ms']:.1f} ms, compute "
                f"{b['compute_ms']['normal_ms']:.1f} -> {b['compute_ms']['captured_ms']:.1f}, comm "
                f"{b['comm_ms']['normal_ms']:.1f} -> {b['comm_ms']['captured_ms']:.1f}, idle "
                f"{b['idle_ms']['normal_ms']:.1f} -> {b['idle_ms']['captured_ms']:.1f}; grew: {grew}"
            )
        out += cause_lines(it.get("cause"))
    return out


def cause_lines(cause: dict | None) -> list[str]:
    """The verdict in one line, then each cause's first lever per dialect and its predicted saving."""
    if not cause:
        return []
    out = [f"  cause: {cause['text']}"]
    for c in cause["causes"]:
        for dialect in ("rlprof", "verl", "mindspeed"):
            levers = c["levers"].get(dialect) or []
            if levers:
                out.append(f"    {c['cause']} lever ({dialect}): {levers[0]['text']}")
        if c.get("saving_text"):
            out.append(f"    {c['cause']} {_short(c)}")
    return out


def _short(c: dict) -> str:
    s = c["saving"] or {}
    if s.get("status") != "predicted":
        return c["saving_text"]
    share = f" ({s['saving_share']:.0%} of the captured step)" if s.get("saving_share") is not None else ""
    setting = ", ".join(
        f"{k} {v if not isinstance(v, dict) else next(iter(v.values()))}" for k, v in (s.get("setting") or {}).items()
    )
    return (
        f"predicted saving {s['saving_ms']:.1f} ms in this step{share}"
        + (f" with {setting}" if setting else "")
        + f" [{s.get('dialect')}'s first lever; assumes: {s['assumption'].split('; ')[0]}]"
    )

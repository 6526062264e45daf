"""The run over time (the document's `timeline`, analyze/timeline.py): one chart of stage time per step with the
captures marked, the flagged spikes, drift and stragglers as a list, and the same in the terminal."""

from __future__ import annotations

from .charts import STAGE_COLORS, _layout, esc


def stage_time_chart(timeline: dict) -> dict | None:
    """Stage time per step (the slowest rank's), one line per stage, the step dashed; captures and spikes marked."""
    steps = timeline["steps"]
    if not steps:
        return None
    traces = []
    kind = "scattergl" if len(steps) * len(timeline["per_step"]) > 50_000 else "scatter"  # WebGL only when large
    for name, series in timeline["per_step"].items():
        traces.append({"type": kind, "mode": "lines", "name": esc(name), "x": steps, "y": series["max"],
                       "line": {"color": STAGE_COLORS.get(name, "#444444"), "width": 1.5,
                                **({"dash": "dot"} if name == "step" else {})},
                       "hovertemplate": f"step %{{x}} {esc(name)}: %{{y:.3f}} s (slowest rank)<extra></extra>"})
    at = {s: i for i, s in enumerate(steps)}

    def y_of(step, stage):
        series = timeline["per_step"].get(stage) or timeline["per_step"]["step"]
        i = at.get(step)
        return series["max"][i] if i is not None else None

    caps = timeline.get("captures") or []
    if caps:
        traces.append({"type": "scatter", "mode": "markers", "name": "captured",
                       "x": [c["step"] for c in caps],
                       "y": [y_of(c["step"], c["trigger"].get("stage") if c["stage"] == "e2e" else c["stage"])
                             for c in caps],
                       "marker": {"symbol": "star", "size": 14, "color": "#000000"},
                       "text": [esc(f"rank {c['rank']} {c['role']}/{c['stage']}: {c['trigger'].get('reason')} "
                                    f"(seen at step {c['trigger'].get('step')} in {c['trigger'].get('stage')})")
                                for c in caps],
                       "hovertemplate": "step %{x}: %{text}<extra></extra>"})
    spikes = timeline.get("spikes") or []
    if spikes:
        traces.append({"type": "scatter", "mode": "markers", "name": "spike",
                       "x": [s["step"] for s in spikes], "y": [s["seconds"] for s in spikes],
                       "marker": {"symbol": "circle-open", "size": 11, "color": "#e45756"},
                       "text": [esc(f"{s['stage']} {s['seconds']:.3f} s vs {s['baseline_seconds']:.3f} s")
                                for s in spikes],
                       "hovertemplate": "step %{x}: %{text}<extra></extra>"})
    busy = timeline.get("busy_steps") or []
    shapes = [{"type": "rect", "xref": "x", "yref": "paper", "x0": s - 0.5, "x1": s + 0.5, "y0": 0, "y1": 1,
               "fillcolor": "#cccccc", "opacity": 0.3, "line": {"width": 0}} for s in busy[:500]]
    return {"data": traces, "layout": _layout("Stage time per step (slowest rank); stars: captures, circles: "
                                              "spikes, grey: busy machine", shapes=shapes,
                                              xaxis={"title": {"text": "step"}},
                                              yaxis={"title": {"text": "seconds"}}, margin={"l": 70}, height=460)}


def flagged_lines(timeline: dict) -> list[str]:
    """One sentence per flagged spike, drift, straggler and capture (plain text; the caller escapes)."""
    out = []
    for s in timeline.get("stragglers", []):
        out.append(f"straggler: rank {s['rank']} in {s['stage']} at {s['steps']} steps from step {s['first_step']} "
                   f"(x{s['median_ratio']:.2f} the other ranks' median)")
    for d in timeline.get("drift", []):
        out.append(f"drift: {d['stage']} went from {d['first_seconds']:.3f} s to {d['last_seconds']:.3f} s "
                   "(first quarter vs last quarter of the judged steps)")
    spikes = timeline.get("spikes", [])
    for s in spikes[:10]:
        out.append(f"spike: step {s['step']} {s['stage']} {s['seconds']:.3f} s vs a median of "
                   f"{s['baseline_seconds']:.3f} s (slowest rank {s['rank']})")
    if len(spikes) > 10:
        out.append(f"... and {len(spikes) - 10} more spikes")
    for c in timeline.get("captures", []):
        t = c["trigger"]
        out.append(f"captured: step {c['step']} rank {c['rank']} {c['role']}/{c['stage']} ({c['path']}): "
                   f"{t.get('reason')} at step {t.get('step')} in {t.get('stage')}"
                   + (f", {t['seconds']:.3f} s vs {t['baseline_seconds']:.3f} s"
                      if t.get("seconds") is not None and t.get("baseline_seconds") is not None else ""))
    return out


def summary_line(timeline: dict) -> str:
    return (f"run over time: {len(timeline['steps'])} watched steps x {len(timeline['ranks'])} rank(s), "
            f"{len(timeline['busy_steps'])} busy, {len(timeline['captures'])} captured window(s)")


def over_time_html(doc: dict) -> str:
    timeline = doc["timeline"]
    lines = flagged_lines(timeline) or ["nothing flagged: no spike, drift or straggler by the rules in "
                                        "docs/analysis_schema.md"]
    lines += beside_lines(captures_beside(doc))
    return (f'<p class="note">{esc(summary_line(timeline))}</p><ul>'
            + "".join(f"<li>{esc(line)}</li>" for line in lines) + "</ul>")


def print_over_time(console, doc: dict) -> None:
    timeline = doc["timeline"]
    console.print(summary_line(timeline))
    lines = flagged_lines(timeline) or ["nothing flagged (no spike, drift or straggler)"]
    for line in lines + beside_lines(captures_beside(doc)):
        console.print("  " + line, markup=False, highlight=False)


def _normal_for(cap: dict, captures: list[dict]) -> tuple[dict | None, str]:
    """The normal window a capture is put beside: for a straggler, the healthy rank captured at the same step;
    else the latest earlier window of the same role and window stage on the same rank that no trigger flagged
    (a `baseline` capture or a step listed in global_profiler.steps)."""
    t = cap["trigger"]
    if t.get("reason") == "straggler" and cap["rank"] == t.get("rank"):
        same = [c for c in captures if c["step"] == cap["step"] and c["rank"] != cap["rank"]
                and c["stage"] == cap["stage"]]
        if same:
            return same[0], f"rank {same[0]['rank']} at the same step"
    return None, ""


def captures_beside(doc: dict) -> list[dict]:
    """Each captured window beside a normal window of the same stage: per bucket the two times, and the operators
    that grew most (compare.py's matching by name). The stage compared is the one the trigger saw slow (within an
    end-to-end window, its range); the step when the trigger judged the whole step."""
    from ..compare import _status

    timeline = doc.get("timeline") or {}
    captures = [c for c in timeline.get("captures", []) if c["trigger"].get("reason") != "baseline"]
    if not captures:
        return []
    normal_files = {}  # (rank, stage) -> {(step, file)} of windows no trigger flagged as slow
    flagged = {c["path"] for c in captures}
    for r in doc["rows"]:
        if r.get("unit") is None and r.get("file") not in flagged:
            normal_files.setdefault((r.get("rank"), r.get("stage")), set()).add((r.get("step"), r.get("file")))
            if "_e2e_" in str(r.get("file")):
                normal_files.setdefault((r.get("rank"), "step"), set()).add((r.get("step"), r.get("file")))
    out = []
    for cap in captures:
        t = cap["trigger"]
        if t.get("reason") == "straggler" and cap["rank"] != t.get("rank"):
            continue  # the healthy rank captured beside the straggler: it is the normal window
        stage = t.get("stage")
        normal, why = _normal_for(cap, captures)
        if normal is not None:
            base_file = normal["path"]
        else:
            earlier = sorted(f for f in normal_files.get((cap["rank"], stage), ())
                             if f[0] is not None and f[0] < cap["step"])
            if not earlier:
                out.append({"capture": cap["path"], "stage": stage, "normal": None,
                            "why": "no normal window of this stage on this rank to put it beside (set "
                                   "global_profiler.trigger.baseline: true, or list a normal step in steps)"})
                continue
            base_file, why = earlier[-1][1], f"step {earlier[-1][0]} on the same rank"

        def rows_of(file, stage=stage):
            rs = [r for r in doc["rows"] if r.get("file") == file and r.get("unit") is None]
            picked = [r for r in rs if r.get("stage") == stage]
            return picked or rs

        new, base = rows_of(cap["path"]), rows_of(base_file)
        buckets = {b: (sum(r[b] for r in base), sum(r[b] for r in new))
                   for b in ("wall_ms", "compute_ms", "comm_ms", "idle_ms")}
        ops_new, ops_base = {}, {}
        for op in doc["ops"]:
            side = ops_new if op.get("file") == cap["path"] else ops_base if op.get("file") == base_file else None
            if side is not None and (op.get("stage") in (stage, "e2e") or stage == "step"):
                key = (op["kind"], op["name"])
                side[key] = side.get(key, 0.0) + (op["self_ms"] if op["kind"] == "cpu_op" else op["total_ms"])
        grew = sorted(({"kind": k[0], "name": k[1], "normal_ms": ops_base.get(k, 0.0), "captured_ms": ops_new.get(k, 0.0),
                        "diff_ms": ops_new.get(k, 0.0) - ops_base.get(k, 0.0),
                        "status": _status(ops_base.get(k, 0.0), ops_new.get(k, 0.0),
                                          ops_new.get(k, 0.0) - ops_base.get(k, 0.0))}
                       for k in set(ops_new) | set(ops_base)), key=lambda o: -o["diff_ms"])[:5]
        out.append({"capture": cap["path"], "stage": stage, "normal": base_file, "why": why,
                    "buckets": {b: {"normal_ms": v[0], "captured_ms": v[1]} for b, v in buckets.items()},
                    "grew": [g for g in grew if g["diff_ms"] > 0]})
    return out


def beside_lines(items: list[dict]) -> list[str]:
    out = []
    for it in items:
        if it["normal"] is None:
            out.append(f"{it['capture']} ({it['stage']}): {it['why']}")
            continue
        b = it["buckets"]
        grew = ", ".join(f"{g['name'][:40]} +{g['diff_ms']:.1f} ms" for g in it["grew"][:3]) or "no operator grew"
        out.append(f"{it['capture']} ({it['stage']}) beside {it['normal']} ({it['why']}): wall "
                   f"{b['wall_ms']['normal_ms']:.1f} -> {b['wall_ms']['captured_ms']:.1f} ms, compute "
                   f"{b['compute_ms']['normal_ms']:.1f} -> {b['compute_ms']['captured_ms']:.1f}, comm "
                   f"{b['comm_ms']['normal_ms']:.1f} -> {b['comm_ms']['captured_ms']:.1f}, idle "
                   f"{b['idle_ms']['normal_ms']:.1f} -> {b['idle_ms']['captured_ms']:.1f}; grew: {grew}")
    return out

"""The run over time (the document's `timeline`, analyze/over_time/timeline.py): one chart of stage time per step with the
captures marked, the flagged spikes, drift and stragglers as a list, and the same in the terminal."""

from __future__ import annotations

import numpy as np

from ..analyze.diagnosis.sentences import held_off_words, samples_sentence, why_sentence
from .charts import STAGE_COLORS, _layout, esc


COLUMNS = 1500  # pixel columns of a wide plot: a line keeps its min and max step in each (what a screen can show)


def screen_points(values: list, keep: np.ndarray) -> np.ndarray:
    """The indices of a line's points drawn: where it has more than 2 x COLUMNS, its lowest and highest step in
    each of COLUMNS equal runs of steps (a spike, a dip and every level stay as drawn at full scale), a null (the
    line's gap) in each run that holds one, and every index of `keep` (the steps marked: spikes, shifts, captures,
    busy and profiled steps), in order; else all of them."""
    n = len(values)
    if n <= 2 * COLUMNS:
        return np.arange(n)
    y = np.array([np.nan if v is None else v for v in values], float)
    column = np.arange(n) * COLUMNS // n
    missing = np.isnan(y)
    firsts = []
    for key in (np.where(missing, np.inf, y), -np.where(missing, -np.inf, y), (~missing).astype(float)):
        order = np.lexsort((key, column))  # by column, then lowest key first
        firsts.append(order[np.r_[0, np.flatnonzero(np.diff(column[order])) + 1]])
    low, high, gap = firsts
    return np.unique(np.concatenate([low[~missing[low]], high[~missing[high]], gap[missing[gap]], keep]))


def _marked(timeline: dict) -> np.ndarray:
    """The indices of the steps the chart marks: each is drawn exactly, whatever the reduction."""
    at = {s: i for i, s in enumerate(timeline["steps"])}
    steps = [s["step"] for s in timeline.get("spikes") or []] + [c["step"] for c in timeline.get("captures") or []]
    steps += [s["from_step"] for s in timeline.get("level_shifts") or []]
    steps += list(timeline.get("busy_steps") or []) + list(timeline.get("profiled_steps") or [])
    return np.array(sorted({at[s] for s in steps if s in at}), int)


def _runs(steps: list[int]) -> list[tuple[int, int]]:
    """Consecutive steps as (first, last) runs."""
    out: list[tuple[int, int]] = []
    for s in sorted(set(steps)):
        if out and s == out[-1][1] + 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


def _band(name: str, steps: list[int], colour: str, height: float) -> dict | None:
    """Flagged steps as a band along the plot's foot (its own axis, 0..1): each run of steps one thick segment, its
    ends marked so that a single step shows at any scale; its hover names the run."""
    runs = _runs(steps)
    if not runs:
        return None
    x, y, text = [], [], []
    for a, b in runs:
        words = esc(f"step {a}: {name}" if a == b else f"steps {a}-{b}: {name}")
        x += [a - 0.5, b + 0.5, None]
        y += [height, height, None]
        text += [words, words, None]
    return {
        "type": "scatter",
        "mode": "lines+markers",
        "name": name,
        "x": x,
        "y": y,
        "yaxis": "y2",
        "line": {"color": colour, "width": 8},
        "marker": {"color": colour, "size": 5, "symbol": "line-ns-open"},
        "text": text,
        "hovertemplate": "%{text}<extra></extra>",
    }


def stage_time_chart(timeline: dict) -> dict | None:
    """Stage time per step (the slowest rank's), one line per stage, the step dashed, each reduced to what a
    screen shows (`screen_points`) and drawn as SVG (a browser without WebGL shows it); captures, spikes and level
    shifts marked, busy and profiled steps as bands along the foot."""
    steps = timeline["steps"]
    if not steps:
        return None
    traces = []
    keep = _marked(timeline)
    drawn = 0
    for name, series in timeline["per_step"].items():
        idx = screen_points(series["max"], keep)
        drawn = max(drawn, len(idx))
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": esc(name),
                "x": [steps[i] for i in idx],
                "y": [series["max"][i] for i in idx],
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
    traces += [
        band
        for band in (
            _band("busy machine (not judged)", timeline.get("busy_steps") or [], "#bbbbbb", 0.015),
            _band("profiled by the plan (not judged)", timeline.get("profiled_steps") or [], "#9ecae1", 0.045),
        )
        if band is not None
    ]
    reduced = (
        f"<br>each line: its lowest and highest step per pixel column, and every step marked ({drawn:,} of "
        f"{len(steps):,} steps drawn)"
        if drawn < len(steps)
        else ""
    )
    return {
        "data": traces,
        "layout": _layout(
            "Stage time per step (slowest rank); stars: captures, circles: spikes, triangles: level shifts; at the"
            " foot: busy (grey), profiled (blue)" + reduced,
            xaxis={"title": {"text": "step"}},
            yaxis={"title": {"text": "seconds"}},
            yaxis2={"overlaying": "y", "range": [0, 1], "visible": False, "fixedrange": True},
            margin={"l": 70, "t": 130},
            height=500,
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
            + (f": {held}" if (held := held_off_words(t)) else "")
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
    lines += beside_lines(captures_beside(doc), timeline.get("captures", []))
    return f'<p class="note">{esc(summary_line(timeline))}</p><ul>' + "".join(_item(line) for line in lines) + "</ul>"


def _item(line: str) -> str:
    """A line as a list item, its indent (what it belongs to, as the terminal shows it) kept."""
    depth = (len(line) - len(line.lstrip(" "))) // 2
    return f'<li style="margin-left:{1.5 * depth}em">{esc(line.strip())}</li>' if depth else f"<li>{esc(line)}</li>"


def print_over_time(console, doc: dict) -> None:
    timeline = doc["timeline"]
    console.print(summary_line(timeline))
    lines = flagged_lines(timeline) or ["nothing flagged (no spike, drift or straggler)"]
    for line in lines + beside_lines(captures_beside(doc), timeline.get("captures", [])):
        console.print("  " + line, markup=False, highlight=False, soft_wrap=True)


def captures_beside(doc: dict) -> list[dict]:
    """The document's `timeline.beside` (analyze/over_time/beside.py); computed here for an analysis.json written before it."""
    timeline = doc.get("timeline") or {}
    if "beside" in timeline:
        return timeline["beside"]
    from ..analyze.over_time.beside import captures_beside as compute

    return compute(doc)


def beside_lines(items: list[dict], captures: list[dict] = ()) -> list[str]:
    """Per capture, step by step: the step the trigger saw slow and why (its samples where recorded), then the
    captured step: whether it repeated the spike, its samples, what grew beside its normal window, and its cause
    with the lever and predicted saving."""
    triggers = {c["path"]: c["trigger"] for c in captures}
    out = []
    for it in items:
        out += step_lines(it, triggers.get(it["capture"]) or {})
        if it["normal"] is None:
            out.append(f"  step {it['step']}'s window ({it['stage']}): {it['why']}")
        else:
            b = it["buckets"]
            grew = ", ".join(f"{g['name'][:40]} +{g['diff_ms']:.1f} ms" for g in it["grew"][:3]) or "no operator grew"
            out.append(
                f"  step {it['step']}'s window ({it['stage']}) beside {it['normal']} ({it['why']}): wall "
                f"{b['wall_ms']['normal_ms']:.1f} -> {b['wall_ms']['captured_ms']:.1f} ms, compute "
                f"{b['compute_ms']['normal_ms']:.1f} -> {b['compute_ms']['captured_ms']:.1f}, comm "
                f"{b['comm_ms']['normal_ms']:.1f} -> {b['comm_ms']['captured_ms']:.1f}, idle "
                f"{b['idle_ms']['normal_ms']:.1f} -> {b['idle_ms']['captured_ms']:.1f}; grew: {grew}"
            )
        out += cause_lines(it.get("cause"))
    return out


BASIS_WORDS = {
    "workload": "the longest sample's workload x{captured_ratio:.2f} its baseline's, against the spike's "
    "x{spike_ratio:.2f}",
    "normal_window": "its window's wall time x{captured_ratio:.2f} the normal window's, against the spike's "
    "x{spike_ratio:.2f} its baseline",
}


def step_lines(it: dict, trigger: dict) -> list[str]:
    """A capture said step by step: the spike's own step (what the trigger saw, its samples and why), then the
    captured step (its window, whether it repeated the spike, its own samples)."""
    said, repeat = it.get("samples") or {}, it.get("repeat") or {}
    spike = said.get("spike")
    seen = trigger.get("step")
    out = []
    if seen is not None and seen != it["step"]:
        line = f"step {seen}: the {trigger.get('reason')} step the trigger saw"
        if trigger.get("seconds") is not None and trigger.get("baseline_seconds") is not None:
            line += (
                f" ({trigger.get('stage')} {trigger['seconds']:.3f} s against a baseline of "
                f"{trigger['baseline_seconds']:.3f} s, rank {trigger.get('rank')})"
            )
        if held_off_words(trigger):
            line += ": " + held_off_words(trigger)
        if spike:  # its why without the cause and levers the spike's own line and the verdict say
            why = {k: v for k, v in (spike.get("why") or {}).items() if k not in ("cause", "levers")}
            line += ": " + "; ".join(x for x in (why_sentence(why) if why else "", samples_sentence(spike, False)) if x)
        out.append(line)
    line = f"step {it['step']}: captured ({it['capture']})"
    if seen is not None and seen != it["step"]:
        if repeat.get("repeated") is False:
            line += (
                f", an ordinary step: the spike of step {seen} did not repeat ("
                + BASIS_WORDS[repeat["basis"]].format(**repeat)
                + f"); the spike's own samples are step {seen}'s"
                + (" (above, and the report's lanes of that step)" if spike else "")
            )
        elif repeat.get("repeated"):
            line += ", the spike repeated (" + BASIS_WORDS[repeat["basis"]].format(**repeat) + ")"
        elif repeat:
            line += (
                ", whether the spike repeated cannot be told (no normal window, no samples' workload to judge it on)"
            )
    elif trigger.get("reason"):
        line += f", {trigger['reason']}" + (f" at this step in {trigger['stage']}" if trigger.get("stage") else "")
    if said.get("samples"):
        own = samples_sentence(said, why=seen is None or seen == it["step"] or not spike)
        line += "; " + own
    out.append(line)
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

"""The rollout, sample by sample, in the report: for each step shown, one lane per sample from its arrival to its
end, cut into its phases in the order they ran (analyze/diagnosis/samples.py: `phase_spans`), each phase one colour
with its legend; the slowest outlined in red; each lane's preemptions counted at its end (the hosts record how many,
not when); hovering a lane gives its numbers; the decode window the step kept shaded on the same clock; the phases
a host does not record said under the title. And each step's distribution in a table, its phases' shares with it.

The steps shown (`shown_steps`), each titled with why: for a capture whose trigger saw the rollout slow at an
earlier step, that step (its samples as they ran, the watch records every watched step's) and the captured step
beside it; else a rollout spike or level shift of the run over time; else the profiled step whose rollout lasted
longest; else the recorded step whose rollout lasted longest."""

from __future__ import annotations

from ..analyze.diagnosis.samples import UNTIMED, phase_spans, unrecorded_phases
from .charts import _layout, esc

MAX_LANES = 512  # a step of thousands of samples: its longest ones
HIGHLIGHT = "#e45756"
STRAGGLING = 1.5
STAGE = "rollout_generate"
PHASE_STYLE = {  # phase -> (legend name, colour), in the order a sample lives them
    "queue_ms": ("queued", "#f58518"),
    UNTIMED: ("untimed (in no phase its host times)", "#d9d9d9"),
    "prefill_ms": ("prefill", "#72b7b2"),
    "decode_ms": ("decode", "#4c78a8"),
    "generate_ms": ("generation (prefill and decode, timed whole)", "#54a24b"),
    "tool_ms": ("tool calls", "#b279a2"),
    "reward_ms": ("reward", "#eeca3b"),
}
PHASE_WORDS = {
    "queue_ms": "queue",
    "prefill_ms": "prefill",
    "decode_ms": "decode",
    "generate_ms": "generation",
    "tool_ms": "tool calls",
    "reward_ms": "reward",
    "prefill_ms/decode_ms": "prefill and decode apart",
}
SOURCE_WORDS = {"vllm": "vLLM", "rlprof": "rlprof's trainer", "verl": "verl's agent loop"}


def shown_steps(doc: dict) -> list[tuple[int, str]]:
    """The steps the lanes show, each with why (one or two)."""
    steps = {s["step"]: s for s in doc.get("sample_steps", [])}
    if not steps:
        return []
    timeline = doc.get("timeline") or {}
    triggers = {c["path"]: c["trigger"] for c in timeline.get("captures", [])}
    for b in timeline.get("beside", []):
        said, out = b.get("samples") or {}, []
        spike, t = said.get("spike"), triggers.get(b["capture"]) or {}
        if spike and spike["step"] in steps:
            seen = (
                f": {t['stage']} {t['seconds']:.3f} s against {t['baseline_seconds']:.3f} s"
                if t.get("seconds") is not None and t.get("baseline_seconds") is not None
                else ""
            )
            out.append((spike["step"], f"the spike the trigger saw{seen}; its samples as they ran"))
        if said.get("samples") and b["step"] in steps:
            repeat = (b.get("repeat") or {}).get("repeated")
            out.append(
                (
                    b["step"],
                    "the captured step"
                    + (": ordinary, the spike did not repeat" if repeat is False and spike else "")
                    + (f" (after the spike at step {spike['step']})" if spike else ""),
                )
            )
        if out:
            return out
    decoded = {r["step"] for r in doc["rows"] if r.get("unit") == "decode_step"} & set(steps)
    pool = decoded or set(steps)
    step = max(pool, key=lambda s: (steps[s].get("span_ms") or 0.0, steps[s].get("tail_ms") or 0.0))
    longest = (step, f"the {'profiled' if decoded else 'recorded'} step whose rollout lasted longest")
    flagged = [
        (s["step"], f"a spike of {STAGE}: {s['seconds']:.3f} s against {s['baseline_seconds']:.3f} s")
        for s in timeline.get("spikes", [])
        if s["stage"] == STAGE and s["step"] in steps
    ] + [
        (s["from_step"], f"{STAGE} went to a new level at this step and stayed")
        for s in timeline.get("level_shifts", [])
        if s["stage"] == STAGE and s["from_step"] in steps
    ]
    if flagged:  # and beside it the profiled step, where a window kept its decode steps
        return flagged[:1] + ([longest] if decoded and step != flagged[0][0] else [])
    return [longest]


def _who(s: dict, sources: int) -> str:
    if s.get("replica") is not None:
        who = f"replica {s['replica']}"
    elif s.get("worker") is not None:
        who = f"worker {s['worker']}"
    else:
        who = f"rank {s.get('rank', 0)}"
    return (f"{s['source']} " if sources > 1 else "") + who


def _key(s: dict) -> tuple:
    return s.get("source"), s.get("rank"), s.get("replica"), s.get("worker"), s["sample"]


def _hover(label: str, s: dict, spans: list, t0: float) -> str:
    arrived, ended = spans[0][1], max(e for _, _, e, placed in spans if placed)
    parts = [f"{label}: arrived at {(arrived - t0) / 1e3:.1f} ms, ended at {(ended - t0) / 1e3:.1f} ms"]
    parts.append(
        ", ".join(f"{PHASE_STYLE[p][0].split(' (')[0]} {(e - b) / 1e3:.1f} ms" for p, b, e, _ in spans)
        + (" (reward after the batch)" if any(not placed for *_, placed in spans) else "")
    )
    facts = [
        f"{s['response_tokens']} tokens" if "response_tokens" in s else "",
        f"prompt {s['prompt_tokens']}" if "prompt_tokens" in s else "",
        f"{s['turns']} turn(s)" if "turns" in s else "",
        f"preempted {s['preemptions']}x" if "preemptions" in s else "",
        f"finished: {s['finish_reason']}" if "finish_reason" in s else "",
    ]
    parts.append(", ".join(f for f in facts if f))
    return "<br>".join(esc(p) for p in parts if p)


def sample_lanes(doc: dict, step: int, why: str) -> tuple[dict, str] | None:
    """The lanes of one step's samples, titled with the step and why it is shown, and the words that go above them
    (what the marks mean, the preemptions, what the host does not record). None where no sample has its times."""
    mine = [s for s in doc["samples"] if s["step"] == step and "start_us" in s and "end_us" in s]
    if not mine:
        return None
    spans = {_key(s): phase_spans(s) for s in mine}
    mine = [s for s in mine if spans[_key(s)]]
    if not mine:
        return None
    life = {k: max(e for _, _, e, placed in v if placed) - v[0][1] for k, v in spans.items()}
    mine.sort(key=lambda s: -life[_key(s)])  # longest first
    recorded, mine = len(mine), mine[:MAX_LANES]
    took = [life[_key(s)] for s in mine]
    median = sorted(took)[len(took) // 2]
    # the slowest, and every sample that took STRAGGLING x the median: the ones the batch waited for
    slowest = {_key(s) for s, t in zip(mine, took) if t >= STRAGGLING * median} | {_key(mine[0])}
    t0 = min(spans[_key(s)][0][1] for s in mine)
    sources = len({s.get("source") for s in mine})
    ordered = sorted(mine, key=lambda s: (_who(s, sources), s.get("rollout_pass", 0), s["sample"]))
    labels = {_key(s): f"{_who(s, sources)} · sample {s['sample']}" for s in ordered}
    hover = {_key(s): _hover(labels[_key(s)], s, spans[_key(s)], t0) for s in ordered}
    traces = []
    for phase, (name, colour) in PHASE_STYLE.items():
        for placed in (True, False):
            segs = [(s, b, e) for s in ordered for p, b, e, at in spans[_key(s)] if p == phase and at is placed]
            if not segs:
                continue
            traces.append(
                {
                    "type": "bar",
                    "orientation": "h",
                    "name": esc(name if placed else f"{name} (after the batch: its length, not its place)"),
                    "y": [labels[_key(s)] for s, _, _ in segs],
                    "base": [(b - t0) / 1e3 for _, b, _ in segs],
                    "x": [(e - b) / 1e3 for _, b, e in segs],
                    "marker": {
                        "color": colour,
                        "line": {"width": 0},
                        **({} if placed else {"pattern": {"shape": "/"}, "opacity": 0.6}),
                    },
                    "customdata": [hover[_key(s)] for s, _, _ in segs],
                    "hovertemplate": "%{customdata}<extra>%{fullData.name}</extra>",
                }
            )
    marked = [s for s in ordered if _key(s) in slowest]  # outlined over their phases, whole lives
    traces.append(
        {
            "type": "bar",
            "orientation": "h",
            "name": f"slowest (and {STRAGGLING}x the median)",
            "y": [labels[_key(s)] for s in marked],
            "base": [(spans[_key(s)][0][1] - t0) / 1e3 for s in marked],
            "x": [life[_key(s)] / 1e3 for s in marked],
            "marker": {"color": "rgba(0,0,0,0)", "line": {"color": HIGHLIGHT, "width": 2}},
            "customdata": [hover[_key(s)] for s in marked],
            "hovertemplate": "%{customdata}<extra>slowest</extra>",
        }
    )
    preempted = [s for s in ordered if s.get("preemptions")]
    if preempted:  # counted on the lane: a host records how many times, not when
        traces.append(
            {
                "type": "scatter",
                "mode": "text",
                "name": "preemptions (how many; not when)",
                "y": [labels[_key(s)] for s in preempted],
                "x": [(max(e for _, _, e, at in spans[_key(s)] if at) - t0) / 1e3 for s in preempted],
                "text": [f" ⟲{s['preemptions']}" for s in preempted],
                "textposition": "middle right",
                "textfont": {"color": HIGHLIGHT, "size": 11},
                "customdata": [hover[_key(s)] for s in preempted],
                "hovertemplate": "%{customdata}<extra>preempted</extra>",
            }
        )
    shapes, kept = _decode_window(doc, step, t0)
    preemptions = sum(s.get("preemptions", 0) for s in mine)
    note = "; ".join(
        x
        for x in (
            f"step {step}: one lane per sample from its arrival, cut into its phases in the order they ran; red"
            f" outline: the slowest and those taking {STRAGGLING}x the median{kept}",
            f"{len(preempted)} of {len(mine)} samples preempted, {preemptions} times in all (⟲ and the count at the"
            " end of their lanes: the host records how many times, not when)"
            if preempted
            else "",
            unrecorded_words(mine),
            f"the {len(mine)} longest of its {recorded} samples shown" if recorded > len(mine) else "",
        )
        if x
    )
    figure = {
        "data": traces,
        "layout": _layout(
            esc(f"Step {step}: {why}"),
            shapes=shapes,
            barmode="overlay",
            xaxis={"title": {"text": "ms from the step's first arrival"}, "rangemode": "nonnegative"},
            yaxis={
                "automargin": True,
                "categoryorder": "array",
                "categoryarray": [labels[_key(s)] for s in ordered][::-1],
            },
            margin={"l": 140},
            height=min(900, 200 + 14 * len(ordered)),
            showlegend=True,
        ),
    }
    return figure, note


def _decode_window(doc: dict, step: int, t0: float) -> tuple[list[dict], str]:
    """The decode window the step kept, shaded on the lanes' clock, and its words for the title."""
    decode = [r for r in doc["rows"] if r.get("unit") == "decode_step" and r.get("step") == step and r.get("start_us")]
    if not decode:
        return [], "; no window kept this step's decode steps"
    lo = min(r["start_us"] for r in decode)
    hi = max(r["start_us"] + r["wall_ms"] * 1e3 for r in decode)
    indices = sorted(r["index"] for r in decode if isinstance(r.get("index"), int))
    shade = {
        "type": "rect",
        "xref": "x",
        "yref": "paper",
        "x0": (lo - t0) / 1e3,
        "x1": (hi - t0) / 1e3,
        "y0": 0,
        "y1": 1,
        "fillcolor": "#4c78a8",
        "opacity": 0.12,
        "line": {"width": 0},
    }
    return [shade], f"; shaded: the decode window kept (decode steps {indices[0]}-{indices[-1]})" if indices else ""


def unrecorded_words(samples: list[dict]) -> str:
    """What each host does not record, and what its records hold none of here, in words (no lane can show it)."""
    parts = []
    for source, (never, absent) in unrecorded_phases(samples).items():
        host = SOURCE_WORDS.get(source, source)
        if never:
            parts.append(f"{host} does not record " + ", ".join(PHASE_WORDS.get(p, p) for p in never))
        if absent:
            parts.append(f"{host}'s records here hold no " + ", ".join(PHASE_WORDS.get(p, p) for p in absent))
    return "; ".join(parts)


def sample_figures(doc: dict) -> list[tuple[dict, str]]:
    """The lanes of every step shown (shown_steps), in order, each with its words."""
    return [f for f in (sample_lanes(doc, step, why) for step, why in shown_steps(doc)) if f is not None]


def phase_shares(summary: dict) -> str:
    """A step's phases as shares of the time its samples spent in them (queued / prefill / decode / tools /
    reward), in words: '' where its host times none."""
    phases = {p: v for p, v in (summary.get("phases_ms") or {}).items() if v}
    total = sum(phases.values())
    if not total:
        return ""
    return " / ".join(f"{PHASE_WORDS.get(p, p)} {_share(v / total)}" for p, v in phases.items())


def _share(x: float) -> str:
    return "<1%" if 0 < x < 0.005 else f"{x:.0%}"


def samples_table_html(doc: dict) -> str:
    from .fragments import table

    rows = [
        {
            "step": s["step"],
            "samples": s["samples"],
            "p50": _q(s, "duration_ms", "p50"),
            "p90": _q(s, "duration_ms", "p90"),
            "max": _q(s, "duration_ms", "max"),
            "tokens_max": _q(s, "response_tokens", "max"),
            "tail": f"{s['tail_share']:.0%}" if s.get("tail_share") is not None else "",
            "phases": phase_shares(s),
            "preempted": f"{s['preempted_samples']} ({s['preemptions']}x)" if "preemptions" in s else "",
            "slowest": ", ".join(str(x["sample"]) for x in s.get("slowest", [])),
        }
        for s in doc.get("sample_steps", [])
    ]
    return table(
        rows,
        [
            ("step", "step"),
            ("samples", "samples"),
            ("p50", "p50 ms"),
            ("p90", "p90 ms"),
            ("max", "max ms"),
            ("tokens_max", "longest (tokens)"),
            ("tail", "tail (under half running)"),
            ("phases", "phases (share of their time)"),
            ("preempted", "preempted samples"),
            ("slowest", "slowest samples"),
        ],
        limit=60,
    )


def _q(s: dict, name: str, q: str):
    v = (s.get(name) or {}).get(q)
    return round(v, 1) if isinstance(v, float) else v


def account_line(a: dict) -> str:
    """One watched step's rollout stage split (analyze/over_time/rollout_account.py), in words."""
    line = (
        f"step {a['step']}: the rollout stage {a['stage_ms']:.1f} ms = its {a['samples']} samples' generation "
        f"{a['generation_ms']:.1f} ms"
        + (f" over {a['passes']} passes" if a["passes"] > 1 else "")
        + f" + {a['outside_ms']:.1f} outside ({a['outside_share']:.0%})"
    )
    if "before_ms" in a:
        before = (
            f"{a['before_ms']:.1f} ms before the first sample"
            if a["before_ms"] >= 0
            else f"generation began {-a['before_ms']:.1f} ms before the stage (the prompts sent before it)"
        )
        line += (
            f": {before}, {a['after_ms']:.1f} after the last ({a['handover_ms']:.1f} waiting for the batch's "
            f"handover, {a['release_ms']:.1f} after it: the replicas put to sleep"
            + (", the rollout profiler stopped and its trace written" if a["profiled"] else "")
            + ")"
        )
    if a.get("refill_ms") is not None:
        line += f"; DAPO's refills added {a['refill_ms']:.1f} ms" + (
            f" ({a['refill_samples']} samples after {a['refills']} refill(s))" if a.get("refills") else ""
        )
    if a.get("filtered_groups"):
        line += f", the filter dropped {a['filtered_groups']} groups"
    return line + ("; profiled" if a["profiled"] and "before_ms" not in a else "")


def account_html(doc: dict) -> str:
    from .charts import esc

    return "<ul>" + "".join(f"<li>{esc(account_line(a))}</li>" for a in doc.get("rollout_account", [])) + "</ul>"

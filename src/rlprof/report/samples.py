"""The rollout, sample by sample, in the report: one lane per sample of a step (its generation from start to end, the
slowest highlighted), the decode window the step kept marked on the same clock, and each step's distribution in a
table. The step shown: the first captured step with samples (the trigger's), else the profiled step whose rollout
lasted longest, else the step with the longest tail."""

from __future__ import annotations

from .charts import _layout, esc

MAX_LANES = 512  # a step of thousands of samples: its longest ones
HIGHLIGHT = "#e45756"
STRAGGLING = 1.5
REST = "#9aa7b4"


def shown_step(doc: dict):
    steps = {s["step"]: s for s in doc.get("sample_steps", [])}
    if not steps:
        return None
    for b in (doc.get("timeline") or {}).get("beside", []):
        if b.get("samples") and b["step"] in steps:
            return b["step"]
    decoded = {r["step"] for r in doc["rows"] if r.get("unit") == "decode_step"} & set(steps)
    pool = decoded or set(steps)
    return max(pool, key=lambda s: (steps[s].get("span_ms") or 0.0, steps[s].get("tail_ms") or 0.0))


def sample_lanes(doc: dict) -> dict | None:
    step = shown_step(doc)
    if step is None:
        return None
    mine = [s for s in doc["samples"] if s["step"] == step and "start_us" in s and "end_us" in s]
    if not mine:
        return None
    mine.sort(key=lambda s: s["start_us"] - s["end_us"])  # longest first
    mine = mine[:MAX_LANES]
    took = [s["end_us"] - s["start_us"] for s in mine]
    median = sorted(took)[len(took) // 2]
    # the slowest, and every sample that took STRAGGLING x the median: the ones the batch waited for
    slowest = {(s["sample"], s.get("rank"), s.get("replica")) for s, t in zip(mine, took) if t >= STRAGGLING * median}
    slowest.add((mine[0]["sample"], mine[0].get("rank"), mine[0].get("replica")))
    t0 = min(s["start_us"] for s in mine)

    def lane(s):
        who = f"replica {s['replica']}" if s.get("replica") is not None else f"rank {s.get('rank', 0)}"
        return f"{who} · sample {s['sample']}"

    ordered = sorted(mine, key=lambda s: (s.get("replica") or 0, s.get("rank") or 0, s["sample"]))
    bars = {
        "type": "bar",
        "orientation": "h",
        "name": "sample",
        "y": [lane(s) for s in ordered],
        "base": [(s["start_us"] - t0) / 1e3 for s in ordered],
        "x": [(s["end_us"] - s["start_us"]) / 1e3 for s in ordered],
        "marker": {
            "color": [HIGHLIGHT if (s["sample"], s.get("rank"), s.get("replica")) in slowest else REST for s in ordered]
        },
        "customdata": [
            [s.get("response_tokens", ""), s.get("prompt_tokens", ""), s.get("tool_ms", ""), s.get("preemptions", "")]
            for s in ordered
        ],
        "hovertemplate": "%{y}: %{x:.1f} ms from %{base:.1f} ms<br>response %{customdata[0]} tokens, prompt "
        "%{customdata[1]}<br>tools %{customdata[2]} ms, preempted %{customdata[3]}<extra></extra>",
    }
    decode = [r for r in doc["rows"] if r.get("unit") == "decode_step" and r.get("step") == step and r.get("start_us")]
    shapes, words = [], ""
    if decode:
        lo = min(r["start_us"] for r in decode)
        hi = max(r["start_us"] + r["wall_ms"] * 1e3 for r in decode)
        indices = sorted(r["index"] for r in decode if isinstance(r.get("index"), int))
        shapes.append(
            {
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
        )
        if indices:
            words = f"; shaded: the decode window kept (decode steps {indices[0]}-{indices[-1]})"
    return {
        "data": [bars],
        "layout": _layout(
            esc(f"Step {step}: one lane per sample; red: the slowest and those taking {STRAGGLING}x the median{words}"),
            shapes=shapes,
            xaxis={"title": {"text": "ms from the step's first sample"}},
            yaxis={"automargin": True, "autorange": "reversed"},
            margin={"l": 140},
            height=min(900, 160 + 14 * len(ordered)),
            showlegend=False,
        ),
    }


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

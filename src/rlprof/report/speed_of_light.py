"""Each stage against its device's limits, as the outputs say it: one terminal line per stage (its mfu or mbu, its
time against its speed of light, the largest part of the gap), and the report's roofline with the stages' table.
What the numbers are is analyze/diagnosis/speed_of_light.py's."""

from __future__ import annotations

from collections import defaultdict

from ..analyze.diagnosis.speed_of_light import GAP_PARTS
from . import fragments
from .charts import STAGE_COLORS, _layout, esc


def _rate(value: float, unit: str) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def hardware_words(doc: dict, dtype: str) -> str:
    """The device the windows ran on, its limits for `dtype` and where they come from, as one phrase (the first
    input that says)."""
    known = [i["hardware"] for i in doc.get("inputs", []) if (i.get("hardware") or {}).get("bandwidth")]
    if not known:
        whys = [i["hardware"].get("why") for i in doc.get("inputs", []) if i.get("hardware")]
        return f"device limits not known: {whys[0]}" if whys else "device limits not known"
    hw = known[0]
    peak = hw["peak_flops"].get(dtype)
    peak = f"{_rate(peak, 'FLOP/s')} {dtype}" if peak else f"no {dtype} peak"
    return f"{hw['name'] or hw['kind']}: {peak}, {_rate(hw['bandwidth'], 'B/s')}; {hw['source']}"


def speed_of_light_lines(doc: dict) -> list[str]:
    """Each profiled stage against its device's limits: mfu where compute sets its speed of light, mbu where memory
    does, its time against that limit, and the largest part of the gap between them (with its share); or, in one
    line, why this cannot be said (no model known, the device's limits not known)."""
    model = doc.get("model")
    if model is None:
        return []
    if not model.get("hidden_size"):
        return [f"speed of light: {model.get('why')}"]
    what = (
        f"{model.get('model_type') or 'model'} hidden {model['hidden_size']} x {model['num_hidden_layers']} layers, "
        f"{model.get('dtype')}"
    )
    stages = doc.get("stage_limits") or []
    if not stages:
        device = hardware_words(doc, model.get("dtype"))
        return [f"speed of light ({what}): no stage's work and device limits known; {device}"]
    lines = [f"speed of light ({what}; {hardware_words(doc, model.get('dtype'))}):"]
    for s in stages:
        ratio = f"mfu {s['mfu']:.1%}" if s["bound"] == "compute" else f"mbu {s['mbu']:.1%}"
        line = (
            f"  {s['role']}/{s['stage']}: {ratio} ({s['bound']}-bound), {s['wall_ms']:.1f} ms against "
            f"{s['sol_ms']:.1f} ms at the limit"
        )
        if s.get("gap_largest"):
            field = next(f for f, words in GAP_PARTS if words == s["gap_largest"])
            line += f"; largest part of the gap: {s['gap_largest']} {s[field] / s['gap_ms']:.0%}"
        calls = s.get("calls") or {}
        if "mfu" in calls:  # the windows kept some micro-batches of each call: the whole calls' rate beside theirs
            line += (
                f"; its whole call{'s' if calls['calls'] > 1 else ''} ({calls['units']} micro-batches, "
                f"{calls['wall_ms']:.1f} ms): mfu {calls['mfu']:.1%}"
            )
        lines.append(line)
    return lines


def roofline(doc: dict) -> dict | None:
    """The roofline of the windows' device: achieved FLOP/s against arithmetic intensity (FLOPs per byte moved, both
    log scales), under its two roofs (memory bandwidth x intensity, the peak for the model's dtype); one point per
    stage (its rows summed: analysis `stage_limits`) and one per unit (micro-batch, decode step). A point's height
    below the roof over it is how far it ran from the device's limit."""
    dtype = (doc.get("model") or {}).get("dtype")
    devices = [i["hardware"] for i in doc.get("inputs", []) if (i.get("hardware") or {}).get("bandwidth")]
    peaks = [hw["peak_flops"].get(dtype) for hw in devices]
    if not doc.get("stage_limits") or not devices or not peaks[0]:
        return None
    hw, peak = devices[0], peaks[0]
    points = [(s, s["stage"]) for s in doc["stage_limits"] if s["min_bytes"] > 0 and s["model_flops"] > 0]
    units = [r for r in doc["rows"] if r.get("unit") is not None and "sol_ms" in r and r["min_bytes"] > 0]
    intensities = [p["model_flops"] / p["min_bytes"] for p, _ in points] + [
        u["model_flops"] / u["min_bytes"] for u in units
    ]
    ridge = peak / hw["bandwidth"]
    lo, hi = min([*intensities, ridge]) / 4, max([*intensities, ridge]) * 4
    roof_x = [lo, ridge, hi]
    traces = [
        {
            "type": "scatter",
            "mode": "lines",
            "name": esc(f"roofs: {hw['name'] or hw['kind']} ({dtype})"),
            "x": roof_x,
            "y": [hw["bandwidth"] * lo, peak, peak],
            "line": {"color": "#555", "width": 2},
            "hovertemplate": "%{y:.3s}FLOP/s at %{x:.3g} FLOP/B<extra>" + esc(hw["source"] or "") + "</extra>",
        }
    ]
    by_stage: dict[str, list[dict]] = defaultdict(list)
    for u in units:
        by_stage[u.get("stage") or ""].append(u)
    for stage, held in by_stage.items():
        traces.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": esc(f"{stage}: each {held[0]['unit'].replace('_', ' ')}"),
                "x": [u["model_flops"] / u["min_bytes"] for u in held],
                "y": [u["model_flops"] / u["wall_ms"] * 1e3 for u in held],
                "text": [esc(f"step {u.get('step')} {u['unit']} {u.get('index')}") for u in held],
                "marker": {"color": STAGE_COLORS.get(stage, "#888"), "size": 6, "opacity": 0.45},
                "hovertemplate": "%{text}<br>%{y:.3s}FLOP/s, %{x:.3g} FLOP/B<extra></extra>",
            }
        )
    for s, stage in points:
        traces.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": esc(f"{s['role']}/{stage}"),
                "x": [s["model_flops"] / s["min_bytes"]],
                "y": [s["model_flops"] / s["wall_ms"] * 1e3],
                "text": [esc(f"mfu {s.get('mfu', 0):.1%}, mbu {s.get('mbu', 0):.1%}, {s['bound']}-bound")],
                "marker": {"color": STAGE_COLORS.get(stage, "#888"), "size": 14, "symbol": "diamond"},
                "hovertemplate": "%{text}<br>%{y:.3s}FLOP/s, %{x:.3g} FLOP/B<extra></extra>",
            }
        )
    return {
        "data": traces,
        "layout": _layout(
            "Roofline: each stage and unit against the device's limits",
            xaxis={"type": "log", "title": {"text": "arithmetic intensity (model FLOPs per byte moved)"}},
            yaxis={"type": "log", "title": {"text": "achieved FLOP/s"}, "exponentformat": "SI"},
            height=480,
            margin={"l": 80, "b": 60},
        ),
    }


def speed_of_light_section(page, doc: dict) -> None:
    """Each stage against its device's limits: the roofline, and the stages' work, speed of light and gap parts."""
    lines = speed_of_light_lines(doc)
    if not lines:
        return
    page.section(
        "speed_of_light",
        "Speed of light",
        f'<p class="note">{esc(lines[0])}</p>',
        fragments.table(
            doc.get("stage_limits") or [],
            [
                ("role", "role"),
                ("stage", "stage"),
                ("rows", "windows"),
                ("wall_ms", "wall ms"),
                ("sol_ms", "speed of light ms"),
                ("bound", "bound"),
                ("mfu", "mfu"),
                ("mbu", "mbu"),
                ("gap_idle_ms", "idle"),
                ("gap_launch_ms", "launch-bound"),
                ("gap_comm_ms", "comm"),
                ("gap_memcpy_ms", "memcpy"),
                ("gap_padding_ms", "padding"),
                ("gap_small_batches_ms", "small micro-batches"),
                ("gap_kernels_ms", "kernels below limit"),
            ],
        ),
        figure=roofline(doc),
        empty="the device's limits for the model's dtype are not known: no roofline",
    )

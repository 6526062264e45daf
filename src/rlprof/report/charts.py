"""Plotly figures from analysis documents: one function per question, each returning a figure dict.

Every name that came from a trace is HTML-escaped before it reaches a figure: plotly renders a subset
of HTML in labels and hover text, so an escaped name is shown as the literal text it is.
"""

from __future__ import annotations

import html
from collections import defaultdict

from ..analyze.window.breakdown import BUCKETS, order_key
from .shape import writer_words

STAGE_COLORS = {
    "rollout_generate": "#4c78a8",
    "reward_compute": "#72b7b2",
    "ref_compute_log_prob": "#54a24b",
    "actor_compute_log_prob": "#eeca3b",
    "advantage_compute": "#b279a2",
    "actor_update": "#e45756",
    "weight_sync": "#9d755d",
    "critic_update": "#ff9da6",
    "values_compute": "#bab0ac",
}
PARTS = (
    ("compute only", "#4c78a8"),
    ("comm overlapped", "#9ecae9"),
    ("comm exposed", "#e45756"),
    ("memcpy", "#f58518"),
    ("idle", "#d3d3d3"),
)


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def _layout(title: str, **extra) -> dict:
    margin = {"l": 160, "r": 30, "t": 90, "b": 60} | extra.pop("margin", {})
    return {
        "title": {"text": title, "y": 0.98, "yanchor": "top"},
        "margin": margin,
        "hovermode": "closest",
        "legend": {"orientation": "h", "yanchor": "bottom", "y": 1.0, "xanchor": "left", "x": 0},
        **extra,
    }


def _stage_rows(doc: dict) -> list[dict]:
    return [r for r in doc["rows"] if r.get("unit") is None]


def _lane(r: dict) -> str:
    if r.get("role") == "rollout" and r.get("replica") is not None:
        return f"replica {r['replica']}"
    return f"rank {r['rank']}" if r.get("rank") is not None else esc(r.get("file") or "trace")


def _device_lane(r: dict) -> str:
    """Rows attributed by launch are drawn twice: their device window on the rank's device lane, their host
    range on its host lane (the device runs behind the host); other rows on the rank's one lane."""
    return f"{_lane(r)} device" if r.get("attribution") else _lane(r)


def timeline(doc: dict) -> dict | None:
    """Gantt: one lane per rank (a host and a device lane where rows are attributed by launch), a bar per stage
    window (colour = stage), thin bars for marked units."""
    rows = [r for r in doc["rows"] if r.get("start_us") is not None]
    if not rows:
        return None
    hosts = [r for r in rows if r.get("attribution") and r.get("unit") is None]
    t0 = min([r["start_us"] for r in rows] + [r["host_start_us"] for r in hosts])
    traces = []
    if hosts:
        traces.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": "host range",
                "y": [f"{_lane(r)} host" for r in hosts],
                "base": [(r["host_start_us"] - t0) / 1e3 for r in hosts],
                "x": [r["host_wall_ms"] for r in hosts],
                "marker": {"color": [STAGE_COLORS.get(str(r.get("stage")), "#888888") for r in hosts], "opacity": 0.5},
                "customdata": [[esc(r.get("step")), esc(r.get("role")), esc(r.get("stage"))] for r in hosts],
                "hovertemplate": "step %{customdata[0]} %{customdata[1]}/%{customdata[2]} on the host<br>%{base:.2f} ms"
                " + %{x:.2f} ms<extra>%{y}</extra>",
            }
        )
    by_stage: dict[str, list[dict]] = defaultdict(list)
    units = []
    for r in rows:
        (by_stage[str(r.get("stage") or "window")] if r.get("unit") is None else units).append(r)
    for stage, rs in by_stage.items():
        traces.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": esc(stage),
                "y": [_device_lane(r) for r in rs],
                "base": [(r["start_us"] - t0) / 1e3 for r in rs],
                "x": [r["wall_ms"] for r in rs],
                "marker": {"color": STAGE_COLORS.get(stage, "#888888")},
                "customdata": [
                    [
                        esc(r.get("step")),
                        esc(r.get("role")),
                        esc(stage),
                        r["compute_ms"],
                        r["comm_ms"],
                        r["idle_ms"],
                        esc(writer_words(r)),
                    ]
                    for r in rs
                ],
                "hovertemplate": "step %{customdata[0]} %{customdata[1]}/%{customdata[2]}, written by "
                "%{customdata[6]}<br>%{base:.2f} ms + %{x:.2f} ms<br>compute %{customdata[3]:.2f}, comm "
                "%{customdata[4]:.2f}, idle %{customdata[5]:.2f} ms<extra>%{y}</extra>",
            }
        )
    if units:
        traces.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": "micro-batch / decode step",
                "width": 0.25,
                "y": [_device_lane(r) for r in units],
                "base": [(r["start_us"] - t0) / 1e3 for r in units],
                "x": [r["wall_ms"] for r in units],
                "marker": {"color": "#222222", "opacity": 0.55},
                "customdata": [[esc(r["unit"]), esc(r["index"]), esc(r.get("stage"))] for r in units],
                "hovertemplate": "%{customdata[0]} %{customdata[1]} in %{customdata[2]}<br>%{x:.3f} ms<extra>%{y}</extra>",
            }
        )
    lanes = sorted({_device_lane(r) for r in rows} | {f"{_lane(r)} host" for r in hosts})
    return {
        "data": traces,
        "layout": _layout(
            "Stage timeline per rank (ms from the first window)",
            barmode="overlay",
            xaxis={"title": {"text": "ms"}},
            yaxis={"categoryorder": "array", "categoryarray": lanes[::-1]},
            height=max(260, 60 * len(lanes) + 160),
        ),
    }


def _writer_kind(r: dict) -> str:
    """Whose rows a stage's mean takes together: the driver's (waiting), the replicas', or the ranks'."""
    return "driver" if r.get("writer") == "driver" else "replicas" if r.get("replica") is not None else "ranks"


def _written_by(rs: list[dict]) -> str:
    names = sorted({writer_words(r) for r in rs}, key=lambda n: (len(n), n))
    return ", ".join(names) if len(names) <= 4 else f"{names[0]} .. {names[-1]} ({len(names)})"


def stage_means(doc: dict) -> list[dict]:
    """Mean over ranks of each bucket, per (step, role, stage) and per writer (a driver waiting on the replicas of
    a stage apart from them), in first-seen order; `written_by` names who wrote the rows."""
    groups: dict[tuple, list[dict]] = {}
    for r in _stage_rows(doc):
        groups.setdefault((r.get("step"), r.get("role"), r.get("stage"), _writer_kind(r)), []).append(r)
    return [
        {
            "step": k[0],
            "role": k[1],
            "stage": k[2],
            "ranks": len(rs),
            "written_by": _written_by(rs),
            "writer_kind": k[3],
            **{b: sum(r[b] for r in rs) / len(rs) for b in BUCKETS},
        }
        for k, rs in groups.items()
    ]


def breakdown(doc: dict) -> dict | None:
    """Stacked bars per stage window: compute only + comm overlapped + comm exposed + memcpy + idle = wall."""
    means = stage_means(doc)
    if not means:
        return None
    labels = [
        esc(
            (f"s{m['step']} {m['stage']}" if m["step"] is not None else (m["stage"] or "whole trace"))
            + ("" if m["writer_kind"] == "ranks" else f" ({m['writer_kind']})")
        )
        for m in means
    ]
    values = {
        "compute only": [m["compute_ms"] - m["overlap_ms"] for m in means],
        "comm overlapped": [m["overlap_ms"] for m in means],
        "comm exposed": [m["comm_ms"] for m in means],
        "memcpy": [m["memcpy_ms"] for m in means],
        "idle": [m["idle_ms"] for m in means],
    }
    traces = [
        {
            "type": "bar",
            "name": name,
            "x": labels,
            "y": values[name],
            "marker": {"color": color},
            "hovertemplate": f"%{{x}}<br>{name}: %{{y:.2f}} ms<extra></extra>",
        }
        for name, color in PARTS
    ]
    return {
        "data": traces,
        "layout": _layout(
            "Where the time went, per stage (ms, mean over ranks)",
            barmode="stack",
            yaxis={"title": {"text": "ms"}},
            xaxis={"automargin": True},
            height=420,
            margin={"l": 60, "b": 40},
        ),
    }


def op_totals(doc: dict) -> list[dict]:
    """Operators and kernels summed over every window, ranked by self time."""
    totals: dict[tuple, dict] = {}
    for op in doc["ops"]:
        t = totals.setdefault(
            (op["kind"], op["name"]),
            {"kind": op["kind"], "name": op["name"], "count": 0, "total_ms": 0.0, "self_ms": 0.0, "max_ms": 0.0},
        )
        t["count"] += op["count"]
        t["total_ms"] += op["total_ms"]
        t["self_ms"] += op["self_ms"]
        t["max_ms"] = max(t["max_ms"], op["max_ms"])
    ranked = sorted(totals.values(), key=lambda t: -t["self_ms"])
    grand = {kind: sum(t["self_ms"] for t in ranked if t["kind"] == kind) or 1.0 for kind in ("cpu_op", "kernel")}
    for t in ranked:
        t["share"] = t["self_ms"] / grand[t["kind"]]
    return ranked


def top_ops(doc: dict, n: int = 15) -> dict | None:
    ranked = op_totals(doc)
    if not ranked:
        return None
    traces = []
    for kind, color in (("cpu_op", "#4c78a8"), ("kernel", "#e45756")):
        top = [t for t in ranked if t["kind"] == kind][:n][::-1]
        if top:
            traces.append(
                {
                    "type": "bar",
                    "orientation": "h",
                    "name": "CPU operators (self)" if kind == "cpu_op" else "kernels",
                    "y": [esc(t["name"][:90]) for t in top],
                    "x": [t["self_ms"] for t in top],
                    "marker": {"color": color},
                    "customdata": [[t["count"]] for t in top],
                    "hovertemplate": "%{y}<br>%{x:.2f} ms in %{customdata[0]} calls<extra></extra>",
                }
            )
    height = 120 + 22 * sum(len(t["y"]) for t in traces)
    return {
        "data": traces,
        "layout": _layout(
            "Top operators and kernels (self time, ms, all windows)", height=max(300, height), margin={"l": 380}
        ),
    }


def memory(doc: dict) -> dict | None:
    series = [m for m in doc.get("memory", []) if m.get("timeline")]
    if not series:
        return None
    t0 = min(m["timeline"][0][0] for m in series)
    traces = [
        {
            "type": "scatter",
            "mode": "lines",
            "name": esc(f"rank {m.get('rank')} {m.get('file') or ''}")[:80],
            "x": [(ts - t0) / 1e3 for ts, _ in m["timeline"]],
            "y": [b / 2**20 for _, b in m["timeline"]],
            "hovertemplate": "%{x:.1f} ms: %{y:.1f} MiB<extra></extra>",
        }
        for m in series
    ]
    return {
        "data": traces,
        "layout": _layout(
            "Allocated memory over time (MiB)",
            xaxis={"title": {"text": "ms"}},
            yaxis={"title": {"text": "MiB"}},
            margin={"l": 60},
        ),
    }


def cluster_spread(result: dict) -> dict | None:
    """Per stage, each rank's compute and exposed communication, side by side."""
    ranks = result["ranks"]
    if not ranks:
        return None
    stages = list(dict.fromkeys(esc(f"{r['role']}/{r['stage']}") for r in ranks))
    traces = []
    palette = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#eeca3b", "#9d755d")
    for i, rank in enumerate(sorted({r["rank"] for r in ranks}, key=order_key)):
        color = palette[i % len(palette)]
        mine = {esc(f"{r['role']}/{r['stage']}"): r for r in ranks if r["rank"] == rank}
        traces.append(
            {
                "type": "bar",
                "name": f"rank {rank} compute",
                "x": stages,
                "y": [mine[s]["compute_ms"] if s in mine else None for s in stages],
                "offsetgroup": str(rank),
                "marker": {"color": color},
                "hovertemplate": f"%{{x}}<br>compute %{{y:.2f}} ms<extra>rank {rank}</extra>",
            }
        )
        traces.append(
            {
                "type": "bar",
                "name": f"rank {rank} comm wait",
                "x": stages,
                "y": [mine[s]["comm_ms"] if s in mine else None for s in stages],
                "offsetgroup": str(rank),
                "base": [mine[s]["compute_ms"] if s in mine else None for s in stages],
                "marker": {"color": color, "opacity": 0.45, "pattern": {"shape": "/"}},
                "hovertemplate": "%{x}<br>comm wait %{y:.2f} ms<extra>rank " + f"{rank}</extra>",
            }
        )
    return {
        "data": traces,
        "layout": _layout(
            "Per rank: compute and exposed comm per stage (ms per step)",
            barmode="group",
            height=480,
            margin={"l": 60, "b": 160},
        ),
    }


def compare_stages(cmp: dict) -> dict | None:
    walls = [s for s in cmp["stages"] if s["bucket"] == "wall"]
    if not walls:
        return None
    labels = [
        esc(
            (f"s{s['step']} {s['role']}/{s['stage']}" if s["stage"] else "whole trace")
            + (f" (per {s['unit']})" if s.get("basis") == "per_unit" else "")
        )
        for s in walls
    ]
    traces = [
        {
            "type": "bar",
            "name": "baseline",
            "x": labels,
            "y": [s["baseline_ms"] for s in walls],
            "marker": {"color": "#9ecae9"},
        },
        {"type": "bar", "name": "new", "x": labels, "y": [s["new_ms"] for s in walls], "marker": {"color": "#4c78a8"}},
    ]
    return {
        "data": traces,
        "layout": _layout(
            "Wall time per stage: baseline vs new (ms"
            + ("; per unit where so labelled)" if any(s.get("basis") == "per_unit" for s in walls) else ")"),
            barmode="group",
            height=480,
            margin={"l": 60, "b": 160},
        ),
    }

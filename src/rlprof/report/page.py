"""`rlprof report`: one self-contained HTML file (plotly.js embedded, no network) from a run.

analysis document (+ cluster, + compare) -> figures (charts.py) -> sections -> one page.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..analyze.window.breakdown import order_key
from . import charts, fragments
from .charts import esc
from .speed_of_light import speed_of_light_section
from .host_stacks import has_idle_frames, idle_frames_html, idle_icicle

STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
header{background:#1d3557;color:#fff;padding:16px 28px}header h1{margin:0;font-size:22px}
header p{margin:4px 0 0;opacity:.85;font-size:13px}nav{padding:8px 28px;background:#e9eef5;font-size:14px}
nav a{margin-right:16px;color:#1d3557}main{padding:0 28px 40px}
section{background:#fff;border:1px solid #e3e3e3;border-radius:8px;margin:18px 0;padding:14px 18px}
h2{font-size:18px;margin:4px 0 10px}table{border-collapse:collapse;font-size:13px;margin:8px 0}
td,th{border-bottom:1px solid #eee;padding:3px 10px;text-align:right}td:nth-child(-n+4),th{text-align:left}
.worse{color:#b00020}.better{color:#1b7f3b}.note{color:#555;font-size:13px}.finding{background:#fff4f4;
border-left:4px solid #e45756;padding:8px 12px;margin:8px 0}.ok{background:#f3fbf4;border-left:4px solid #54a24b;
padding:8px 12px}.chart{min-height:240px}.warn{color:#8a5300}.next{background:#f3f7fd;border-left:4px solid
#4c78a8;padding:8px 12px;margin:8px 0}pre{background:#f6f6f6;padding:8px;font-size:12px;overflow:auto}
.finding:not(.cause-finding){background:#f7f7f7;border-left-color:#aaa}.cause,.evidence,.saving{font-size:13px;margin-top:4px}
table.levers td{text-align:left}table.levers code{font-size:12px}
"""


def _script_json(value) -> str:
    """JSON safe inside <script>: no '<', '>' or '&' can close the element or open a comment."""
    return (
        json.dumps(value, separators=(",", ":")).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    )


class Page:
    def __init__(self, title: str, subtitle: str):
        self.title, self.subtitle = title, subtitle
        self.sections: list[tuple[str, str, str]] = []
        self.figures: dict[str, dict] = {}
        self.scripts: list[str] = []  # the page's own behaviour, run after the figures (one inline script)

    def section(self, key: str, title: str, *parts: str, figure: dict | None = None, empty: str = "") -> None:
        body = list(parts)
        if figure is not None:
            self.figures[f"chart-{key}"] = figure
            body.insert(0, f'<div class="chart" id="chart-{key}"></div>')
        elif empty:
            body.insert(0, f'<p class="note">{esc(empty)}</p>')
        self.sections.append((key, title, "\n".join(body)))

    def chart(self, key: str, figure: dict) -> str:
        """A figure of its own inside a section (one section may hold several): its place in the page."""
        self.figures[f"chart-{key}"] = figure
        return f'<div class="chart" id="chart-{key}"></div>'

    def render(self) -> str:
        from plotly.offline import get_plotlyjs

        nav = "".join(f'<a href="#{k}">{esc(t)}</a>' for k, t, _ in self.sections)
        sections = "".join(f'<section id="{k}"><h2>{esc(t)}</h2>{body}</section>' for k, t, body in self.sections)
        config = {"displaylogo": False, "responsive": True, "showLink": False}
        return (
            '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src 'unsafe-inline'; "
            "style-src 'unsafe-inline'; img-src data: blob:; font-src data:\">"
            f"<title>{esc(self.title)}</title><style>{STYLE}</style></head><body>"
            f"<header><h1>{esc(self.title)}</h1><p>{esc(self.subtitle)}</p></header><nav>{nav}</nav>"
            f"<main>{sections}</main>"
            f"<script>{get_plotlyjs()}</script>"
            f"<script>(function(){{var figs={_script_json(self.figures)};var cfg={_script_json(config)};"
            "for(var id in figs){var f=figs[id];Plotly.newPlot(id,f.data,f.layout,cfg);}})();"
            f"{''.join(self.scripts)}</script>"
            "</body></html>"
        )


def build_page(
    doc: dict,
    source: str,
    cluster_result: dict | None = None,
    compare_doc: dict | None = None,
    run_dir: Path | None = None,
) -> str:
    from ..cluster import cluster

    cluster_result = cluster_result or cluster(doc)
    n_ranks = len({(r.get("rank"), r.get("replica")) for r in doc["rows"]})
    steps = sorted({r["step"] for r in doc["rows"] if r.get("step") is not None}, key=order_key)
    salvaged = doc.get("salvage") or []
    recovered = [s["window"] for s in salvaged if s["fate"] == "recovered"]
    lost = [s["window"] for s in salvaged if s["fate"] == "lost"]
    page = Page(
        f"rlprof report: {source}",
        "; ".join(
            part
            for part in (
                f"{len(doc['inputs'])} input files, {n_ranks} rank(s), steps {steps or '-'}"
                if doc["inputs"] or doc["rows"]
                else "",
                _timeline_counts(doc.get("timeline")),
            )
            if part
        )
        + ("; some input was damaged (partial)" if doc.get("partial") else "")
        + (f"; recovered after the run stopped: {', '.join(recovered)}" if recovered else "")
        + (f"; lost: {', '.join(lost)} (see the warnings)" if lost else ""),
    )
    page.section(
        "findings",
        "Findings",
        fragments.findings_html(doc.get("findings", []), doc.get("plan")),
        fragments.next_step_html(doc, run_dir),
    )
    if doc.get("warnings"):
        page.section(
            "warnings",
            "Warnings",
            "<ul>" + "".join(f'<li class="warn">{esc(w)}</li>' for w in doc["warnings"]) + "</ul>",
        )
    if doc.get("timeline"):  # the watch's run over time (report/over_time.py)
        from .over_time import over_time_html, stage_time_chart

        page.section("over_time", "The run over time", over_time_html(doc), figure=stage_time_chart(doc["timeline"]))
    if doc.get("samples"):  # the rollout's host recorded its samples (report/samples.py)
        from .samples import sample_figures, samples_table_html

        lanes = sample_figures(doc)  # the spike's step, and the captured step beside it where they differ
        page.section(
            "samples",
            "The rollout, sample by sample",
            *(
                f'<p class="note">{esc(note)}</p>' + page.chart("samples" if k == 0 else f"samples-{k}", figure)
                for k, (figure, note) in enumerate(lanes)
            ),
            samples_table_html(doc),
            empty="" if lanes else "no sample carries its start and end",
        )
    if doc.get("rollout_account"):  # the rollout stage split: generation and the rest (report/samples.py)
        from .samples import account_html

        page.section("rollout_account", "The rollout stage, accounted for", account_html(doc))
    page.section(
        "timeline",
        "Stage timeline per rank",
        figure=charts.timeline(doc),
        empty="no window in this input carries a start time",
    )
    page.section(
        "breakdown",
        "Breakdown per stage",
        fragments.table(
            charts.stage_means(doc),
            [
                ("step", "step"),
                ("role", "role"),
                ("stage", "stage"),
                ("ranks", "ranks"),
                ("written_by", "written by"),
                ("wall_ms", "wall ms"),
                ("compute_ms", "compute"),
                ("comm_ms", "comm"),
                ("overlap_ms", "overlap"),
                ("memcpy_ms", "memcpy"),
                ("idle_ms", "idle"),
            ],
            limit=60,
        ),
        figure=charts.breakdown(doc),
        empty="no stage windows",
    )
    speed_of_light_section(page, doc)  # the roofline (report/speed_of_light.py)
    if has_idle_frames(doc):  # the host's stacks were sampled: idle by frame (report/host_stacks.py)
        page.section("idle_frames", "Idle, by the host's frames", idle_frames_html(doc), figure=idle_icicle(doc))
    page.section(
        "ops",
        "Top operators and kernels",
        fragments.ops_by_stage_html(doc["ops"]),
        figure=charts.top_ops(doc),
        empty="no operators",
    )
    page.scripts.append(fragments.STAGE_SELECT_JS)
    page.section(
        "memory",
        "Memory",
        figure=charts.memory(doc),
        empty="no memory was recorded (collect with contents [memory] or the torch_memory tool)",
    )
    page.section(
        "cluster",
        "Cluster: spread across ranks",
        *fragments.cluster_parts(cluster_result),
        figure=charts.cluster_spread(cluster_result),
        empty="no per-rank data",
    )
    if compare_doc is not None:
        page.section(
            "compare",
            "Compare with the baseline",
            fragments.compare_html(compare_doc),
            figure=charts.compare_stages(compare_doc),
            empty="no stage in common",
        )
    return page.render()


def _timeline_counts(timeline: dict | None) -> str:
    """The run over time in the header: its ranks and watched steps (a run may hold a timeline and no trace)."""
    if not timeline:
        return ""
    steps = timeline["steps"]
    return f"run over time: {len(timeline['ranks']):,} rank(s) x {len(steps):,} watched steps" + (
        f" ({steps[0]}-{steps[-1]})" if steps else ""
    )


def page_for(
    path: str | Path,
    baseline: str | None = None,
    doc: dict | None = None,
    workers: int | None = None,
    use_ray: bool = False,
) -> str:
    """The report page of PATH (analysed here unless `doc` is given), with a compare section for BASELINE."""
    from ..analyze.pipeline import load_analysis

    src = Path(path)
    # compare needs every operator of NEW, so with a baseline it is read once with all of them kept
    doc = doc if doc is not None else load_analysis(src, workers=workers, top=None if baseline else 50, use_ray=use_ray)
    compare_doc = None
    if baseline:
        from ..compare import compare

        compare_doc = compare(str(src), baseline, workers=workers, new_doc=doc, use_ray=use_ray)
    return build_page(doc, src.name or str(src), compare_doc=compare_doc, run_dir=src if src.is_dir() else None)


def write_report(
    path: str | Path,
    out: str | Path | None = None,
    baseline: str | None = None,
    doc: dict | None = None,
    workers: int | None = None,
    use_ray: bool = False,
) -> Path:
    src = Path(path)
    target = Path(out) if out else (src / "report.html" if src.is_dir() else src.with_name("report.html"))
    page = page_for(src, baseline, doc, workers, use_ray)
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(f".{target.name}.part")  # renamed whole: a full disk leaves no cut report
    try:
        part.write_text(page, encoding="utf-8", errors="backslashreplace")
        part.replace(target)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return target

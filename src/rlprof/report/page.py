"""`rlprof report`: one self-contained HTML file (plotly.js embedded, no network) from a run.

analysis document (+ cluster, + compare) -> figures (charts.py) -> sections -> one page.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import charts
from .charts import esc

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
"""


# The operator table's stage selector: 'all stages' shows the top overall, a stage its own rows.
STAGE_SELECT_JS = ("(function(){var s=document.getElementById('stage-select');if(!s)return;"
                   "s.addEventListener('change',function(e){var v=e.target.value;"
                   "document.querySelectorAll('#ops-table tbody tr').forEach(function(r){"
                   "var show=v?r.dataset.stage===v:r.dataset.top==='1';r.style.display=show?'':'none';});});})();")


def _script_json(value) -> str:
    """JSON safe inside <script>: no '<', '>' or '&' can close the element or open a comment."""
    return (json.dumps(value, separators=(",", ":")).replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("&", "\\u0026"))


def _table(records: list[dict], columns: list[tuple[str, str]], limit: int = 30) -> str:
    head = "".join(f"<th>{esc(title)}</th>" for _, title in columns)
    body = []
    for r in records[:limit]:
        cells = []
        for key, _ in columns:
            v = r.get(key)
            text = f"{v:.3f}" if isinstance(v, float) else "-" if v is None else str(v)
            cells.append(f"<td>{esc(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


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

    def render(self) -> str:
        from plotly.offline import get_plotlyjs

        nav = "".join(f'<a href="#{k}">{esc(t)}</a>' for k, t, _ in self.sections)
        sections = "".join(f'<section id="{k}"><h2>{esc(t)}</h2>{body}</section>' for k, t, body in self.sections)
        config = {"displaylogo": False, "responsive": True, "showLink": False}
        return (
            "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src 'unsafe-inline'; "
            "style-src 'unsafe-inline'; img-src data: blob:; font-src data:\">"
            f"<title>{esc(self.title)}</title><style>{STYLE}</style></head><body>"
            f"<header><h1>{esc(self.title)}</h1><p>{esc(self.subtitle)}</p></header><nav>{nav}</nav>"
            f"<main>{sections}</main>"
            f"<script>{get_plotlyjs()}</script>"
            f"<script>(function(){{var figs={_script_json(self.figures)};var cfg={_script_json(config)};"
            "for(var id in figs){var f=figs[id];Plotly.newPlot(id,f.data,f.layout,cfg);}})();"
            f"{''.join(self.scripts)}</script>"
            "</body></html>")


def build_page(doc: dict, source: str, cluster_result: dict | None = None, compare_doc: dict | None = None,
               run_dir: Path | None = None) -> str:
    from ..cluster import cluster

    cluster_result = cluster_result or cluster(doc)
    n_ranks = len({(r.get("rank"), r.get("replica")) for r in doc["rows"]})
    steps = sorted({r["step"] for r in doc["rows"] if r.get("step") is not None})
    page = Page(f"rlprof report: {source}", f"{len(doc['inputs'])} input files, {n_ranks} rank(s), steps "
                f"{steps or '-'}" + ("; some input was damaged (partial)" if doc.get("partial") else ""))
    page.section("findings", "Findings", _findings_html(doc.get("findings", [])), _next_step_html(doc, run_dir))
    if doc.get("warnings"):
        page.section("warnings", "Warnings", "<ul>" + "".join(f'<li class="warn">{esc(w)}</li>'
                                                              for w in doc["warnings"]) + "</ul>")
    page.section("timeline", "Stage timeline per rank", figure=charts.timeline(doc),
                 empty="no window in this input carries a start time")
    page.section("breakdown", "Breakdown per stage", _table(charts.stage_means(doc), [
        ("step", "step"), ("role", "role"), ("stage", "stage"), ("ranks", "ranks"), ("wall_ms", "wall ms"),
        ("compute_ms", "compute"), ("comm_ms", "comm"), ("overlap_ms", "overlap"), ("memcpy_ms", "memcpy"),
        ("idle_ms", "idle")], limit=60), figure=charts.breakdown(doc), empty="no stage windows")
    page.section("ops", "Top operators and kernels", _ops_by_stage_html(doc["ops"]), figure=charts.top_ops(doc),
                 empty="no operators")
    page.scripts.append(STAGE_SELECT_JS)
    page.section("memory", "Memory", figure=charts.memory(doc),
                 empty="no memory was recorded (collect with contents [memory] or the torch_memory tool)")
    page.section("cluster", "Cluster: spread across ranks", *_cluster_parts(cluster_result),
                 figure=charts.cluster_spread(cluster_result), empty="no per-rank data")
    if compare_doc is not None:
        from ..compare import compare_html

        page.section("compare", "Compare with the baseline", compare_html(compare_doc),
                     figure=charts.compare_stages(compare_doc), empty="no stage in common")
    return page.render()


def _findings_html(found: list[dict]) -> str:
    if not found:
        return '<div class="ok">no finding above its threshold (see docs/analysis_schema.md)</div>'
    return "".join(f'<div class="finding" data-kind="{esc(f["kind"])}"><b>{k}.</b> {esc(f["text"])}</div>'
                   for k, f in enumerate(found, 1))


def _next_step_html(doc: dict, run_dir: Path | None, budget: int = 2_000_000) -> str:
    """`rlprof advise` in a box: the next config to paste (rlprof dialect, 2 MB a rank), or why there is none."""
    from omegaconf import OmegaConf

    from ..advise import advise_from, run_windows
    from ..errors import RLProfError

    try:
        advice = advise_from(doc, run_windows(run_dir) if run_dir else [], budget, "rlprof")
    except RLProfError as exc:
        return f'<p class="note">next step: {esc(str(exc))}</p>'
    text = OmegaConf.to_yaml(OmegaConf.create(advice["config"]))
    why = "".join(f"<li>{esc(r)}</li>" for r in advice["reasons"])
    return (f'<div class="next"><b>Next step</b>: profile {esc(advice["target"]["stage"])} at step '
            f'{esc(advice["target"]["step"])} on rank(s) {esc(advice["target"]["ranks"])}, predicted '
            f'{advice["predicted_bytes"] / 1e6:.2f} MB a rank (budget 2 MB; other dialects and budgets: '
            f'<code>rlprof advise RUN --budget SIZE --dialect verl|mindspeed|rlprof</code>)<ul>{why}</ul>'
            f'<pre id="next-config">{esc(text)}</pre></div>')


def _ops_by_stage_html(ops: list[dict], per_stage: int = 25) -> str:
    """Operators per (role, stage) with a stage selector: 'all stages' shows the top overall, a stage its own."""
    from ..analyze.summary import ops_by_stage

    ranked = ops_by_stage(ops)
    stages = sorted({f"{o['role']}/{o['stage']}" if o["stage"] else "-" for o in ranked})
    options = '<option value="">all stages</option>' + "".join(
        f'<option value="{esc(s)}">{esc(s)}</option>' for s in stages)
    seen: dict[str, int] = {}
    body = []
    for k, o in enumerate(ranked):
        where = f"{o['role']}/{o['stage']}" if o["stage"] else "-"
        seen[where] = seen.get(where, 0) + 1
        if seen[where] > per_stage and k >= per_stage:
            continue
        shown = "" if k < per_stage else ' style="display:none"'
        cells = (where, o["kind"], o["name"], str(o["count"]), f"{o['self_ms']:.3f}", f"{o['total_ms']:.3f}")
        body.append(f'<tr data-stage="{esc(where)}" data-top="{int(k < per_stage)}"{shown}>'
                    + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>{t}</th>" for t in ("stage", "kind", "name", "count", "self ms", "total ms"))
    return (f'<label class="note">stage <select id="stage-select">{options}</select></label>'
            f'<table id="ops-table"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>')


def _cluster_parts(result: dict) -> list[str]:
    parts = []
    ranks = {r["rank"] for r in result["ranks"]}
    if len(ranks) < 2:  # the breakdown above already holds its one rank's numbers
        return ['<p class="note">one rank in this input: nothing to spread across</p>']
    if result["slow_ranks"]:
        parts += [f'<div class="finding"><b>slow rank {esc(f["rank"])}</b> ({esc(f["role"])}/{esc(f["stage"])}): '
                  f'{esc(f["evidence"]["summary"])}</div>' for f in result["slow_ranks"]]
    else:
        parts.append(f'<div class="ok">no slow rank: no rank computes {result["threshold"]:.0%} more than the '
                     "others in a stage while they wait for it in collectives</div>")
    wide = [s for s in result["stages"] if s["bucket"] in ("wall", "compute", "comm")]
    parts.append(_table(wide, [("role", "role"), ("stage", "stage"), ("bucket", "bucket"), ("ranks", "ranks"),
                               ("mean_ms", "mean"), ("min_ms", "min"), ("max_ms", "max"), ("spread_ms", "spread"),
                               ("cv", "cv"), ("max_rank", "slowest rank")], limit=60))
    return parts


def page_for(path: str | Path, baseline: str | None = None, doc: dict | None = None,
             workers: int | None = None) -> str:
    """The report page of PATH (analysed here unless `doc` is given), with a compare section for BASELINE."""
    from ..analyze.engine import load_analysis

    src = Path(path)
    # compare needs every operator of NEW, so with a baseline it is read once with all of them kept
    doc = doc if doc is not None else load_analysis(src, workers=workers, top=None if baseline else 50)
    compare_doc = None
    if baseline:
        from ..compare import compare

        compare_doc = compare(str(src), baseline, workers=workers, new_doc=doc)
    return build_page(doc, src.name or str(src), compare_doc=compare_doc, run_dir=src if src.is_dir() else None)


def write_report(path: str | Path, out: str | Path | None = None, baseline: str | None = None,
                 doc: dict | None = None, workers: int | None = None) -> Path:
    src = Path(path)
    target = Path(out) if out else (src / "report.html" if src.is_dir() else src.with_name("report.html"))
    page = page_for(src, baseline, doc, workers)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(page, encoding="utf-8")
    return target

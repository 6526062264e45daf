"""The HTML renderer's pieces: one fragment per document part, every name escaped (the page assembles them)."""

from __future__ import annotations

import html
from pathlib import Path

from .charts import esc
from .shape import SIGNED, UNIT_COLUMNS, fmt, op_columns, ops_by_stage, pivot_columns, stage_pivot, units_differ, where

# The operator table's stage selector: 'all stages' shows the top overall, a stage its own rows.
STAGE_SELECT_JS = (
    "(function(){var s=document.getElementById('stage-select');if(!s)return;"
    "s.addEventListener('change',function(e){var v=e.target.value;"
    "document.querySelectorAll('#ops-table tbody tr').forEach(function(r){"
    "var show=v?r.dataset.stage===v:r.dataset.top==='1';r.style.display=show?'':'none';});});})();"
)


def table(records: list[dict], columns: list[tuple[str, str]], limit: int = 30) -> str:
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


def signed_table(records: list[dict], columns: tuple[str, ...], signed: tuple[str, ...] = ()) -> str:
    """A table whose signed columns are coloured: slower red, faster green."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = []
    for r in records:
        cells = []
        for c in columns:
            v = r.get(c)
            cls = ""
            if c in signed and isinstance(v, float) and v:
                cls = ' class="worse"' if v > 0 else ' class="better"'
            cells.append(f"<td{cls}>{html.escape(fmt(v, c in signed))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def compare_html(doc: dict, top: int = 50) -> str:
    """A compare document as a self-contained <section> (no scripts, every name escaped) the report embeds."""
    from ..compare import partial_lines

    parts = [
        '<section class="rlprof-compare">',
        f"<h2>Compare: {html.escape(doc['baseline']['path'])} &rarr; {html.escape(doc['new']['path'])}</h2>",
    ]
    lines = partial_lines(doc)
    if lines:  # per side: partial, and each damaged file's own warning
        parts.append(
            '<ul class="partial">' + "".join(f"<li>{html.escape(line.strip())}</li>" for line in lines) + "</ul>"
        )
    differ = units_differ(doc)
    parts += [
        "<h3>Per stage (ms; bucket columns are the change"
        + ("; per: a window, or one unit where the windows hold different numbers of units)" if differ else ")")
        + "</h3>",
        signed_table(stage_pivot(doc), pivot_columns(doc), SIGNED),
    ]
    if differ:  # per window: the counts, each side's per-unit time and spread, and what is compared
        parts += [
            '<ul class="units">' + "".join(f"<li>{html.escape(u['note'])}</li>" for u in differ) + "</ul>",
            "<h3>Windows holding different numbers of units (ms per unit)</h3>",
            signed_table(differ, UNIT_COLUMNS),
        ]
    columns = op_columns(doc)
    parts += [
        "<h3>Operators and kernels that moved (ms per window"
        + ("; per a unit where the per column says)" if "per" in columns else ")")
        + "</h3>",
        signed_table([o for o in doc["ops"] if o["status"] != "same"][:top], columns, SIGNED),
        "<h3>Collectives</h3>",
        signed_table(
            doc["collectives"][:top], ("status", "role", "stage", "name", "baseline_ms", "new_ms", "diff_ms"), SIGNED
        ),
        "<h3>Memory peak</h3>",
        signed_table(doc["memory"], ("role", "stage", "baseline_peak_mb", "new_peak_mb", "diff_mb"), SIGNED),
    ]
    if doc["warnings"]:
        parts.append("<ul>" + "".join(f"<li>{html.escape(w)}</li>" for w in doc["warnings"]) + "</ul>")
    parts.append("</section>")
    return "\n".join(parts)


DIALECT_NAMES = {"rlprof": "rlprof trainer", "verl": "verl", "mindspeed": "MindSpeed-RL"}


def _evidence_text(evidence: dict) -> str:
    """The finding's numbers, scalars only, rounded."""
    parts = []
    for key, value in evidence.items():
        if isinstance(value, bool) or value is None or isinstance(value, (dict, list)):
            continue
        if isinstance(value, float):
            value = f"{value:.3g}"
        parts.append(f"{key} = {value}")
    return "; ".join(parts)


def findings_html(found: list[dict], plan: dict | None = None) -> str:
    """Each finding: its sentence; for a cause, the cause, the evidence and the levers per framework (why, its side
    effect, what it needs); then the plan, the causes' first levers together."""
    if not found:
        return '<div class="ok">no finding above its threshold (see docs/analysis_schema.md)</div>'
    out = []
    for k, f in enumerate(found, 1):
        body = f"<b>{k}.</b> {esc(f['text'])}"
        if f.get("cause"):
            body += (
                f'<div class="cause"><b>cause:</b> {esc(f["cause"])}</div>'
                f'<div class="evidence"><b>evidence:</b> {esc(_evidence_text(f.get("evidence") or {}))}</div>'
            )
            if f.get("saving_text"):
                ms = f.get("saving_ms")
                body += (
                    f'<div class="saving" data-saving-ms="{"" if ms is None else f"{ms:.3f}"}"><b>saving:</b> '
                    f"{esc(f['saving_text'])} (the fix with its values: <code>rlprof advise RUN --fix "
                    "[--dialect verl|mindspeed|rlprof]</code>)</div>"
                )
            rows = "".join(
                f"<tr><td>{esc(DIALECT_NAMES.get(d, d))}</td><td><code>{esc(lv['key'])}</code></td>"
                f"<td>{esc(lv['set'])}</td><td>{esc(_lever_why(lv))}</td></tr>"
                for d, levers in f.get("levers", {}).items()
                for lv in levers
            )
            body += (
                '<table class="levers"><tr><th>framework</th><th>config key</th><th>turn</th><th>why</th></tr>'
                f"{rows}</table>"
            )
        out.append(
            f'<div class="finding{" cause-finding" if f.get("cause") else ""}" data-kind="{esc(f["kind"])}">'
            f"{body}</div>"
        )
    if plan and plan.get("causes"):
        from ..analyze.diagnosis.plan import plan_text

        out.append(
            f'<div class="finding plan" data-total-ms="{plan["total_ms"]:.3f}">{esc(plan_text(plan))} '
            "(one config: <code>rlprof advise RUN --fix --plan</code>)</div>"
        )
    return "".join(out)


def _lever_why(lv: dict) -> str:
    """Why a lever acts, its side effect and what it needs, where it has them."""
    return "; ".join([lv["why"], *(x for x in (lv.get("effect"), lv.get("needs") and f"needs {lv['needs']}") if x)])


def next_step_html(doc: dict, run_dir: Path | None, budget: int = 2_000_000) -> str:
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
    return (
        f'<div class="next"><b>Next step</b>: profile {esc(advice["target"]["stage"])} at step '
        f"{esc(advice['target']['step'])} on rank(s) {esc(advice['target']['ranks'])}, predicted "
        f"{advice['predicted_bytes'] / 1e6:.2f} MB a rank (budget 2 MB; other dialects and budgets: "
        f"<code>rlprof advise RUN --budget SIZE --dialect verl|mindspeed|rlprof</code>)<ul>{why}</ul>"
        f'<pre id="next-config">{esc(text)}</pre></div>'
    )


def ops_by_stage_html(ops: list[dict], per_stage: int = 25) -> str:
    """Operators per (role, stage) with a stage selector: 'all stages' shows the top overall, a stage its own."""
    ranked = ops_by_stage(ops)
    stages = sorted({where(o["role"], o["stage"]) for o in ranked})
    options = '<option value="">all stages</option>' + "".join(
        f'<option value="{esc(s)}">{esc(s)}</option>' for s in stages
    )
    seen: dict[str, int] = {}
    body = []
    for k, o in enumerate(ranked):
        at = where(o["role"], o["stage"])
        seen[at] = seen.get(at, 0) + 1
        if seen[at] > per_stage and k >= per_stage:
            continue
        shown = "" if k < per_stage else ' style="display:none"'
        cells = (at, o["kind"], o["name"], str(o["count"]), f"{o['self_ms']:.3f}", f"{o['total_ms']:.3f}")
        body.append(
            f'<tr data-stage="{esc(at)}" data-top="{int(k < per_stage)}"{shown}>'
            + "".join(f"<td>{esc(c)}</td>" for c in cells)
            + "</tr>"
        )
    head = "".join(f"<th>{t}</th>" for t in ("stage", "kind", "name", "count", "self ms", "total ms"))
    return (
        f'<label class="note">stage <select id="stage-select">{options}</select></label>'
        f'<table id="ops-table"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
    )


def cluster_parts(result: dict) -> list[str]:
    parts = []
    ranks = {r["rank"] for r in result["ranks"]}
    if len(ranks) < 2:  # the breakdown above already holds its one rank's numbers
        return ['<p class="note">one rank in this input: nothing to spread across</p>']
    if result["slow_ranks"]:
        parts += [
            f'<div class="finding"><b>slow rank {esc(f["rank"])}</b> ({esc(f["role"])}/{esc(f["stage"])}): '
            f"{esc(f['evidence']['summary'])}</div>"
            for f in result["slow_ranks"]
        ]
    else:
        parts.append(
            f'<div class="ok">no slow rank: no rank computes {result["threshold"]:.0%} more than the '
            "others in a stage while they wait for it in collectives</div>"
        )
    wide = [s for s in result["stages"] if s["bucket"] in ("wall", "compute", "comm")]
    parts.append(
        table(
            wide,
            [
                ("role", "role"),
                ("stage", "stage"),
                ("bucket", "bucket"),
                ("ranks", "ranks"),
                ("mean_ms", "mean"),
                ("min_ms", "min"),
                ("max_ms", "max"),
                ("spread_ms", "spread"),
                ("cv", "cv"),
                ("max_rank", "slowest rank"),
            ],
            limit=60,
        )
    )
    return parts

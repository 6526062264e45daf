"""What `rlprof train` shows: a progress bar with compact metrics, then a per-stage summary."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

STAGE_ORDER = (
    "weight_sync",
    "rollout_generate",
    "reward_compute",
    "ref_compute_log_prob",
    "actor_compute_log_prob",
    "advantage_compute",
    "actor_update",
)


def metrics_line(m: dict) -> str:
    line = (
        f"step {m['step']:>3}  reward {m['reward_mean']:.3f}  acc {m['accuracy']:.2f}  kl {m['kl']:.4f}  "
        f"clip {m['clip_frac']:.3f}  ent {m['entropy']:.2f}  len {m['response_length']:.1f}  "
        f"{m['step_ms']:.0f} ms"
    )
    if "informative_groups" in m:
        line += f"  groups {m['informative_groups']}"
    return line


class ProgressPrinter:
    def __init__(self, steps: int, enabled: bool = True):
        self.enabled = enabled
        self.console = Console(width=max(110, Console().width))
        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            disable=not enabled,
            transient=True,
        )
        self.task = self.progress.add_task("train", total=steps)

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def line(self, text: str) -> None:
        """Another line under the progress bar (the console tracker's)."""
        if self.enabled:
            self.progress.console.print(text, highlight=False, markup=False, soft_wrap=True)
            self.progress.console.file.flush()

    def update(self, m: dict) -> None:
        if self.enabled:
            self.progress.console.print(metrics_line(m), highlight=False)
            self.progress.console.file.flush()  # each step's line reaches a log file or pipe as it is printed
            self.progress.advance(self.task)


def stage_table(history: list[dict]) -> Table:
    """Mean time per stage over the steps after the first (which pays one-time costs)."""
    steps = history[1:] or history
    stages = [s for s in STAGE_ORDER if any(s in m["stage_ms"] for m in steps)]
    total = sum(m["step_ms"] for m in steps) / len(steps)
    table = Table(title=f"per-stage time (mean over steps {steps[0]['step']}-{steps[-1]['step']})")
    for col in ("stage", "mean ms", "share of step"):
        table.add_column(col, justify="right" if col != "stage" else "left")
    for s in stages:
        mean = sum(m["stage_ms"].get(s, 0.0) for m in steps) / len(steps)
        table.add_row(s, f"{mean:.1f}", f"{100 * mean / total:.0f}%")
    table.add_row("[bold]step", f"[bold]{total:.1f}", "100%")
    return table


def print_summary(
    cfg, history: list[dict], metrics_path: Path, run_dirs: list[Path], seconds: float, quiet: bool = False
) -> None:
    from ..collect.manifest import read_rows

    console = Console(width=max(120, Console().width))
    first = history[: min(5, len(history))]
    last = history[-min(5, len(history)) :]
    mean = lambda ms, k: sum(m[k] for m in ms) / len(ms)  # noqa: E731
    console.print(
        f"{cfg.trainer.algorithm.upper()}: {len(history)} steps in {seconds:.1f} s; mean reward "
        f"first 5 steps {mean(first, 'reward_mean'):.3f} -> last 5 steps {mean(last, 'reward_mean'):.3f}; "
        f"accuracy {mean(first, 'accuracy'):.2f} -> {mean(last, 'accuracy'):.2f}"
    )
    if quiet:
        return
    console.print(stage_table(history))
    console.print(f"metrics: {metrics_path}")
    for run_dir in run_dirs:
        manifest = run_dir / "manifest.jsonl"
        if not manifest.exists():
            continue
        try:
            rows = read_rows(run_dir)
        except OSError as exc:  # the profile's disk: never the training's failure
            console.print(f"profiled windows in {run_dir}: unreadable ({type(exc).__name__}: {exc})")
            continue
        table = Table(title=f"profiled windows in {run_dir}")
        for col in ("step", "role", "stage", "rank", "tool", "status", "MB", "file"):
            table.add_column(col)
        for r in rows:
            table.add_row(
                str(r["step"]),
                r["role"],
                r["stage"],
                str(r["rank"]),
                r["tool"],
                r["status"],
                f"{r['bytes'] / 1e6:.2f}",
                str(r["path"]),
            )
        console.print(table)
        from ..analyze.pipeline import analyze
        from ..errors import AnalyzeError
        from ..analyze.export import write_analysis
        from ..report.terminal import print_analysis

        try:
            doc = analyze(run_dir, workers=1)
            written = write_analysis(doc, run_dir / "analysis")
        except (AnalyzeError, OSError) as exc:  # a full disk there is the profile's, not the training's
            console.print(f"analysis skipped: {type(exc).__name__ + ': ' if isinstance(exc, OSError) else ''}{exc}")
            continue
        print_analysis(doc, max_rows=24)  # findings first, then the windows and operators per stage
        console.print(f"analysis: {written[0]}")
        from ..report import write_report

        try:
            report = write_report(run_dir, run_dir / "report.html", doc=doc)
            console.print(f"report: {report}  (open it offline, or: rlprof view {run_dir})")
        except Exception as exc:  # the report is a convenience; training already finished
            console.print(f"report skipped: {type(exc).__name__}: {exc}")

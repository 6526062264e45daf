"""The commands that read what runs wrote: analyze, compare, cluster, report, view and slice."""

from __future__ import annotations

import functools
import json
import sys
from typing import List, Optional

import typer

from .app import RAY_OPTION, WORKERS_OPTION, app, default_out, fail, guarded


@app.command()
@guarded
def analyze(
    path: str = typer.Argument(..., help="a run directory, a manifest.jsonl, or one trace file"),
    as_json: bool = typer.Option(False, "--json", help="print the analysis to stdout instead of writing files"),
    export: str = typer.Option("csv", "--export", help="tables as: csv (one file each) or db (one DuckDB file)"),
    out: Optional[str] = typer.Option(None, "-o", "--out", help="output directory (default: next to the input)"),
    ray: bool = RAY_OPTION,
    workers: Optional[int] = WORKERS_OPTION,
    model: Optional[str] = typer.Option(
        None,
        "--model",
        help="the model the run computed with, where it recorded none: a checkpoint directory, its config.json, "
        "or the config's JSON text (for each stage's FLOPs, bytes and distance from the device's limits)",
    ),
):
    """Per (step, role, stage, rank) time breakdown, top operators and kernels, collectives, memory.

    Given an analysis.json, reads it back (checked against its schema) and writes its tables again.
    """
    from pathlib import Path

    from ..analyze.pipeline import analyze as run_analysis
    from ..analyze.inputs.find import is_analysis_file
    from ..analyze.inputs.model_config import given_model
    from ..analyze.result import Analysis

    if export not in ("csv", "db"):
        fail(f"--export {export!r} is not allowed; allowed: csv, db")
    given = given_model(model) if model is not None else None
    if is_analysis_file(Path(path)):
        if given is not None:
            fail("--model applies to traces; an analysis.json keeps the model it was made with (re-run on the traces)")
        analysis = Analysis.load(path)
        doc = analysis.to_dict()
    else:
        doc = _analyze_with_progress(run_analysis, path, workers, ray, quiet=as_json, model=given)
        analysis = Analysis.from_document(doc)  # the document as its types say (an unknown key is an error)
    for warning in doc["warnings"]:
        typer.echo(f"rlprof: warning: {warning}", err=True)
    if as_json:
        typer.echo(analysis.to_json())
        return
    from ..analyze.export import write_analysis
    from ..report.terminal import print_analysis

    out_dir = Path(out) if out else default_out(Path(path), "analysis")
    written = write_analysis(doc, out_dir, export, document_json=analysis.to_json(indent=1))
    print_analysis(doc)
    typer.echo(f"wrote {', '.join(str(p) for p in written[:3])}" + (" ..." if len(written) > 3 else ""))


@app.command()
@guarded
def compare(
    paths: Optional[List[str]] = typer.Argument(
        None, metavar="[BASELINE NEW]", help="the run (or trace) to compare against, then the one to examine"
    ),
    new: Optional[str] = typer.Option(None, "-d", "--new", help="the run (or trace) to examine"),
    baseline: Optional[str] = typer.Option(None, "-bp", "--baseline", help="the run (or trace) to compare against"),
    out: Optional[str] = typer.Option(None, "-o", "--out", help="output directory (default: NEW/compare)"),
    by_shape: bool = typer.Option(False, "--by-shape", help="match operators by name and input shapes"),
    as_json: bool = typer.Option(False, "--json", help="print the comparison to stdout instead of writing files"),
    workers: Optional[int] = WORKERS_OPTION,
    top: int = typer.Option(20, "--top", min=1, help="operators shown in the terminal table"),
    ray: bool = RAY_OPTION,
):
    """What got slower between two runs: per stage and bucket, operators, collectives, memory peak.

    BASELINE NEW, or -d NEW -bp BASELINE; windows holding different numbers of units are compared per unit.
    """
    from pathlib import Path

    from ..compare import compare as run_compare
    from ..report.compare_files import write_compare
    from ..report.terminal import print_compare

    usage = (
        "usage: rlprof compare BASELINE NEW, or rlprof compare -d NEW -bp BASELINE, each a run directory, "
        "manifest, trace, Ascend directory or analysis.json"
    )
    names = ("-d", "-bp")
    if paths:
        given = [flag for flag, v in (("-d", new), ("-bp", baseline)) if v]
        if given:
            fail(f"paths given both as arguments and as {' and '.join(given)}; {usage}")
        if len(paths) != 2:
            fail(f"{len(paths)} path(s) given ({' '.join(paths)}), two needed; {usage}")
        (baseline, new), names = paths, ("NEW", "BASELINE")
    missing = [flag for flag, v in (("-d NEW", new), ("-bp BASELINE", baseline)) if not v]
    if missing:
        fail(f"{' and '.join(missing)} missing; {usage}")
    doc = run_compare(new, baseline, by_shape=by_shape, workers=workers, use_ray=ray, names=names)
    for warning in doc["warnings"]:
        typer.echo(f"rlprof: warning: {warning}", err=True)
    if as_json:
        typer.echo(json.dumps(doc))
        return
    print_compare(doc, top)
    written = write_compare(doc, Path(out) if out else default_out(Path(new), "compare"))
    typer.echo(f"wrote {', '.join(str(p) for p in written)}")


@app.command()
@guarded
def cluster(
    path: str = typer.Argument(..., help="a multi-rank run directory, manifest, or its analysis.json"),
    as_json: bool = typer.Option(False, "--json", help="print the result to stdout instead of writing files"),
    out: Optional[str] = typer.Option(None, "-o", "--out", help="output directory (default: PATH/cluster)"),
    threshold: float = typer.Option(
        0.15, "--threshold", min=0.0, help="excess compute (fraction of the other ranks' median) to suspect a rank"
    ),
    workers: Optional[int] = WORKERS_OPTION,
    ray: bool = RAY_OPTION,
):
    """Per rank and stage buckets, spread across ranks, and slow-rank detection with the evidence."""
    from pathlib import Path

    from ..analyze.pipeline import load_analysis
    from ..cluster import cluster as run_cluster
    from ..report.terminal import print_cluster

    result = run_cluster(load_analysis(path, workers=workers, use_ray=ray), threshold)
    for warning in result["warnings"]:
        typer.echo(f"rlprof: warning: {warning}", err=True)
    if as_json:
        typer.echo(json.dumps(result))
        return
    print_cluster(result)
    out_dir = Path(out) if out else default_out(Path(path), "cluster")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "cluster.json").write_text(json.dumps(result, indent=1))
    typer.echo(f"wrote {out_dir / 'cluster.json'}")


@app.command()
@guarded
def report(
    path: str = typer.Argument(..., help="a run directory, manifest, trace, Ascend directory or analysis.json"),
    baseline: Optional[str] = typer.Option(None, "-bp", "--baseline", help="add a compare section against this"),
    out: Optional[str] = typer.Option(None, "-o", "--out", help="the HTML file (default: PATH/report.html)"),
    workers: Optional[int] = WORKERS_OPTION,
    ray: bool = RAY_OPTION,
):
    """One self-contained HTML report: timeline, breakdown, operators, memory, cluster, compare."""
    from ..analyze.pipeline import load_analysis
    from ..analyze.inputs.salvage import salvage_lines
    from ..report import write_report

    # compare needs every operator of the run, so with a baseline it is read once with all of them kept
    doc = load_analysis(path, workers=workers, top=None if baseline else 50, use_ray=ray)
    for line in salvage_lines(doc.get("salvage") or []):  # first: the windows a crash left, recovered or lost
        typer.echo(f"rlprof: warning: {line}", err=True)
    target = write_report(path, out, baseline, doc=doc, workers=workers, use_ray=ray)
    typer.echo(f"report: {target} ({target.stat().st_size / 1e6:.1f} MB, opens offline)")


@app.command()
@guarded
def view(
    path: str = typer.Argument(..., help="a run directory"),
    host: str = typer.Option("127.0.0.1", "--host", help="address to bind (default loopback only)"),
    port: int = typer.Option(8765, "--port", min=0, max=65535, help="port (0: any free one)"),
):
    """Serve the run's report and its raw trace files locally (tunnel to it from a laptop)."""
    from pathlib import Path

    from ..report import write_report
    from ..report.viewer import make_server, tunnel_hint

    run_dir = Path(path)
    if not run_dir.is_dir():
        fail(f"{path} is not a directory; allowed: a run directory (holding manifest.jsonl or traces)")
    report_path = run_dir / "report.html"
    if not report_path.exists():
        write_report(run_dir, report_path)
    try:
        server = make_server(run_dir, report_path, host, port)
    except OSError as exc:
        fail(f"cannot listen on {host}:{port} ({exc.strerror}); allowed: a free port, or --port 0 for any")
    bound_host, bound_port = server.server_address[:2]
    typer.echo(f"serving {run_dir} at http://{bound_host}:{bound_port}/ (report) and /files/ (traces)", nl=True)
    typer.echo(tunnel_hint(bound_host, bound_port))
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


@app.command(name="slice")
@guarded
def slice_cmd(
    path: str = typer.Argument(..., help="a run directory, its manifest, or one trace file"),
    step: int = typer.Option(..., "--step", help="training step"),
    role: str = typer.Option(..., "--role", help="role: actor, rollout, ref, reward, critic"),
    stage: str = typer.Option(..., "--stage", help="stage, e.g. actor_update, rollout_generate"),
    micro_batch: Optional[int] = typer.Option(None, "--micro-batch", min=0, help="one marked micro-batch (0-based)"),
    decode_steps: Optional[str] = typer.Option(None, "--decode-steps", help="A:B, decode steps A..B-1 (0-based)"),
    window_ms: Optional[str] = typer.Option(None, "--window-ms", help="A:B, milliseconds from the stage start"),
    rank: Optional[int] = typer.Option(None, "--rank", min=0, help="rank (default: the lowest with that window)"),
    out: str = typer.Option(..., "-o", "--out", help="output trace (.json or .json.gz)"),
):
    """Write a small valid trace of one stage, micro-batch, decode-step range or time window."""
    from ..report.slice import Selection, parse_range, slice_trace

    chosen = [
        flag
        for flag, v in (("--micro-batch", micro_batch), ("--decode-steps", decode_steps), ("--window-ms", window_ms))
        if v is not None
    ]
    if len(chosen) > 1:
        fail(
            f"{' and '.join(chosen)} given together; allowed: at most one of --micro-batch, --decode-steps, --window-ms"
        )
    if not out.endswith((".json", ".json.gz")):
        fail(f"-o {out}: allowed: a file name ending in .json or .json.gz")
    sel = Selection(
        step,
        role,
        stage,
        micro_batch,
        parse_range(decode_steps, "--decode-steps") if decode_steps else None,
        parse_range(window_ms, "--window-ms", float) if window_ms else None,
        rank,
    )
    res = slice_trace(path, sel, out)
    typer.echo(
        f"wrote {res['out']}: {res['events']} of {res['of']} events, "
        f"{(res['end_us'] - res['start_us']) / 1e3:.3f} ms from {res['source']} ({res['bytes'] / 1e3:.1f} KB)"
    )


def _analyze_with_progress(run_analysis, path, workers, ray, quiet: bool, model: dict | None = None):
    """A progress bar over input files on stderr (long inputs); none with --json or when piped."""
    if model is not None:
        run_analysis = functools.partial(run_analysis, model=model)
    if quiet or ray:  # with --ray the nodes list the inputs, not this machine
        return run_analysis(path, workers=workers, use_ray=ray)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..analyze.inputs.find import find_inputs

    console = Console(stderr=True)
    if not console.is_terminal:
        return run_analysis(path, workers=workers, use_ray=ray)
    total = len(find_inputs(path))
    with Progress(
        TextColumn("[bold]analyze"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("analyze", total=total)
        doc = run_analysis(path, workers=workers, use_ray=ray, progress=lambda: bar.advance(task))
        bar.update(task, completed=total)
    return doc


@app.command(name="export")
@guarded
def export_cmd(
    run: str = typer.Argument(..., help="a run directory (finished or crashed) with a watch timeline or samples"),
    to: str = typer.Option(..., "--to", help="the tracker: tensorboard, wandb (offline) or mlflow (a local store)"),
    out: str = typer.Argument(..., metavar="DIR", help="where the tracker run is written"),
):
    """A past run as an experiment tracker's run: each step's rlprof measures (stage times and their spread over
    ranks, the rollout's samples, the trigger's verdicts and captures), its trainer metrics, and its findings."""
    from pathlib import Path

    from ..report.trackers import LOGGERS, Unavailable, export_run

    if to not in LOGGERS or to == "console":
        fail(f"--to {to!r} is not allowed; allowed: tensorboard, wandb, mlflow")
    try:
        done = export_run(Path(run), to, Path(out), say=lambda line: typer.echo(line, err=True))
    except Unavailable as exc:
        fail(str(exc))
    typer.echo(
        f"wrote {len(done['steps'])} steps ({len(done['keys'])} keys) and {done['findings']} findings of {run} "
        f"to {to} in {out}"
    )

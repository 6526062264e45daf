"""`rlprof` command line. Bad input: one line on stderr naming what is wrong, exit code 2."""

from __future__ import annotations

import json
import os
import sys
from typing import List, Optional

import typer

from .errors import RLProfError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Selective profiling for RL post-training of LLMs (GRPO/DAPO/PPO).")


def fail(message: str) -> None:
    typer.echo(f"rlprof: {message}", err=True)
    raise typer.Exit(2)


def _guarded(fn):
    """Turn rlprof's own errors into one line + exit 2 (no traceback)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RLProfError as exc:
            fail(str(exc))

    return wrapper


# Options shared by every command that reads traces: declared once.
RAY_OPTION = typer.Option(False, "--ray", help="analyse each file on the Ray node that holds it (RAY_ADDRESS)")
WORKERS_OPTION = typer.Option(None, "--workers", min=1, help="local processes (default: all cores)")


@app.command()
@_guarded
def plan(
    args: Optional[List[str]] = typer.Argument(None, help="[CONFIG.yaml] then Hydra-style key=value overrides"),
    rank: int = typer.Option(0, "--rank", help="rank to resolve for (rollout: replica index in async mode)"),
    world_size: int = typer.Option(1, "--world-size", help="number of processes in the job"),
    as_json: bool = typer.Option(False, "--json", help="print the resolved plan as JSON"),
    device: str = typer.Option("auto", "--device", help="resolve as on a machine with: auto, cpu, cuda, npu"),
    verl_version: Optional[str] = typer.Option(None, "--verl-version",
                                               help="read a verl config with this release's meaning: 0.9.0, 0.9.1, "
                                                    "0.10.0.dev (default: detected from the config, else the "
                                                    "current head, 0.10.0.dev)"),
):
    """Dry run: resolve a profiling config and show what will be collected, where."""
    from .config import load_plan, machine_warnings
    from .config.describe import plan_json, plan_words
    from .config.source import split_config_args

    if device not in ("auto", "cpu", "cuda", "npu"):
        fail(f"--device {device!r} is not allowed; allowed: auto, cpu, cuda, npu")
    if rank < 0 or world_size < 1:
        fail(f"--rank must be >= 0 and --world-size >= 1 (got {rank}, {world_size})")
    config, overrides = split_config_args(list(args or []))
    dev = None if device == "auto" else device
    resolved = load_plan(config, overrides, device=dev, verl_version=verl_version)
    warnings = machine_warnings(resolved, dev)
    if as_json:
        typer.echo(json.dumps(plan_json(resolved, rank=rank, world_size=world_size, warnings=warnings), indent=2))
    else:
        typer.echo(plan_words(resolved, rank=rank, world_size=world_size, warnings=warnings))


DEMO_DEFAULTS = ["global_profiler.tool=torch", "global_profiler.steps=[2]",
                 "actor_rollout_ref.actor.profiler.enable=true"]


@app.command()
@_guarded
def demo(
    args: Optional[List[str]] = typer.Argument(None, help="[CONFIG.yaml] then key=value overrides"),
    steps: int = typer.Option(3, "--steps", min=1, help="training steps to run"),
):
    """Run a small profiled RL-shaped loop on this machine and list what it collected."""
    from .collect.manifest import read_rows
    from .config import load_config, resolve_plan
    from .config.source import split_config_args

    config, overrides = split_config_args(list(args or []))
    data = load_config(config, (DEMO_DEFAULTS if config is None else []) + overrides)
    resolved = resolve_plan(data)
    from .collect import Profiler
    from .collect.foreign_logs import foreign_log_filter
    from .demo import DemoShape, run_demo

    prof = Profiler(resolved)
    with foreign_log_filter(), prof:
        rewards = run_demo(prof, DemoShape(steps=steps))
    typer.echo(f"demo: {steps} steps, mean reward per step: " + ", ".join(f"{r:.3f}" for r in rewards))
    run_dirs = sorted({prof.run_dir(r.role) for r in resolved.roles if r.enabled})
    for run_dir in run_dirs:
        if (run_dir / "manifest.jsonl").exists():
            _print_manifest(run_dir, read_rows(run_dir))
    if not prof.windows_written:
        typer.echo("no windows were collected (the plan selects nothing on this process)")


@app.command(context_settings={"allow_extra_args": False})
@_guarded
def train(
    args: Optional[List[str]] = typer.Argument(None, help="[CONFIG.yaml] then key=value overrides"),
    verbose: bool = typer.Option(False, "--verbose", help="keep the profiler's own C++ log lines (Kineto's)"),
):
    """Train GRPO/DAPO on a tiny model built from a config, profiled by the plan in the same config.

    With no profiling keys, step 2 is profiled with the torch tool. Under torchrun
    (`torchrun --nproc_per_node 2 -m rlprof.trainer ...`) each rank trains its data-parallel shard.
    """
    from .config.source import split_config_args
    from .trainer.launch import main as train_main

    config, overrides = split_config_args(list(args or []))
    if verbose:
        os.environ["RLPROF_VERBOSE"] = "1"
    raise typer.Exit(train_main(config, overrides))


@app.command()
@_guarded
def analyze(
    path: str = typer.Argument(..., help="a run directory, a manifest.jsonl, or one trace file"),
    as_json: bool = typer.Option(False, "--json", help="print the analysis to stdout instead of writing files"),
    export: str = typer.Option("csv", "--export", help="tables as: csv (one file each) or db (one DuckDB file)"),
    out: Optional[str] = typer.Option(None, "-o", "--out", help="output directory (default: next to the input)"),
    ray: bool = RAY_OPTION,
    workers: Optional[int] = WORKERS_OPTION,
):
    """Per (step, role, stage, rank) time breakdown, top operators and kernels, collectives, memory.

    Given an analysis.json, reads it back (checked against its schema) and writes its tables again.
    """
    from pathlib import Path

    from .analyze.pipeline import analyze as run_analysis
    from .analyze.inputs import is_analysis_file
    from .analyze.result import Analysis

    if export not in ("csv", "db"):
        fail(f"--export {export!r} is not allowed; allowed: csv, db")
    if is_analysis_file(Path(path)):
        analysis = Analysis.load(path)
        doc = analysis.to_dict()
    else:
        doc = _analyze_with_progress(run_analysis, path, workers, ray, quiet=as_json)
        analysis = Analysis.from_document(doc)  # the document as its types say (an unknown key is an error)
    for warning in doc["warnings"]:
        typer.echo(f"rlprof: warning: {warning}", err=True)
    if as_json:
        typer.echo(analysis.to_json())
        return
    from .analyze.export import write_analysis
    from .report.terminal import print_analysis

    out_dir = Path(out) if out else _default_out(Path(path), "analysis")
    written = write_analysis(doc, out_dir, export, document_json=analysis.to_json(indent=1))
    print_analysis(doc)
    typer.echo(f"wrote {', '.join(str(p) for p in written[:3])}" + (" ..." if len(written) > 3 else ""))


@app.command()
@_guarded
def compare(
    new: Optional[str] = typer.Option(None, "-d", "--new", help="the run (or trace) to examine"),
    baseline: Optional[str] = typer.Option(None, "-bp", "--baseline", help="the run (or trace) to compare against"),
    out: Optional[str] = typer.Option(None, "-o", "--out", help="output directory (default: NEW/compare)"),
    by_shape: bool = typer.Option(False, "--by-shape", help="match operators by name and input shapes"),
    as_json: bool = typer.Option(False, "--json", help="print the comparison to stdout instead of writing files"),
    workers: Optional[int] = WORKERS_OPTION,
    top: int = typer.Option(20, "--top", min=1, help="operators shown in the terminal table"),
    ray: bool = RAY_OPTION,
):
    """What got slower between two runs: per stage and bucket, operators, collectives, memory peak."""
    from pathlib import Path

    from .compare import compare as run_compare
    from .report.compare_files import write_compare
    from .report.terminal import print_compare

    missing = [flag for flag, v in (("-d NEW", new), ("-bp BASELINE", baseline)) if not v]
    if missing:
        fail(f"{' and '.join(missing)} missing; usage: rlprof compare -d NEW -bp BASELINE, each a run directory, "
             "manifest, trace, Ascend directory or analysis.json")
    doc = run_compare(new, baseline, by_shape=by_shape, workers=workers, use_ray=ray)
    for warning in doc["warnings"]:
        typer.echo(f"rlprof: warning: {warning}", err=True)
    if as_json:
        typer.echo(json.dumps(doc))
        return
    print_compare(doc, top)
    written = write_compare(doc, Path(out) if out else _default_out(Path(new), "compare"))
    typer.echo(f"wrote {', '.join(str(p) for p in written)}")


@app.command()
@_guarded
def cluster(
    path: str = typer.Argument(..., help="a multi-rank run directory, manifest, or its analysis.json"),
    as_json: bool = typer.Option(False, "--json", help="print the result to stdout instead of writing files"),
    out: Optional[str] = typer.Option(None, "-o", "--out", help="output directory (default: PATH/cluster)"),
    threshold: float = typer.Option(0.15, "--threshold", min=0.0,
                                    help="excess compute (fraction of the other ranks' median) to suspect a rank"),
    workers: Optional[int] = WORKERS_OPTION,
    ray: bool = RAY_OPTION,
):
    """Per rank and stage buckets, spread across ranks, and slow-rank detection with the evidence."""
    from pathlib import Path

    from .analyze.pipeline import load_analysis
    from .cluster import cluster as run_cluster
    from .report.terminal import print_cluster

    result = run_cluster(load_analysis(path, workers=workers, use_ray=ray), threshold)
    for warning in result["warnings"]:
        typer.echo(f"rlprof: warning: {warning}", err=True)
    if as_json:
        typer.echo(json.dumps(result))
        return
    print_cluster(result)
    out_dir = Path(out) if out else _default_out(Path(path), "cluster")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "cluster.json").write_text(json.dumps(result, indent=1))
    typer.echo(f"wrote {out_dir / 'cluster.json'}")


@app.command()
@_guarded
def advise(
    run: Optional[str] = typer.Argument(None, help="a profiled run (markers mode is enough), verl or MindSpeed-RL output"),
    budget: str = typer.Option("2MB", "--budget", help="bytes one collecting rank may write, e.g. 2MB, 500KB"),
    dialect: str = typer.Option("rlprof", "--dialect", help="write the config as: verl, mindspeed, rlprof"),
    out: Optional[str] = typer.Option(None, "-o", "--out", help="the next config (default: print it)"),
    save_path: str = typer.Option("outputs/profile", "--save-path", help="where the next run writes its traces"),
    check: Optional[str] = typer.Option(None, "--check", help="a run made with the advice: predicted vs actual"),
    advice_file: Optional[str] = typer.Option(None, "--advice",
                                              help="with --check: the advice JSON written beside -o (NEXT.advice.json)"),
    fix: bool = typer.Option(False, "--fix", help="write the overrides that apply the first cause's first lever, "
                                                  "with values from the run, instead of the next profiling config"),
    cause: Optional[str] = typer.Option(None, "--cause", help="with --fix: the cause to fix (default: the first "
                                                              "the findings rank), e.g. slow_reward"),
):
    """The next profiling config: the stage, step and ranks the findings point at, sampled to fit the budget. With
    --fix: the next training config, the overrides that act on the first cause."""
    if cause and not fix:
        fail("--cause goes with --fix (the cause whose lever to write)")
    if fix:
        if check:
            fail("--fix and --check are separate: --fix writes the next training config, --check compares a run "
                 "with the next profiling config")
        if run is None:
            fail("advise --fix needs RUN (a profiled run)")
        _advise_fix(run, dialect, cause, out)
    elif check:
        if not advice_file:
            fail("--check needs --advice NEXT.advice.json (written beside the config by `rlprof advise -o NEXT.yaml`)")
        _advise_check(check, advice_file)
    elif run is None:
        fail("advise needs RUN (a profiled run) or --check NEW_RUN --advice NEXT.advice.json")
    else:
        _advise_next(run, budget, dialect, out, save_path)


def _advise_fix(run: str, dialect: str, cause: Optional[str], out: Optional[str]) -> None:
    """advise --fix: the overrides that act on the first cause, printed or written with their sidecar."""
    from pathlib import Path

    from .advise import fix_for_run, fix_text
    from .report.terminal import print_fix

    result = fix_for_run(run, dialect, cause)
    print_fix(result)
    if result["fix"] is None:
        typer.echo("nothing written" + (f" ({out} not created)" if out else ""))
        return
    text = fix_text(result)
    if out:
        Path(out).write_text(text)
        sidecar = Path(out).with_suffix(".fix.json")
        sidecar.write_text(json.dumps(result, indent=1, default=str))
        how = f"rlprof train {out}" if dialect == "rlprof" else "merge it into the run's config, or pass the line above"
        typer.echo(f"wrote {out} (and {sidecar}); apply it: {how}")
    else:
        typer.echo("---\n" + text)


def _advise_check(new_run: str, advice_file: str) -> None:
    """advise --check: a run made with the advice against the size it predicted."""
    from pathlib import Path

    from .advise import check
    from .report.terminal import print_check

    try:
        advice = json.loads(Path(advice_file).read_text())
    except (OSError, ValueError) as exc:
        fail(f"--advice {advice_file}: not an advice file ({exc}); allowed: the NEXT.advice.json advise wrote")
    print_check(check(new_run, advice))


def _advise_next(run: str, budget: str, dialect: str, out: Optional[str], save_path: str) -> None:
    """advise RUN: the next profiling config, printed or written with its advice sidecar."""
    from pathlib import Path

    from omegaconf import OmegaConf

    from .advise import advise as next_config, parse_size
    from .config import resolve_plan
    from .config.describe import plan_words
    from .report.terminal import print_advice

    result = next_config(run, parse_size(budget), dialect, save_path)
    text = OmegaConf.to_yaml(OmegaConf.create(result["config"]))
    header = (f"# rlprof advise ({dialect} dialect) from {run}\n# target: {result['target']['stage']} at step "
              f"{result['target']['step']}, ranks {result['target']['ranks']}; predicted "
              f"{result['predicted_bytes'] / 1e6:.3f} MB (budget {result['budget_bytes'] / 1e6:.3f} MB per rank)\n")
    print_advice(result, plan_words(resolve_plan(result["config"], device="cpu"), rank=result["target"]["ranks"][0],
                                    world_size=max(result["target"]["ranks"]) + 1))
    if out:
        Path(out).write_text(header + text)
        sidecar = Path(out).with_suffix(".advice.json")
        sidecar.write_text(json.dumps(result, indent=1, default=str))
        typer.echo(f"wrote {out} (and {sidecar}); run it: rlprof train {out}; then: rlprof advise --check "
                   f"<its run dir> --advice {sidecar}")
    else:
        typer.echo("---\n" + header + text)


@app.command()
@_guarded
def report(
    path: str = typer.Argument(..., help="a run directory, manifest, trace, Ascend directory or analysis.json"),
    baseline: Optional[str] = typer.Option(None, "-bp", "--baseline", help="add a compare section against this"),
    out: Optional[str] = typer.Option(None, "-o", "--out", help="the HTML file (default: PATH/report.html)"),
    workers: Optional[int] = WORKERS_OPTION,
    ray: bool = RAY_OPTION,
):
    """One self-contained HTML report: timeline, breakdown, operators, memory, cluster, compare."""
    from .report import write_report

    target = write_report(path, out, baseline, workers=workers, use_ray=ray)
    typer.echo(f"report: {target} ({target.stat().st_size / 1e6:.1f} MB, opens offline)")


@app.command()
@_guarded
def view(
    path: str = typer.Argument(..., help="a run directory"),
    host: str = typer.Option("127.0.0.1", "--host", help="address to bind (default loopback only)"),
    port: int = typer.Option(8765, "--port", min=0, max=65535, help="port (0: any free one)"),
):
    """Serve the run's report and its raw trace files locally (tunnel to it from a laptop)."""
    from pathlib import Path

    from .report import write_report
    from .report.viewer import make_server, tunnel_hint

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
@_guarded
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
    from .report.slice import Selection, parse_range, slice_trace

    chosen = [flag for flag, v in (("--micro-batch", micro_batch), ("--decode-steps", decode_steps),
                                   ("--window-ms", window_ms)) if v is not None]
    if len(chosen) > 1:
        fail(f"{' and '.join(chosen)} given together; allowed: at most one of --micro-batch, --decode-steps, "
             "--window-ms")
    if not out.endswith((".json", ".json.gz")):
        fail(f"-o {out}: allowed: a file name ending in .json or .json.gz")
    sel = Selection(step, role, stage, micro_batch,
                    parse_range(decode_steps, "--decode-steps") if decode_steps else None,
                    parse_range(window_ms, "--window-ms", float) if window_ms else None, rank)
    res = slice_trace(path, sel, out)
    typer.echo(f"wrote {res['out']}: {res['events']} of {res['of']} events, "
               f"{(res['end_us'] - res['start_us']) / 1e3:.3f} ms from {res['source']} ({res['bytes'] / 1e3:.1f} KB)")


@app.command()
@_guarded
def capture(
    run_dir: str = typer.Argument(..., help="the run directory the job printed at its start (or its save_path)"),
    next_step: bool = typer.Option(False, "--next", help="capture the next step (the default)"),
    step: Optional[int] = typer.Option(None, "--step", help="capture this step (1-based; not one that has passed)"),
    role: Optional[str] = typer.Option(None, "--role", help="the role whose windows to take (default: every role)"),
    stage: Optional[str] = typer.Option(None, "--stage", help="the stage to capture (default: the whole step)"),
    ranks: Optional[str] = typer.Option(None, "--ranks", help="comma-separated ranks (default: the role's ranks)"),
    wait: float = typer.Option(60.0, "--wait", min=0, help="seconds to wait for the capture (0: ask and return)"),
):
    """Ask a running job (its plan has global_profiler.trigger.request: true) to capture a step now."""
    from .collect.request import check_request, live_run, submit, wait_answer

    if next_step and step is not None:
        fail("capture: --next and --step N are exclusive; give one")
    rank_list = None
    if ranks is not None:
        try:
            rank_list = sorted({int(r) for r in ranks.split(",") if r.strip()})
        except ValueError:
            fail(f"capture: --ranks {ranks!r} is not allowed; allowed: comma-separated integer ranks, e.g. 0,1")
    path, live = live_run(run_dir)
    check_request(live, step=step, role=role, stage=stage, ranks=rank_list)
    rid = submit(path, step=step, role=role, stage=stage, ranks=rank_list)
    what = f"{role or 'every role'}/{stage or 'the whole step'}"
    if wait <= 0:
        typer.echo(f"asked {path} for a capture of {what} (request {rid}); the job takes it at its next step end")
        return
    answer, rows = wait_answer(path, rid, wait)
    if answer is None:
        fail(f"capture: the job on {path} did not pick the request up within {wait:g} s (request {rid} stands)")
    if answer["status"] == "refused":
        fail(f"capture: refused by the job: {answer['reason']}")
    if answer["status"] == "armed":
        typer.echo(f"armed: step {answer['at_step']} {what} on ranks {answer['ranks']}; not captured within "
                   f"{wait:g} s (request {rid})")
        return
    typer.echo(f"captured step {answer['at_step']} {what} on ranks {answer['ranks']} in {path}:")
    for r in sorted(rows, key=lambda r: (r["rank"], r["stage"])):
        typer.echo(f"  rank {r['rank']} {r['role']}/{r['stage']}: {r['path']} ({r['bytes']} bytes, {r['status']})")
    if rows and {r["rank"] for r in rows} < set(answer["ranks"]):
        typer.echo(f"  (not every rank's row was in within {wait:g} s)")


def _default_out(src, name: str):
    """Beside the input: RUN/<name> for a directory, <trace stem>_<name> for a file."""
    if src.is_dir():
        return src / name
    return src.parent / (src.name.split(".")[0] + f"_{name}")


def _analyze_with_progress(run_analysis, path, workers, ray, quiet: bool):
    """A progress bar over input files on stderr (long inputs); none with --json or when piped."""
    if quiet or ray:  # with --ray the nodes list the inputs, not this machine
        return run_analysis(path, workers=workers, use_ray=ray)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .analyze.inputs import find_inputs

    console = Console(stderr=True)
    if not console.is_terminal:
        return run_analysis(path, workers=workers, use_ray=ray)
    total = len(find_inputs(path))
    with Progress(TextColumn("[bold]analyze"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task("analyze", total=total)
        doc = run_analysis(path, workers=workers, use_ray=ray, progress=lambda: bar.advance(task))
        bar.update(task, completed=total)
    return doc


def _print_manifest(run_dir, rows) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"windows in {run_dir}")
    for col in ("step", "role", "stage", "rank", "tool", "mode", "window", "status", "bytes", "path"):
        table.add_column(col)
    for r in rows:
        table.add_row(*(str(r.get(c)) for c in ("step", "role", "stage", "rank", "tool", "mode", "window", "status",
                                                 "bytes", "path")))
    Console(width=max(140, Console().width)).print(table)


def main() -> None:
    # Kineto logs every profiler start/stop at info level; it reads this once, when torch loads.
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    try:
        app()
    except RLProfError as exc:  # pragma: no cover - commands already turn these into exit 2
        print(f"rlprof: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()

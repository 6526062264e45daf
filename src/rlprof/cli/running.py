"""The commands that plan and run jobs: plan (a dry run), demo, train, and capture (a step of a running job)."""

from __future__ import annotations

import json
import os
from typing import List, Optional

import typer

from .app import app, fail, guarded


@app.command()
@guarded
def plan(
    args: Optional[List[str]] = typer.Argument(None, help="[CONFIG.yaml] then Hydra-style key=value overrides"),
    rank: int = typer.Option(0, "--rank", help="rank to resolve for (rollout: replica index in async mode)"),
    world_size: int = typer.Option(1, "--world-size", help="number of processes in the job"),
    as_json: bool = typer.Option(False, "--json", help="print the resolved plan as JSON"),
    device: str = typer.Option("auto", "--device", help="resolve as on a machine with: auto, cpu, cuda, npu"),
    verl_version: Optional[str] = typer.Option(
        None,
        "--verl-version",
        help="read a verl config with this release's meaning: 0.9.0, 0.9.1, "
        "0.10.0.dev (default: detected from the config, else the "
        "current head, 0.10.0.dev)",
    ),
):
    """Dry run: resolve a profiling config and show what will be collected, where."""
    from ..config import load_plan, machine_warnings
    from ..config.describe import plan_json, plan_words
    from ..config.source import split_config_args

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


DEMO_DEFAULTS = [
    "global_profiler.tool=torch",
    "global_profiler.steps=[2]",
    "actor_rollout_ref.actor.profiler.enable=true",
]


@app.command()
@guarded
def demo(
    args: Optional[List[str]] = typer.Argument(None, help="[CONFIG.yaml] then key=value overrides"),
    steps: int = typer.Option(3, "--steps", min=1, help="training steps to run"),
):
    """Run a small profiled RL-shaped loop on this machine and list what it collected."""
    from ..collect.manifest import read_rows
    from ..config import load_config, resolve_plan
    from ..config.source import split_config_args

    config, overrides = split_config_args(list(args or []))
    data = load_config(config, (DEMO_DEFAULTS if config is None else []) + overrides)
    resolved = resolve_plan(data)
    from ..collect import Profiler
    from ..collect.foreign_logs import foreign_log_filter
    from ..demo import DemoShape, run_demo

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
@guarded
def train(
    args: Optional[List[str]] = typer.Argument(None, help="[CONFIG.yaml] then key=value overrides"),
    verbose: bool = typer.Option(False, "--verbose", help="keep the profiler's own C++ log lines (Kineto's)"),
):
    """Train GRPO/DAPO on a tiny model built from a config, profiled by the plan in the same config.

    With no profiling keys, step 2 is profiled with the torch tool. Under torchrun
    (`torchrun --nproc_per_node 2 -m rlprof.trainer ...`) each rank trains its data-parallel shard.
    """
    from ..config.source import split_config_args
    from ..trainer.launch import main as train_main

    config, overrides = split_config_args(list(args or []))
    if verbose:
        os.environ["RLPROF_VERBOSE"] = "1"
    raise typer.Exit(train_main(config, overrides))


@app.command()
@guarded
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
    from ..collect.request import check_request, live_run, submit, wait_answer

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
    got = wait_answer(path, rid, wait)
    answer, rows = got.answer, got.rows
    if answer is None:
        fail(f"capture: the job on {path} did not pick the request up within {wait:g} s (request {rid} stands)")
    if answer["status"] == "refused":
        fail(f"capture: refused by the job: {answer['reason']}")
    if answer["status"] == "armed":
        typer.echo(
            f"armed: step {answer['at_step']} {what} on ranks {answer['ranks']}; not captured within "
            f"{wait:g} s (request {rid})"
        )
        return
    typer.echo(f"captured step {answer['at_step']} {what} on ranks {answer['ranks']} in {path}:")
    for r in sorted(rows, key=lambda r: (r["rank"], r["role"] or "", r["stage"] or "", r.get("window") or 0)):
        typer.echo(f"  rank {r['rank']} {r['role']}/{r['stage']}: {r['path']} ({r['bytes']} bytes, {r['status']})")
    if not got.whole:  # the answer covers the whole capture: what is not listed yet is named
        typer.echo(f"  still being written when the wait ended ({wait:g} s, or the job ended):")
        for name in got.pending or ["windows the job has not named yet (it had not settled the capture)"]:
            typer.echo(f"    {name}")


def _print_manifest(run_dir, rows) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"windows in {run_dir}")
    for col in ("step", "role", "stage", "rank", "tool", "mode", "window", "status", "bytes", "path"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            *(
                str(r.get(c))
                for c in ("step", "role", "stage", "rank", "tool", "mode", "window", "status", "bytes", "path")
            )
        )
    Console(width=max(140, Console().width)).print(table)

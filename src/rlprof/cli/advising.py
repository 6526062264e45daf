"""`rlprof advise`: one command, three modes (advise/ holds one module per mode): the next profiling config for a
budget, --check of a run made with it, and --fix, the next training config."""

from __future__ import annotations

import json
from typing import Optional

import typer

from .app import app, fail, guarded


@app.command()
@guarded
def advise(
    run: Optional[str] = typer.Argument(
        None, help="a profiled run (markers mode is enough), verl or MindSpeed-RL output"
    ),
    budget: str = typer.Option("2MB", "--budget", help="bytes one collecting rank may write, e.g. 2MB, 500KB"),
    dialect: str = typer.Option("rlprof", "--dialect", help="write the config as: verl, mindspeed, rlprof"),
    out: Optional[str] = typer.Option(None, "-o", "--out", help="the next config (default: print it)"),
    save_path: str = typer.Option("outputs/profile", "--save-path", help="where the next run writes its traces"),
    check: Optional[str] = typer.Option(None, "--check", help="a run made with the advice: predicted vs actual"),
    advice_file: Optional[str] = typer.Option(
        None, "--advice", help="with --check: the advice JSON written beside -o (NEXT.advice.json)"
    ),
    fix: bool = typer.Option(
        False,
        "--fix",
        help="write the overrides that apply the first cause's first lever, "
        "with values from the run, instead of the next profiling config",
    ),
    cause: Optional[str] = typer.Option(
        None, "--cause", help="with --fix: the cause to fix (default: the first the findings rank), e.g. slow_reward"
    ),
    plan: bool = typer.Option(
        False,
        "--plan",
        help="with --fix: every cause's first lever at once, one consistent config, and the plan's saving",
    ),
):
    """The next profiling config: the stage, step and ranks the findings point at, sampled to fit the budget. With
    --fix: the next training config, the overrides that act on the first cause."""
    if cause and not fix:
        fail("--cause goes with --fix (the cause whose lever to write)")
    if plan and not fix:
        fail("--plan goes with --fix (every cause's first lever, written together)")
    if fix:
        if check:
            fail(
                "--fix and --check are separate: --fix writes the next training config, --check compares a run "
                "with the next profiling config"
            )
        if run is None:
            fail("advise --fix needs RUN (a profiled run)")
        _advise_fix(run, dialect, cause, out, plan)
    elif check:
        if not advice_file:
            fail("--check needs --advice NEXT.advice.json (written beside the config by `rlprof advise -o NEXT.yaml`)")
        _advise_check(check, advice_file)
    elif run is None:
        fail("advise needs RUN (a profiled run) or --check NEW_RUN --advice NEXT.advice.json")
    else:
        _advise_next(run, budget, dialect, out, save_path)


def _advise_fix(run: str, dialect: str, cause: Optional[str], out: Optional[str], plan: bool = False) -> None:
    """advise --fix: the overrides that act on the first cause (every cause: --plan), printed or written with their
    sidecar."""
    from pathlib import Path

    from ..advise import fix_for_run, fix_text
    from ..report.terminal import print_fix

    result = fix_for_run(run, dialect, cause, plan)
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

    from ..advise import check
    from ..report.terminal import print_check

    try:
        advice = json.loads(Path(advice_file).read_text())
    except (OSError, ValueError) as exc:
        fail(f"--advice {advice_file}: not an advice file ({exc}); allowed: the NEXT.advice.json advise wrote")
    print_check(check(new_run, advice))


def _advise_next(run: str, budget: str, dialect: str, out: Optional[str], save_path: str) -> None:
    """advise RUN: the next profiling config, printed or written with its advice sidecar."""
    from pathlib import Path

    from omegaconf import OmegaConf

    from ..advise import advise as next_config, parse_size
    from ..config import resolve_plan
    from ..config.describe import plan_words
    from ..report.terminal import print_advice

    result = next_config(run, parse_size(budget), dialect, save_path)
    text = OmegaConf.to_yaml(OmegaConf.create(result["config"]))
    header = (
        f"# rlprof advise ({dialect} dialect) from {run}\n# target: {result['target']['stage']} at step "
        f"{result['target']['step']}, ranks {result['target']['ranks']}; predicted "
        f"{result['predicted_bytes'] / 1e6:.3f} MB (budget {result['budget_bytes'] / 1e6:.3f} MB per rank)\n"
    )
    print_advice(
        result,
        plan_words(
            resolve_plan(result["config"], device="cpu"),
            rank=result["target"]["ranks"][0],
            world_size=max(result["target"]["ranks"]) + 1,
        ),
    )
    if out:
        Path(out).write_text(header + text)
        sidecar = Path(out).with_suffix(".advice.json")
        sidecar.write_text(json.dumps(result, indent=1, default=str))
        typer.echo(
            f"wrote {out} (and {sidecar}); run it: rlprof train {out}; then: rlprof advise --check "
            f"<its run dir> --advice {sidecar}"
        )
    else:
        typer.echo("---\n" + header + text)

"""What every subcommand shares: the Typer app, the one-line failure, the guard that turns rlprof's errors into it,
the options declared once, and where outputs go by default."""

from __future__ import annotations

import typer

from ..errors import RLProfError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Selective profiling for RL post-training of LLMs (GRPO/DAPO/PPO).",
)


def fail(message: str) -> None:
    typer.echo(f"rlprof: {message}", err=True)
    raise typer.Exit(2)


def guarded(fn):
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


def default_out(src, name: str):
    """Beside the input: RUN/<name> for a directory, <trace stem>_<name> for a file."""
    if src.is_dir():
        return src / name
    return src.parent / (src.name.split(".")[0] + f"_{name}")

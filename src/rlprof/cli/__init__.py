"""`rlprof` command line: one command, a subcommand per job. Bad input: one line on stderr naming what is wrong,
exit code 2. `app.py` holds what the subcommands share; each module below registers its commands on the app."""

from __future__ import annotations

import os
import sys

from ..errors import RLProfError
from . import running, reading, advising  # noqa: F401, I001  (each registers its subcommands on the app, in this order)
from .app import app


def main() -> None:
    # Kineto logs every profiler start/stop at info level; it reads this once, when torch loads.
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    try:
        app()
    except RLProfError as exc:  # pragma: no cover - commands already turn these into exit 2
        print(f"rlprof: {exc}", file=sys.stderr)
        sys.exit(2)


__all__ = ["app", "main"]

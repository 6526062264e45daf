"""Leaving a torchrun job cleanly.

Gloo keeps C++ worker threads that can abort the interpreter while it finalises ("terminate called
without an active exception", a known PyTorch issue) even after destroy_process_group(). A rank
that has finished, flushed and torn down its process group therefore exits at once.
"""

from __future__ import annotations

import os
import sys


def exit_distributed_rank(code: int) -> None:
    """Flush and exit now if this process was a torchrun rank; otherwise return."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def module_entry(run, argv: list[str] | None = None) -> int:
    """`python -m ...` entry: [CONFIG] [key=value ...] -> run(config, overrides) -> exit code.

    rlprof's own errors become one line and code 2; a torchrun rank exits right away when done.
    """
    from ..config.source import split_config_args
    from ..errors import RLProfError

    config, overrides = split_config_args(list(sys.argv[1:] if argv is None else argv))
    try:
        code = run(config, overrides)
    except RLProfError as exc:
        print(f"rlprof: {exc}", file=sys.stderr)
        code = 2
    exit_distributed_rank(code)
    return code

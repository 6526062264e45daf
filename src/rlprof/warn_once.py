"""A warning said once: the one helper for every rlprof warning that would otherwise repeat (a backend fault on every
step, a verl worker's every stage, every process of a vLLM engine).

Standard library only: the framework plugins' entry points use it before anything else of rlprof is imported.
"""

from __future__ import annotations

import logging
import os
import zlib

log = logging.getLogger("rlprof")

ENV_SAID = "RLPROF_SAID"  # the keys said by this process and the ones that started it (`inherit`)
_said_here: set = set()  # the keys said in this process (the default scope)


def warn_once(key, message: str, *args, said: set | None = None, inherit: bool = False) -> bool:
    """Log `message % args` as a warning on rlprof's logger unless `key` (None: the message itself) was said before;
    True when said now.

    `said`: the keys already said in a narrower scope (one Profiler's), default the whole process. `inherit`: the
    key is also marked in the environment, so that the processes started from here after it (vLLM's EngineCore and
    workers) do not say it again, nor anything this process inherited the mark of."""
    if key is None:
        key = message % args if args else message
    if inherit:
        marks = os.environ.get(ENV_SAID, "")
        mark = format(zlib.crc32(str(key).encode()), "x")  # the same in every process (hash() is salted)
        if mark in marks.split(","):
            return False
        os.environ[ENV_SAID] = f"{marks},{mark}" if marks else mark
    else:
        seen = _said_here if said is None else said
        if key in seen:
            return False
        seen.add(key)
    log.warning(message, *args)
    return True


__all__ = ["warn_once", "ENV_SAID"]

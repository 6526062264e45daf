"""File names torch's own profiler handlers write, which carry the writing host (no torch import).

`torch.profiler.tensorboard_trace_handler` (used by vLLM, SGLang and many trainers) names a trace
`{worker_name}.{time_ns}.pt.trace.json[.gz]` with worker_name `{hostname}_{pid}` by default; torch_npu's
`tensorboard_trace_handler` makes one directory per process, `{hostname}_{pid}_{timestamp}_ascend_pt`.
"""

from __future__ import annotations

import re
from pathlib import Path

TRACE_HANDLER_NAME = re.compile(r"^(?P<host>.+)_(?P<pid>\d+)\.(?P<ts>\d+)\.pt\.trace\.json(?:\.gz)?$")
ASCEND_PT_DIR = re.compile(r"^(?P<host>.+)_(?P<pid>\d+)_(?P<ts>\d+)_ascend_pt$")


def host_of(path: Path) -> str | None:
    """The host a trace file (or an Ascend collection, or a file inside one) was written on, where its name
    says so; None otherwise."""
    path = Path(path)
    match = TRACE_HANDLER_NAME.match(path.name)
    if match:
        return match.group("host")
    for part in (path, *path.parents):
        match = ASCEND_PT_DIR.match(part.name)
        if match:
            return match.group("host")
    return None

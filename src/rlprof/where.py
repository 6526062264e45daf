"""Which machine this process runs on: its host name, and its Ray node when it runs on one (data only; no
Ray import: Ray is asked only when the process already uses it). Collection records it per window, analysis
per input."""

from __future__ import annotations

import socket
import sys


def this_process() -> dict:
    node_id = None
    ray = sys.modules.get("ray")
    if ray is not None:
        try:
            if ray.is_initialized():
                node_id = ray.get_runtime_context().get_node_id()
        except Exception:  # an old or partial Ray: the host name still says where
            node_id = None
    return {"host": socket.gethostname(), "node_id": node_id}

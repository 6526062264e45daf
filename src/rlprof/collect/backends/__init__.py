"""Backends by tool name. Imported lazily: a CPU machine never imports torch_npu or nvtx."""

from __future__ import annotations

import importlib.util

from ...vocab import TOOLS
from .base import Backend, Output, WindowSpec


def backend_class(tool: str) -> type[Backend]:
    if tool == "torch":
        from .torch_backend import TorchBackend as cls
    elif tool == "torch_memory":
        from .torch_memory import TorchMemoryBackend as cls
    elif tool == "nsys":
        from .nsys import NsysBackend as cls
    elif tool == "npu":
        from .npu import NpuBackend as cls
    elif tool == "markers":
        from .markers import MarkersBackend as cls
    else:
        raise KeyError(tool)
    return cls


def why_unavailable(tool: str) -> str | None:
    """Why this machine cannot collect with `tool`, or None."""
    if tool not in TOOLS:
        return f"tool {tool} has no rlprof backend (it is another framework's tool)"
    if tool == "npu" and importlib.util.find_spec("torch_npu") is None:
        return "tool npu needs torch_npu (Ascend), which is not installed on this machine"
    if tool in ("nsys", "torch_memory"):
        import torch

        if not torch.cuda.is_available():
            return f"tool {tool} needs CUDA, which this machine does not have"
    return None


__all__ = ["Backend", "Output", "WindowSpec", "backend_class", "why_unavailable"]

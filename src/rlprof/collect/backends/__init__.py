"""Backends by tool name. Imported lazily: a CPU machine never imports torch_npu or nvtx."""

from __future__ import annotations

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


__all__ = ["Backend", "Output", "WindowSpec", "backend_class"]

"""The accelerator's memory beside a window: its capacity and what the caching allocator held when the window closed.

A memory snapshot (torch_memory) holds the allocator's history but not the device's capacity, and a trace's
`deviceProperties` only where Kineto wrote them; without a capacity the analysis cannot say how much of the device a
run used (`memory_use`). So each window that records memory on an accelerator carries this record in its manifest
row (and a trace's `rlprof` metadata) as `device_memory`:

- `device` (`cuda:0`, `npu:0`), `index`, `name`;
- `capacity_bytes`: the device's total memory (`get_device_properties(index).total_memory`);
- `free_bytes`: free on the device at the window's close, whoever holds the rest (`mem_get_info`);
- `reserved_bytes`, `max_reserved_bytes`: what the caching allocator had reserved then, and its high-water mark
  since the process began (or the program last reset it: rlprof never resets it);
- `allocated_bytes`, `max_allocated_bytes`: the same for the tensors allocated.

torch_npu gives `torch.npu` the same functions. A query never initialises a device the program has not used (that
would cost it a context's memory), and never fails the window: where the device is absent, not yet used, or a query
raises, there is no record, and the analysis says why the measure cannot be made.
"""

from __future__ import annotations

import sys

KINDS = ("cuda", "npu")


def device_api(kind: str):
    """torch.cuda or torch.npu (the latter only where torch_npu is already imported: never imported here)."""
    torch = sys.modules.get("torch")
    if torch is None or (kind == "npu" and "torch_npu" not in sys.modules):
        return None
    return getattr(torch, kind, None)


def device_memory(kind: str, api=None) -> dict | None:
    """The record above for the current `kind` device ("cuda" or "npu"), or None where it cannot be had."""
    api = api if api is not None else device_api(kind)
    if api is None:
        return None
    try:
        if not api.is_available() or not api.is_initialized():
            return None
        index = int(api.current_device())
        props = api.get_device_properties(index)
        free, _total = api.mem_get_info(index)
        return {
            "device": f"{kind}:{index}",
            "index": index,
            "name": str(getattr(props, "name", "")) or None,
            "capacity_bytes": int(props.total_memory),
            "free_bytes": int(free),
            "reserved_bytes": int(api.memory_reserved(index)),
            "max_reserved_bytes": int(api.max_memory_reserved(index)),
            "allocated_bytes": int(api.memory_allocated(index)),
            "max_allocated_bytes": int(api.max_memory_allocated(index)),
        }
    except Exception:  # a device query never fails the window it describes
        return None

"""Which events are communication, compute, copies: by kind and, for collectives, by name."""

from __future__ import annotations

import re

import numpy as np

from .table import CPU_OP, KERNEL, MEMCPY, MEMSET, USER_ANNOTATION, EventTable

# NCCL / RCCL kernels (ncclKernel_*, ncclDevKernel_*, rccl*), HCCL tasks (hcom_*), and the CPU-side
# collectives of torch.distributed (c10d::*, gloo:*, nccl:* record functions, functional collectives),
# plus FSDP2's ranges around its blocking collectives (on CPU the caller waits inside them).
COLLECTIVE = re.compile(
    r"^(nccl|rccl|hcom_|hccl|c10d::|gloo:|nccl:|_c10d_functional::|record_param_comms"
    r"|FSDP::(all_gather|reduce_scatter|all_reduce)( |$))",
    re.IGNORECASE,
)
RLPROF_RANGE = re.compile(r"^rlprof:(stage|mini_batch|micro_batch|decode_step|mark):(.*)$")
LAUNCH = re.compile(
    r"^(cudaLaunchKernel|cudaLaunchKernelExC|cuLaunchKernel|cuLaunchKernelEx|hipLaunchKernel|"
    r"hipExtLaunchKernel|hipModuleLaunchKernel|aclnn|launch)",
    re.IGNORECASE,
)


def name_flags(names: list[str], pattern: re.Pattern) -> np.ndarray:
    return np.fromiter((bool(pattern.match(n)) for n in names), dtype=bool, count=len(names))


def buckets(t: EventTable, device: bool) -> dict[str, np.ndarray]:
    """Boolean masks over events: compute, comm, memcpy (device traces) or CPU equivalents."""
    collective = name_flags(t.names, COLLECTIVE)[t.name] if len(t) else np.zeros(0, bool)
    if device:
        kernel = t.kind == KERNEL
        return {
            "compute": kernel & ~collective,
            "comm": kernel & collective,
            "memcpy": (t.kind == MEMCPY) | (t.kind == MEMSET),
        }
    cpu = t.kind == CPU_OP
    annotation_comm = (t.kind == USER_ANNOTATION) & collective
    return {
        "compute": cpu & ~collective,
        "comm": (cpu & collective) | annotation_comm,
        "memcpy": np.zeros(len(t), bool),
    }

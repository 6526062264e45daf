"""What a Python frame of the host is, as data: the library it belongs to, whether its code drives a stage (a
framework or the user's own code, which a stretch of idle is charged to), and the host-side causes a stack shows (a
host sync, data moved between roles, waiting on I/O or a remote call). Read by analyze/window/idle_frames.py.

A frame is (module, file, line, function, source line) as the host sampler recorded it (analyze/inputs/
host_stacks_file.py). The library is the module's top package (`verl.workers.actor.dp_actor` -> verl), which holds
for editable and source installs alike; a module outside the standard library and outside site-packages is the
user's own code.
"""

from __future__ import annotations

import re
import sys

PYTHON = "python"  # the standard library
USER = "user code"
PROFILER = "rlprof (profiler)"  # rlprof's own collection frames: never charged with the host's time

# The libraries named as such; any other package keeps its top package's name.
NAMED = ("verl", "transfer_queue", "ray", "torch", "vllm", "sglang", "transformers", "trl", "mindspeed_rl", "numpy")
# Code that drives a stage: a stretch of idle is charged to the innermost frame of one of these (else of the user's
# own code), so that time inside torch or the standard library is said at the line of the framework that called it.
HOSTS = ("verl", "vllm", "sglang", "trl", "mindspeed_rl", "rlprof", USER)
# rlprof's own modules that are the profiler, not a host (rlprof's trainer and demo are a host like any other)
PROFILER_MODULES = ("rlprof.collect", "rlprof.integrations", "rlprof.analyze", "rlprof.config")

# A host sync: the line waits for the device (on a CPU it is a copy, on a GPU the queue drains first).
SYNC_LINE = re.compile(r"\.(item|cpu|tolist|numpy|nonzero)\(\s*\)|\bsynchronize\(|\bbool\([^()]*\.(all|any)\(\)\)")
SYNC_FUNCTIONS = (("torch.cuda", "synchronize"), ("torch.npu", "synchronize"), ("torch.accelerator", "synchronize"))
# Data moved between roles: verl's TransferQueue, Ray's object store puts, serialising a batch.
TRANSFER_MODULES = ("transfer_queue", "pickle", "copyreg", "cloudpickle", "ray.cloudpickle", "torch.serialization")
TRANSFER_MODULES += ("torch.multiprocessing.reductions", "ray._private.serialization", "msgpack")
TRANSFER_FUNCTIONS = (("ray._private.worker", "put"), ("verl.protocol", "DataProto.__getstate__"))
TRANSFER_FUNCTIONS += (
    ("verl.protocol", "DataProto.__setstate__"),
    ("verl.single_controller.base.decorator", "dispatch"),
)
# and a line that serialises in C (pickle's and torch's own), or puts into Ray's object store
TRANSFER_LINE = re.compile(r"\b(c?pickle|cloudpickle|torch)\.(dumps?|loads?|save)\(|\bray\.put\(")
# Waiting on I/O, a remote call (Ray's get and wait), another thread or a sleep: the host holds no work.
WAIT_MODULES = ("socket", "selectors", "select", "ssl", "http.client", "urllib", "urllib3", "requests", "httpx")
WAIT_MODULES += ("aiohttp", "asyncio", "subprocess", "threading", "queue", "concurrent.futures", "multiprocessing")
WAIT_MODULES += ("zmq", "ray", "grpc")
WAIT_LINE = re.compile(r"\bsleep\(|\.result\(|\.wait\(|\bray\.(get|wait)\(")

HOST_KINDS = ("host_sync", "data_transfer", "host_wait")  # besides garbage collection, timed by gc.callbacks


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def library(module: str, file: str) -> str:
    """The library a frame belongs to."""
    if _under(module, PROFILER_MODULES):
        return PROFILER
    top = module.split(".", 1)[0]
    if top in NAMED or top == "rlprof":
        return top
    if module == "__main__" or not module:
        return USER if not file.startswith("<") else PYTHON
    if top in sys.stdlib_module_names or file.startswith("<frozen"):
        return PYTHON
    if "site-packages" in file or "dist-packages" in file:
        return top
    return USER


def is_host(lib: str) -> bool:
    return lib in HOSTS


def host_kind(frames: list[tuple]) -> str | None:
    """The host-side cause a stack shows (frames innermost first, each (module, file, line, function, source)):
    host_sync, data_transfer, host_wait, or None."""
    if not frames:
        return None
    module, _, _, function, source = frames[0]
    if SYNC_LINE.search(source or "") or any(_under(module, (m,)) and function == f for m, f in SYNC_FUNCTIONS):
        return "host_sync"
    if TRANSFER_LINE.search(source or ""):
        return "data_transfer"
    for m, _, _, f, _ in frames:
        if _under(m, TRANSFER_MODULES) or (m, f) in TRANSFER_FUNCTIONS:
            return "data_transfer"
    if _under(module, WAIT_MODULES) or WAIT_LINE.search(source or ""):
        return "host_wait"
    return None

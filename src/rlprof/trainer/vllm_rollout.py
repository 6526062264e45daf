"""Rollout on vLLM (`rollout.engine=vllm`): an in-process engine generating from the trainer's current policy.

The policy's config and first weights are written to a directory vLLM loads (no download), then at every step
the actor's weights are pushed into the engine's model (the weight_sync stage: vLLM's own load_weights, a real
copy into its fused, repacked layout). Sampling, stopping at EOS and the sampled tokens' log-probs are vLLM's; the rest of
GRPO / DAPO is the trainer's. The engine's iterations are decode-step units of the trainer's own Profiler
(rlprof's vLLM plugin in host mode), so a profiled step holds rollout, weight_sync, ref and actor stages together.
"""

from __future__ import annotations

import os
import tempfile

import torch

from .rollout import Rollout


class VllmRollout:
    def __init__(self, cfg, actor, tokenizer, profiler):
        if cfg.trainer.device == "cpu":
            # colocated in the trainer's process: vLLM's CPU worker would pin this whole process's threads
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in process: weights pass by reference
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from vllm import LLM

        from ..collect import vllm_samples
        from ..collect.vllm_worker import attach_host

        self.cfg, self.tok = cfg, tokenizer
        self._dir = tempfile.TemporaryDirectory(prefix="rlprof-vllm-policy-")
        actor.save_pretrained(self._dir.name)
        # the sample records are vLLM's own per-request stats: on (without vLLM's periodic stat lines) where the
        # plan may record any step; a plan that collects nothing leaves vLLM's stats off, as they were
        self.samples = None if profiler.plan.collects_nothing else vllm_samples.EngineSamples()
        if self.samples is not None and not vllm_samples.install(lambda *_: self.samples, quiet=True):
            self.samples = None
        self.llm = LLM(
            model=self._dir.name,
            skip_tokenizer_init=True,
            dtype="float32",
            seed=cfg.trainer.seed,
            max_model_len=cfg.model.max_position_embeddings,
            enforce_eager=cfg.rollout.enforce_eager,
            kv_cache_memory_bytes=cfg.rollout.kv_cache_memory_bytes,
            disable_log_stats=self.samples is None,
            **({"max_num_seqs": cfg.rollout.max_num_seqs} if cfg.rollout.max_num_seqs is not None else {}),
        )
        (self.session,) = self.llm.collective_rpc(attach_host, args=(profiler,))

    def push_weights(self, model) -> None:
        # vLLM's in-place reload (the path its RL integrations use): checkpoint-format names, its own layout after
        weights = [(k, v.detach()) for k, v in model.state_dict().items()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})

    def generate(
        self, step: int, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, params: dict, timing=None, hold_eos=None
    ) -> Rollout:
        """`timing` (a list, where the samples are recorded): gets (request id -> row, vLLM's records of the
        requests). `hold_eos`: rows that may not stop early (vLLM's ignore_eos on their requests)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if self.session is not None:
            self.session.new_round()
        prompts = [TokensPrompt(prompt_token_ids=ids[m.bool()].tolist()) for ids, m in zip(prompt_ids, prompt_mask)]

        def sampling(held: bool):  # held: its stop tokens are masked until max_tokens (vLLM's min_tokens)
            return SamplingParams(
                max_tokens=params["max_new_tokens"],
                min_tokens=params["max_new_tokens"] if held else 0,
                temperature=params["temperature"],
                top_p=params["top_p"],
                ignore_eos=params["ignore_eos"],
                logprobs=0,
                stop_token_ids=[] if params["ignore_eos"] else [params["eos_id"]],
                detokenize=False,
            )

        per_row = [sampling(i in hold_eos) for i in range(len(prompts))] if hold_eos else sampling(False)
        recording = timing is not None and self.samples is not None
        if recording:
            self.samples.begin(step)
        try:
            outputs = self.llm.generate(prompts, per_row, use_tqdm=False)
        finally:
            if recording:
                self.samples.end()
        if recording:
            timing.append(({o.request_id: i for i, o in enumerate(outputs)}, self.samples.take()))
        width = max(len(o.outputs[0].token_ids) for o in outputs)
        ids = torch.full((len(outputs), width), params["pad_id"], dtype=torch.long)
        mask = torch.zeros((len(outputs), width), dtype=torch.long)
        logprobs = torch.zeros((len(outputs), width))
        for i, o in enumerate(outputs):
            out = o.outputs[0]
            n = len(out.token_ids)
            ids[i, :n] = torch.tensor(out.token_ids)
            mask[i, :n] = 1
            logprobs[i, :n] = torch.tensor([lp[t].logprob for t, lp in zip(out.token_ids, out.logprobs)])
        return Rollout(prompt_ids, prompt_mask, ids, mask, logprobs)

    def close(self) -> None:
        self.llm = None
        self._dir.cleanup()

"""Async rollout: replicas in their own processes (Ray actors), weights pushed each step,
each replica profiling itself through the engine adapter."""

from __future__ import annotations

import os
import time

import torch

from ..collect.engine import replica_profiles
from .rollout import Rollout, generate


class RolloutReplica:
    """One rollout engine process: its own model copy and its own Profiler (role rollout, rank = replica)."""

    def __init__(self, model_cfg, vocab_size: int, seed: int, plan, replica: int, replicas: int, run_id: str):
        os.environ.setdefault("KINETO_LOG_LEVEL", "5")
        torch.set_num_threads(1)
        from ..collect import Profiler
        from ..collect.engine import RlprofEngineProfiler
        from .model import build_model

        self.replica = replica
        self.model = build_model(model_cfg, vocab_size, seed).eval()
        self.profiler = Profiler(
            plan, rank=replica, world_size=replicas, role="rollout", replica=replica, run_id=run_id, decides=False
        )  # the driver's trigger decides for it
        self.engine = RlprofEngineProfiler(self.profiler)
        self.generator = torch.Generator().manual_seed(seed * 1000 + replica)
        self.profiled_steps: list[int] = []

    def load_weights(self, state_dict) -> None:
        self.model.load_state_dict(state_dict)

    def start_profile(self, step: int, trigger: dict | None = None) -> None:
        self.profiled_steps.append(step)
        self.engine.start_profile(step, trigger)

    def stop_profile(self) -> None:
        self.engine.stop_profile()

    def generate(self, prompt_ids, prompt_mask, params: dict, clock: list | None = None, hold_eos=None) -> tuple:
        """(response ids, response mask, the clock: where the driver records the samples, [] asks for it)."""
        out = generate(
            self.model,
            prompt_ids,
            prompt_mask,
            generator=self.generator,
            decode_step=self.engine.decode_step,
            clock=clock,
            hold_eos=hold_eos,
            **params,
        )
        return out.response_ids, out.response_mask, clock

    def close(self) -> list[int]:
        self.profiler.close()
        return self.profiled_steps


def _rows_in(rows: list[int] | None, idx) -> list[int] | None:
    """Of the batch's `rows`, those in this replica's part `idx`, as its own row numbers."""
    if not rows or not len(idx):
        return None
    lo, hi = int(idx[0]), int(idx[-1]) + 1
    return [r - lo for r in rows if lo <= r < hi] or None


class AsyncRollout:
    def __init__(self, cfg, vocab_size: int, plan, run_id: str, host=None):
        import ray

        if not ray.is_initialized():
            ray.init(
                num_cpus=max(2, cfg.rollout.replicas),
                include_dashboard=False,
                log_to_driver=True,
                configure_logging=False,
                runtime_env={"env_vars": {"KINETO_LOG_LEVEL": "5"}},
            )
        self.ray = ray
        self.plan = plan
        self.host = host  # the driver's Profiler: its trigger decides which steps the replicas capture
        remote = ray.remote(num_cpus=1)(RolloutReplica)
        self.replicas = [
            remote.remote(cfg.model, vocab_size, cfg.trainer.seed, plan, i, cfg.rollout.replicas, run_id)
            for i in range(cfg.rollout.replicas)
        ]

    def push_weights(self, model) -> None:
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        ref = self.ray.put(state)
        self.ray.get([r.load_weights.remote(ref) for r in self.replicas])

    def generate(self, step: int, prompt_ids, prompt_mask, params: dict, timing=None, hold_eos=None) -> Rollout:
        """`timing` (a list, where the samples are recorded): gets (replica, first row, end row, the replica's clock,
        the wall clock in ns when its rows were sent) per replica. `hold_eos`: rows that may not stop early."""
        parts = torch.tensor_split(torch.arange(prompt_ids.shape[0]), len(self.replicas))
        profiling = [i for i in range(len(self.replicas)) if replica_profiles(self.plan, i, step)]
        trigger = self.host.delegated("rollout_generate") if self.host is not None else None
        if trigger is not None:  # the driver's trigger armed a capture of this step's rollout
            rollout = self.plan.role("rollout")
            profiling = [i for i in range(len(self.replicas)) if rollout.all_ranks or i in rollout.ranks]
        self.ray.get([self.replicas[i].start_profile.remote(step, trigger) for i in profiling])
        clock = None if timing is None else []
        submitted = time.time_ns()
        futures = [
            r.generate.remote(prompt_ids[idx], prompt_mask[idx], params, clock, _rows_in(hold_eos, idx))
            for r, idx in zip(self.replicas, parts)
        ]
        results = self.ray.get(futures)
        self.ray.get([self.replicas[i].stop_profile.remote() for i in profiling])
        width = max(ids.shape[1] for ids, _, _ in results)
        pad = params["pad_id"]
        ids = torch.cat([torch.nn.functional.pad(x, (0, width - x.shape[1]), value=pad) for x, _, _ in results])
        mask = torch.cat([torch.nn.functional.pad(m, (0, width - m.shape[1]), value=0) for _, m, _ in results])
        if timing is not None:
            for replica, (idx, (_, _, kept)) in enumerate(zip(parts, results)):
                if len(idx):
                    timing.append((replica, int(idx[0]), int(idx[-1]) + 1, kept, submitted))
        return Rollout(prompt_ids, prompt_mask, ids, mask)

    def close(self) -> dict[int, list[int]]:
        steps = self.ray.get([r.close.remote() for r in self.replicas])
        self.ray.shutdown()
        return dict(enumerate(steps))

"""Run verl's own training code on CPU: one ActorRolloutRefWorker, its compute_log_prob, compute_ref_log_prob and
update_actor, on the profiled steps verl's driver would select (start_profile / stop_profile around each step).

Run with a side venv's python (bash bench/setup_verl.sh; bench/.venv-verl for verl 0.9.1, bench/.venv-verl071 for
verl 0.7.1), never with the project's own: it imports verl.

    bench/.venv-verl/bin/python bench/verl_plugin_run.py --out DIR [--mode inprocess|ray] [--steps 2]
        [--override KEY=VALUE ...] [--time-log-prob N]

Everything that trains and profiles is verl's: its generated trainer YAML (the installed package's) with the
overrides given, resolved as main_ppo resolves it; its ActorRolloutRefWorker built from `actor_rollout_ref` with
role actor_rollout_ref, on verl 0.9.x through its own Ray worker machinery (`--mode ray`: RayResourcePool,
RayClassWithInitArgs, RayWorkerGroup) or in this process; its TensorDict conversions (left_right_2_no_padding) and
the non-tensor keys its RayPPOTrainer passes (_compute_old_log_prob, _compute_ref_log_prob, _update_actor). What
stands in for the rest of verl: a tiny Qwen2 built from a config (no download), a fixed batch of prompts and
responses instead of a rollout, and zero advantages. On verl 0.9.x a CPU platform (bench/verl_cpu_shim, a test
harness) stands in for the accelerator.

Prints one JSON object: what ran, the files written under --out/profile, and (with --time-log-prob N) the wall
time of N further compute_log_prob calls outside any profiled step.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

BATCH = 8  # sequences per step; micro-batches of 2 -> 4 micro-batches in each stage
PROMPT, RESPONSE = 8, 8
CHARS = list("0123456789+=abcdefghijklmnopqrstuvwxyz") + ["<pad>", "<bos>", "<eos>"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_environment() -> dict[str, str]:
    """What verl needs to run its training code on a CPU (harness): the CPU platform, no downloads."""
    return {
        "VERL_PLATFORM": "cpu",
        "VERL_ENGINE_DEVICE": "cuda",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "CUDA_VISIBLE_DEVICES": "",
        "VERL_LOGGING_LEVEL": "WARN",
        "KINETO_LOG_LEVEL": "5",
        "RAY_DEDUP_LOGS": "0",
        "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
    }


def build_checkpoint(path: Path) -> Path:
    """A tiny Qwen2 (hidden 64, 2 layers) and a character tokenizer, saved as a local Hugging Face checkpoint.
    Built in a child process: this one reports which rlprof modules verl's plugin loading brought in, and rlprof's
    trainer (where the builder lives) must not be among them by the harness's doing."""
    import subprocess

    code = (
        "import sys, pathlib; from rlprof.trainer.model import build_char_checkpoint; "
        "build_char_checkpoint(pathlib.Path(sys.argv[1]), sys.argv[2:])"
    )
    subprocess.run([sys.executable, "-c", code, str(path), *CHARS], check=True)
    return path


def verl_config(model: Path, save_path: Path, overrides: list[str]):
    """verl's generated trainer YAML with the harness's keys, then the caller's overrides, resolved."""
    import verl
    from omegaconf import OmegaConf, open_dict

    base = OmegaConf.load(Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml")
    harness = [
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.use_remove_padding=False",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.ref.strategy=fsdp2",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={BATCH}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.use_torch_compile=False",
        "actor_rollout_ref.ref.use_torch_compile=False",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.n=1",
        "actor_rollout_ref.rollout.name=cpu_harness",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        f"global_profiler.save_path={save_path}",
    ]
    from hydra.core.override_parser.overrides_parser import OverridesParser

    cfg, parser = base, OverridesParser.create()
    OmegaConf.set_struct(cfg, True)  # as Hydra composes it: a key the YAML lacks needs `+`
    for item in harness + overrides:
        parsed = parser.parse_override(item)  # Hydra's own grammar, as main_ppo's command line is read
        key, value = parsed.key_or_group, parsed.value()
        if parsed.is_add():
            if OmegaConf.select(cfg, key, default=None) is not None:  # Hydra: "Could not append to config"
                raise SystemExit(f"+{key}: the config already holds this key (write {key}=... without +)")
            with open_dict(cfg):
                OmegaConf.update(cfg, key, value, force_add=True)
        else:
            OmegaConf.update(cfg, key, value)
    OmegaConf.resolve(cfg)
    return cfg


def make_batch(tokenizer, step: int):
    """A fixed batch in verl's left/right-padded layout: prompts left-padded, responses right-padded, lengths that
    differ from row to row (so micro-batches hold different token counts)."""
    import torch
    from verl import DataProto

    pad = tokenizer.pad_token_id
    g = torch.Generator().manual_seed(step)
    prompt_len = torch.randint(2, PROMPT + 1, (BATCH,), generator=g)
    resp_len = torch.randint(1, min(RESPONSE, 2 + step) + 1, (BATCH,), generator=g)  # longer as steps go on
    # micro-batches of growing lengths: a wide spread of token counts (fixed-cost fit needs it)
    order = torch.argsort(prompt_len + resp_len)
    prompt_len, resp_len = prompt_len[order], resp_len[order]
    ids = torch.randint(0, 12, (BATCH, PROMPT + RESPONSE), generator=g)
    prompts = torch.full((BATCH, PROMPT), pad)
    responses = torch.full((BATCH, RESPONSE), pad)
    p_mask = torch.zeros(BATCH, PROMPT, dtype=torch.long)
    r_mask = torch.zeros(BATCH, RESPONSE, dtype=torch.long)
    for i in range(BATCH):
        p, r = int(prompt_len[i]), int(resp_len[i])
        prompts[i, PROMPT - p :] = ids[i, :p]
        p_mask[i, PROMPT - p :] = 1
        responses[i, :r] = ids[i, PROMPT : PROMPT + r]
        r_mask[i, :r] = 1
    attention = torch.cat([p_mask, r_mask], 1)
    position = (torch.cumsum(attention, 1) - 1).clamp(min=0)
    batch = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": attention,
        "position_ids": position,
        "response_mask": r_mask,
        "old_log_probs": torch.zeros(BATCH, RESPONSE),
        "ref_log_prob": torch.zeros(BATCH, RESPONSE),
        "advantages": torch.zeros(BATCH, RESPONSE),
    }
    return DataProto.from_single_dict(batch, meta_info={"temperature": 1.0})


def legacy() -> bool:
    """verl 0.7.x: fsdp_workers' ActorRolloutRefWorker (DataParallelPPOActor inside), DataProto in and out."""
    import verl

    return verl.__version__.startswith("0.7.")


def as_verl_passes(batch, cfg):
    """What verl's RayPPOTrainer hands each worker call: TensorDicts (ray_trainer.py, 0.9.1), or DataProto (0.7.x)."""
    if legacy():
        import copy

        batch.meta_info["global_token_num"] = batch.batch["attention_mask"].sum(-1).tolist()  # as fit() sets it
        update = copy.deepcopy(batch)
        update.meta_info.update(multi_turn=False, temperature=1.0)
        return copy.deepcopy(batch), copy.deepcopy(batch), update
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    def td():
        return left_right_2_no_padding(batch.to_tensordict())

    old = td()
    tu.assign_non_tensor(old, calculate_entropy=True, calculate_sum_pi_squared=False, compute_loss=False)
    ref = td()
    tu.assign_non_tensor(ref, calculate_entropy=False, compute_loss=False)
    update = td()
    actor = cfg.actor_rollout_ref.actor
    tu.assign_non_tensor(
        update,
        calculate_entropy=False,
        distillation_use_topk=False,
        distillation_only=False,
        global_batch_size=actor.ppo_mini_batch_size,
        mini_batch_size=actor.ppo_mini_batch_size,
        epochs=actor.ppo_epochs,
        seed=actor.data_loader_seed,
        dataloader_kwargs={"shuffle": False},
        compute_loss=True,
        temperature=1.0,
    )
    return old, ref, update


class InProcess:
    """The worker in this process (verl's Worker reads RANK / WORLD_SIZE / MASTER_* as a Ray worker would get them)."""

    def __init__(self, cfg):
        os.environ.update(
            RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port())
        )
        import torch.distributed as dist

        if legacy():
            from verl.workers.fsdp_workers import ActorRolloutRefWorker
        else:
            from verl.workers.engine_workers import ActorRolloutRefWorker

        if not dist.is_initialized():  # harness: gloo alone (verl's "cpu:gloo,<device>:<backend>" names cpu twice)
            dist.init_process_group("gloo", rank=0, world_size=1)
        self.worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, role="actor_rollout_ref")
        self.worker.init_model()

    def call(self, name, *args, **kwargs):
        return getattr(self.worker, name)(*args, **kwargs)


class InRay:
    """The worker as verl's driver makes it: a RayWorkerGroup of one ActorRolloutRefWorker on a CPU resource pool."""

    def __init__(self, cfg, env: dict):
        import ray
        from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
        from verl.workers.engine_workers import ActorRolloutRefWorker

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True, runtime_env={"env_vars": env})
        pool = RayResourcePool(process_on_nodes=[1], use_gpu=False, max_colocate_count=1)
        cls = RayClassWithInitArgs(
            cls=ray.remote(ActorRolloutRefWorker), config=cfg.actor_rollout_ref, role="actor_rollout_ref"
        )
        self.group = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=cls, device_name="cpu")
        self.group.init_model()

    def call(self, name, *args, **kwargs):
        return getattr(self.group, name)(*args, **kwargs)


def record_changed() -> list[str]:
    """Files of the installed verl whose content no longer matches the hash pip recorded at install (RECORD)."""
    import base64
    import hashlib
    from importlib.metadata import distribution

    dist = distribution("verl")
    changed = []
    for f in dist.files or ():
        if f.hash is None or f.hash.mode != "sha256":
            continue
        digest = base64.urlsafe_b64encode(hashlib.sha256(f.locate().read_bytes()).digest()).rstrip(b"=").decode()
        if digest != f.hash.value:
            changed.append(str(f))
    return changed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--mode", choices=("inprocess", "ray"), default="inprocess")
    ap.add_argument("--steps", type=int, default=2, help="global steps 1..N, each profiled if verl's config lists it")
    ap.add_argument("--override", action="append", default=[], help="a verl key=value (Hydra style, + to add)")
    ap.add_argument("--time-log-prob", type=int, default=0, help="then time N compute_log_prob calls")
    ap.add_argument("--pretend-release", help="make verl say it is this release (a release the plugin does not know)")
    args = ap.parse_args()

    env = cpu_environment()
    os.environ.update(env)
    args.out.mkdir(parents=True, exist_ok=True)
    model = build_checkpoint(args.out / "model")
    save_path = args.out / "profile"
    cfg = verl_config(model, save_path, args.override)
    import verl

    if args.pretend_release:
        verl.__version__ = args.pretend_release
    steps_profiled = set(cfg.global_profiler.steps or ())
    host = InRay(cfg, env) if args.mode == "ray" else InProcess(cfg)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    calls = []
    for step in range(1, args.steps + 1):
        old, ref, update = as_verl_passes(make_batch(tokenizer, step), cfg)
        profiled = step in steps_profiled
        if profiled:
            host.call("start_profile", role="e2e", profile_step=step)
        host.call("compute_log_prob", old)
        host.call("compute_ref_log_prob", ref)
        host.call("update_actor", update)
        if profiled:
            last = {} if legacy() else {"run_command": step == max(steps_profiled)}  # 0.7.x: no finish hook
            host.call("stop_profile", **last)
        calls.append({"step": step, "profiled": profiled})
    timings = []
    for _ in range(args.time_log_prob):
        batch, _, _ = as_verl_passes(make_batch(tokenizer, 0), cfg)  # a fresh pass each call, as fit() makes it
        t0 = time.perf_counter()
        host.call("compute_log_prob", batch)
        timings.append(time.perf_counter() - t0)
    files = (
        sorted(str(p.relative_to(save_path)) for p in save_path.rglob("*") if p.is_file()) if save_path.exists() else []
    )
    print(
        json.dumps(
            {
                "verl": verl.__version__,
                "mode": args.mode,
                "calls": calls,
                "files": files,
                "record_changed": record_changed(),
                "log_prob_s": timings,
                "plugins_loaded": sorted(k for k in sys.modules if k.startswith(("rlprof", "verl_cpu_shim"))),
            }
        )
    )


if __name__ == "__main__":
    main()

"""Regenerate tests/data/verl/: real output of verl 0.9.1's own profiler (torch tool, CPU, 2 ranks).

Run with the side venv (`bash bench/setup_verl.sh` once):

    bench/.venv-verl/bin/python bench/make_verl_fixtures.py [--out tests/data/verl/output]

Everything that decides what is written is verl's code: the generated trainer YAML from the installed verl
package, resolved and turned into ProfilerConfig / tool configs the way ActorRolloutRefWorker and
RayPPOTrainer do it (`omega_conf_to_dataclass`), verl's `DistProfiler` with its torch backend, its
`DistProfiler.annotate` decorators with the arguments verl's workers use, its finish hook, and its
`rollout_trace_dir` / `relocate_rollout_traces` for the engine traces. What stands in for verl is only the
work inside the decorated methods (a tiny model on CPU instead of FSDP engines) and the driver loop, which
calls start/stop/step in the order `RayPPOTrainer.fit` does. The rollout "engine" trace is written by
torch's own `tensorboard_trace_handler` with a vLLM-style worker name (no vLLM here), then relocated by
verl's function.

Two runs, each with ranks 0 and 1 (gloo) for the actor_rollout_ref worker group and for the critic group:
  e2e/      discrete=false, steps [2, 3], whole-step windows, finish hook that records verl's hook environment
  discrete/ discrete=true,  steps [2, 3], one trace per stage; actor_update sampled by verl's schedule
            (active: 2 mini-batches per file, repeat: 0)
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

STEPS = 4  # RL steps run; global_profiler.steps picks [2, 3]
MINI_BATCHES = 4
HIDDEN = 64


def verl_config(mode: str, save_path: str):
    """The generated trainer YAML of the installed verl, with the example script's profiler overrides."""
    import verl
    from omegaconf import OmegaConf

    base = OmegaConf.load(Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml")
    discrete = mode == "discrete"
    overrides = [
        "global_profiler.tool=torch",
        "global_profiler.steps=[2,3]",
        f"global_profiler.save_path={save_path}",
        "actor_rollout_ref.actor.profiler.enable=True",
        "actor_rollout_ref.actor.profiler.all_ranks=True",
        f"actor_rollout_ref.actor.profiler.tool_config.torch.discrete={discrete}",
        "actor_rollout_ref.actor.profiler.tool_config.torch.contents=[cpu]",
        "critic.profiler.enable=True",
        "critic.profiler.all_ranks=True",
        f"critic.profiler.tool_config.torch.discrete={discrete}",
        "critic.profiler.tool_config.torch.contents=[cpu]",
        # the rollout engines are profiled in discrete mode only (agent loop); relocate their traces
        "actor_rollout_ref.rollout.profiler.tool_config.torch.discrete=True",
        "actor_rollout_ref.rollout.profiler.relocate_results=True",
    ]
    if discrete:
        overrides += ["actor_rollout_ref.actor.profiler.tool_config.torch.schedule.active=2"]
    else:
        overrides += [
            "global_profiler.finish_hook_cmd='env | grep ^VERL_PROFILE_ | sort > "
            '"$VERL_PROFILE_SAVE_PATH/finish_hook_$VERL_PROFILE_ROLE.rank$VERL_PROFILE_RANK.env"\''
        ]
    cfg = OmegaConf.merge(base, OmegaConf.from_dotlist(overrides))
    OmegaConf.resolve(cfg)  # as verl.trainer.main_ppo does before building any worker
    return cfg, overrides


def profiler_of(role_block):
    """As ActorRolloutRefWorker.__init__ does: ProfilerConfig + the selected tool's dataclass."""
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.profiler import ProfilerConfig

    config = omega_conf_to_dataclass(role_block, dataclass_type=ProfilerConfig)
    tool = role_block.get("tool")
    tool_config = omega_conf_to_dataclass(role_block.get("tool_config", {}).get(tool)) if tool else None
    return config, tool_config


class TinyPolicy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(HIDDEN, 4 * HIDDEN), torch.nn.GELU(), torch.nn.Linear(4 * HIDDEN, HIDDEN)
        )
        self.head = torch.nn.Linear(HIDDEN, 32)

    def forward(self, x):
        return torch.log_softmax(self.head(self.body(x)), dim=-1)


def make_classes():
    from verl.utils.profiler import DistProfiler, DistProfilerExtension

    class InnerTrainingWorker(DistProfilerExtension):
        """Stands in for verl's TrainingWorker: the mini-batch loop of train_mini_batch, its train_batch."""

        def __init__(self, rank, config, tool_config, model_type, model):
            DistProfilerExtension.__init__(
                self, DistProfiler(rank=rank, config=config, tool_config=tool_config, save_file_prefix=model_type)
            )
            self.model = model
            self.optim = torch.optim.SGD(model.parameters(), lr=1e-3)

        def train_mini_batch(self, data):
            for batch_idx, mini_batch in enumerate(data.chunk(MINI_BATCHES)):
                with torch.profiler.record_function(f"mini_batch{batch_idx}"):
                    self.train_batch(mini_batch)
                self.profiler.step()

        @DistProfiler.annotate(color="red", role="train_batch")
        def train_batch(self, mini_batch):
            loss = -self.model(mini_batch).mean()
            loss.backward()
            for p in self.model.parameters():  # data-parallel gradient all-reduce, as FSDP would
                dist.all_reduce(p.grad)
            self.optim.step()
            self.optim.zero_grad()

        def infer_batch(self, data):
            with torch.no_grad():
                return self.model(data)

    class ActorRolloutRefWorker(DistProfilerExtension):
        """The decorated methods of verl's combined worker, with verl's annotate arguments."""

        def __init__(self, rank, omega_config):
            self.role = "actor_rollout_ref"
            config, tool_config = profiler_of(omega_config.actor.profiler)  # _is_actor: the actor's profiler
            DistProfilerExtension.__init__(
                self, DistProfiler(rank=rank, config=config, tool_config=tool_config, save_file_prefix=self.role)
            )
            torch.manual_seed(0)
            self.actor = InnerTrainingWorker(rank, config, tool_config, "language_model", TinyPolicy())
            self.ref = InnerTrainingWorker(rank, config, tool_config, "language_model", TinyPolicy())

        @DistProfiler.annotate(color="olive", role="ref_compute_log_prob")
        def compute_ref_log_prob(self, data):
            return self.ref.infer_batch(data)

        @DistProfiler.annotate(color="blue", role="actor_compute_log_prob")
        def compute_log_prob(self, data):
            return self.actor.infer_batch(data)

        @DistProfiler.annotate(color="red", role="actor_update", scheduled=True)
        def update_actor(self, data):
            return self.actor.train_mini_batch(data)

    return ActorRolloutRefWorker, InnerTrainingWorker


def run_group(rank: int, world: int, group: str, mode: str, save_path: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    cfg, _ = verl_config(mode, save_path)
    ActorRolloutRefWorker, InnerTrainingWorker = make_classes()
    steps = list(cfg.global_profiler.steps)
    if group == "actor_rollout_ref":
        worker = ActorRolloutRefWorker(rank, cfg.actor_rollout_ref)
    else:  # RayPPOTrainer builds the critic as a standalone TrainingWorker (model_type value_model)
        config, tool_config = profiler_of(cfg.critic.profiler)
        torch.manual_seed(1)
        worker = InnerTrainingWorker(rank, config, tool_config, "value_model", TinyPolicy())
    gen = torch.Generator().manual_seed(100 + rank)
    for step in range(1, STEPS + 1):
        profiled = step in steps
        if profiled:  # RayPPOTrainer._start_profiling
            if group == "actor_rollout_ref":
                worker.start_profile(role="train", profile_step=step)
            else:
                worker.start_profile(profile_step=step)
        batch = torch.randn(16 * MINI_BATCHES, HIDDEN, generator=gen)
        if group == "actor_rollout_ref":
            worker.compute_log_prob(batch)
            worker.compute_ref_log_prob(batch)
            worker.update_actor(batch)
        else:
            worker.infer_batch(batch)  # compute_values: not annotated in verl 0.9.1
            worker.train_mini_batch(batch)  # update_critic
        if profiled:  # RayPPOTrainer._stop_profiling: the command runs on the last profiled step only
            worker.stop_profile(run_command=step == max(steps))
    dist.barrier()
    dist.destroy_process_group()


def rollout_engine(replica: int, mode: str, save_path: str) -> None:
    """One replica's engine trace: a decode loop profiled by torch with a vLLM-style worker name, written
    to verl's rollout_trace_dir, then moved by verl's relocate_rollout_traces."""
    from verl.utils.profiler import relocate_rollout_traces, rollout_trace_dir

    cfg, _ = verl_config(mode, save_path)
    config, tool_config = profiler_of(cfg.actor_rollout_ref.rollout.profiler)
    out_dir = rollout_trace_dir(config, replica)
    model = TinyPolicy()
    handler = torch.profiler.tensorboard_trace_handler(
        out_dir, worker_name=f"{socket.gethostname()}-rank-0", use_gzip=True
    )
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], on_trace_ready=handler):
        x = torch.randn(4, HIDDEN)
        with torch.no_grad():
            for _ in range(8):
                with torch.profiler.record_function("execute_model"):
                    x = x + model.body(x) * 0.01
    relocate_rollout_traces(config, replica, world_size=1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "tests/data/verl/output"))
    args = parser.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    port = 29611
    for mode in ("e2e", "discrete"):
        save_path = str(out / mode)
        for group in ("actor_rollout_ref", "critic"):
            mp.spawn(run_group, args=(2, group, mode, save_path, port), nprocs=2, join=True)
            port += 1
        for replica in (0, 1):
            rollout_engine(replica, mode, save_path)
        _, overrides = verl_config(mode, save_path)
        for env_file in (out / mode).glob("finish_hook_*.env"):  # no machine paths in committed fixtures
            env_file.write_text(env_file.read_text().replace(save_path, "<save_path>"))
        (out / mode / "verl_overrides.txt").write_text(
            "\n".join(o.replace(save_path, "<save_path>") for o in overrides) + "\n"
        )
    import verl

    (out / "SOURCE.md").write_text(
        f"Written by verl {verl.__version__}'s own profiler code (torch {torch.__version__}, CPU) through "
        f"bench/make_verl_fixtures.py; regenerate with\n`bench/.venv-verl/bin/python bench/make_verl_fixtures.py`.\n"
    )
    for p in sorted(out.rglob("*")):
        if p.is_file():
            print(p.relative_to(out), p.stat().st_size)


if __name__ == "__main__":
    sys.exit(main())

"""`rlprof train`: validate everything, start torch.distributed when launched by torchrun, train, report."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from ..config import load_config, resolve_plan, with_default_profile
from ..errors import ConfigError
from .config import TrainConfig, parse_train_config, validate


def prepare(config: str | None, overrides: list[str]) -> tuple[TrainConfig, object, int, int]:
    """Everything that can be wrong is found here, before a model is built or a process group started."""
    data = load_config(config, overrides)
    cfg = parse_train_config(data)
    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    validate(cfg, world_size)
    if cfg.rollout.mode == "async" and world_size > 1:
        raise ConfigError(
            "rollout.mode",
            "async",
            "sync under torchrun; async rollout runs from one driver process with rollout.replicas Ray actors",
        )
    if cfg.rollout.mode == "async":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise ConfigError("rollout.mode", "async", "sync (async rollout needs ray: pip install ray)")
    if cfg.trainer.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("trainer.device", "cuda", "cpu (this machine has no CUDA device)")
    plan = resolve_plan(with_default_profile(data))
    return cfg, plan, rank, world_size


def main(config: str | None, overrides: list[str], quiet: bool = False) -> int:
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    cfg, plan, rank, world_size = prepare(config, overrides)
    import torch
    import torch.distributed as dist

    from ..collect.foreign_logs import foreign_log_filter
    from ..frameworks.hf_models import model_record
    from .threads import choose_threads
    from .train import run_training, write_run_config
    from .summary import print_summary, ProgressPrinter

    if world_size > 1 and not dist.is_initialized():
        if cfg.trainer.device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl" if cfg.trainer.device == "cuda" else "gloo")
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    threads, why = choose_threads(local_ranks, cfg.trainer.threads)
    torch.set_num_threads(threads)
    printer = ProgressPrinter(cfg.trainer.steps, enabled=rank == 0 and not quiet)
    started = time.perf_counter()
    try:
        with printer, foreign_log_filter():
            history, trainer = run_training(
                cfg,
                plan,
                rank=rank,
                world_size=world_size,
                on_step=printer.update,
                metrics_dir=Path(cfg.trainer.output_dir),
                console=printer.line,
            )
        if dist.is_initialized():
            dist.barrier()  # leave together: gloo aborts a rank whose peer tears down mid-export
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if rank == 0:
        metrics_path = trainer.metrics_path  # written step by step in the trainer's own output directory
        run_dirs = sorted({trainer.prof.run_dir(r.role) for r in plan.roles if r.enabled})
        lr = {"lr": trainer.lr, "from": trainer.lr_from, "warmup_steps": cfg.actor.lr_warmup_steps}
        # the model in Hugging Face's terms: what the analysis counts each pass's work with (trainer_config.json)
        model = model_record(trainer.actor.config.to_dict(), "rlprof's trainer", dtype="float32")
        write_run_config(cfg, [metrics_path.parent], threads={"threads": threads, "why": why}, lr=lr, model=model)
        beside_traces(cfg, history, run_dirs, {"threads": threads, "why": why}, lr, model)
        print_summary(cfg, history, metrics_path, run_dirs, time.perf_counter() - started, quiet=quiet)
    return 0


def beside_traces(
    cfg: TrainConfig, history: list[dict], run_dirs: list[Path], threads: dict, lr: dict, model: dict | None = None
) -> None:
    """The run's settings and metrics beside its traces (the unprofiled timings predictions scale to): on the
    profile's disk, so a full disk or a vanished directory there is one line, never the training's failure."""
    from .train import write_metrics, write_run_config

    for run_dir in run_dirs:
        if not run_dir.is_dir():
            continue
        try:
            write_run_config(cfg, [run_dir], threads=threads, lr=lr, model=model)
            write_metrics(history, run_dir)
        except OSError as exc:
            for name in ("trainer_config.json", "metrics.jsonl"):  # nothing half written left behind
                try:
                    (run_dir / name).unlink(missing_ok=True)
                except OSError:
                    pass
            print(
                f"rlprof: the run's settings and metrics could not be written beside its traces in {run_dir}: "
                f"{type(exc).__name__}: {exc}; they are in the trainer's output directory",
                file=sys.stderr,
            )


def cli_main(argv: list[str] | None = None) -> int:
    from ..collect.shutdown import module_entry

    return module_entry(main, argv)

"""Profile TRL's `GRPOTrainer` with an rlprof plan, without editing TRL.

    import rlprof.integrations.trl as rltrl
    trainer = GRPOTrainer(...)
    rltrl.profile(trainer, "profile.yaml")      # or a ProfilePlan, or (path, [overrides])
    trainer.train()

Steps are TRL's global steps (1-based: the optimizer step being made). Stages are the canonical ones,
found on the trainer instance (its methods are wrapped, the class is untouched):

    rollout_generate        GRPOTrainer._generate
    reward_compute          GRPOTrainer._calculate_rewards
    actor_compute_log_prob  _get_per_token_logps_and_entropies(policy) while scoring completions
    ref_compute_log_prob    _get_per_token_logps_and_entropies(ref_model)
    actor_update            from the step's first compute_loss to the optimizer step (on_step_end)

Each gradient-accumulation micro-batch (compute_loss + backward) is a `micro_batch` unit. TRL computes
advantages inline while scoring, so there is no separate advantage_compute stage; with PEFT and no
ref_model the reference pass runs on the policy and counts as actor_compute_log_prob.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Sequence

from ..collect import Profiler
from ..config import load_plan
from ..config.plan import ProfilePlan
from ..errors import RLProfError

SUPPORTED = ("1.16",)  # TRL minor versions whose private method names and call order this was tested on


class IntegrationError(RLProfError):
    pass


def check_version(version: str | None = None) -> str:
    if version is None:
        try:
            from importlib.metadata import version as installed

            version = installed("trl")
        except Exception:
            raise IntegrationError(
                "trl is not installed; allowed: trl "
                + " or ".join(f"{v}.x" for v in SUPPORTED)
                + " (pip install 'trl==1.16.*')"
            ) from None
    minor = ".".join(version.split(".")[:2])
    if minor not in SUPPORTED:
        raise IntegrationError(
            f"trl {version} is not supported by rlprof.integrations.trl; allowed: trl "
            + " or ".join(f"{v}.x" for v in SUPPORTED)
            + " (pip install 'trl==1.16.*')"
        )
    return version


def _plan(plan_or_config) -> ProfilePlan:
    if isinstance(plan_or_config, ProfilePlan):
        return plan_or_config
    if isinstance(plan_or_config, (str, Path)) or plan_or_config is None:
        return load_plan(plan_or_config)
    if isinstance(plan_or_config, tuple) and len(plan_or_config) == 2:
        path, overrides = plan_or_config
        return load_plan(path, list(overrides))
    if isinstance(plan_or_config, Sequence):  # overrides only
        return load_plan(None, list(plan_or_config))
    raise IntegrationError(
        f"plan_or_config {type(plan_or_config).__name__} is not allowed; allowed: a ProfilePlan, "
        "a YAML path, (path, [overrides]) or a list of overrides"
    )


class TrlHooks:
    """The wrappers and step bookkeeping for one GRPOTrainer instance."""

    WRAPPED = (
        "_generate",
        "_calculate_rewards",
        "_get_per_token_logps_and_entropies",
        "_generate_and_score_completions",
        "compute_loss",
        "training_step",
    )

    def __init__(self, trainer, prof: Profiler):
        self.trainer, self.prof = trainer, prof
        self._originals: dict[str, Any] = {}
        self._scoring = False
        self._step_scope = self._update = self._micro = None

    # -- installation --------------------------------------------------------------------------
    def install(self) -> "TrlHooks":
        missing = [name for name in self.WRAPPED if not hasattr(self.trainer, name)]
        if missing:
            raise IntegrationError(
                f"{type(self.trainer).__name__} has no {', '.join(missing)}; allowed: "
                "trl.GRPOTrainer (or a subclass) of a supported TRL version"
            )
        for name in self.WRAPPED:
            original = getattr(self.trainer, name)
            self._originals[name] = original
            setattr(self.trainer, name, functools.wraps(original)(getattr(self, "_" + name.lstrip("_"))(original)))
        self.trainer.add_callback(RlprofCallback(self))
        return self

    def uninstall(self) -> None:
        for name in self._originals:
            self.trainer.__dict__.pop(name, None)
        self._originals.clear()

    # -- wrappers (each returns the replacement for one bound method) ---------------------------
    def _stage(self, name: str, original):
        prof = self.prof

        def wrapper(*args, **kwargs):
            with prof.stage(name):
                return original(*args, **kwargs)

        return wrapper

    def _generate(self, original):
        return self._stage("rollout_generate", original)

    def _calculate_rewards(self, original):
        return self._stage("reward_compute", original)

    def _generate_and_score_completions(self, original):
        def wrapper(*args, **kwargs):
            self._scoring = True
            try:
                return original(*args, **kwargs)
            finally:
                self._scoring = False

        return wrapper

    def _get_per_token_logps_and_entropies(self, original):
        prof, trainer = self.prof, self.trainer

        def wrapper(model, *args, **kwargs):
            ref = getattr(trainer, "ref_model", None)
            if ref is not None and model is ref:
                stage = "ref_compute_log_prob"
            elif self._scoring:
                stage = "actor_compute_log_prob"
            else:  # the training forward inside compute_loss: already within actor_update
                return original(model, *args, **kwargs)
            with prof.stage(stage):
                return original(model, *args, **kwargs)

        return wrapper

    def _compute_loss(self, original):
        def wrapper(*args, **kwargs):
            if getattr(self.trainer.model, "training", True):
                self._enter_update(_held(args[1] if len(args) > 1 else kwargs.get("inputs")))
            return original(*args, **kwargs)

        return wrapper

    def _training_step(self, original):
        def wrapper(*args, **kwargs):
            try:
                return original(*args, **kwargs)  # compute_loss + backward of one micro-batch
            finally:
                self._exit_micro()

        return wrapper

    # -- step / stage / unit scopes that span several calls ------------------------------------
    def _enter_update(self, held: dict | None = None) -> None:
        if self._update is None:
            self._update = self.prof.stage("actor_update")
            self._update.__enter__()
        if self._micro is None:
            self._micro = self.prof.unit("micro_batch", **(held or {}))
            self._micro.__enter__()

    def _exit_micro(self) -> None:
        if self._micro is not None:
            micro, self._micro = self._micro, None
            micro.__exit__(None, None, None)

    def begin_step(self, step: int) -> None:
        self.end_step()
        self._step_scope = self.prof.step(step)
        self._step_scope.__enter__()

    def end_step(self) -> None:
        self._exit_micro()
        if self._update is not None:
            update, self._update = self._update, None
            update.__exit__(None, None, None)
        if self._step_scope is not None:
            scope, self._step_scope = self._step_scope, None
            scope.__exit__(None, None, None)


def _callback_base():
    from transformers import TrainerCallback

    return TrainerCallback


class RlprofCallback(_callback_base()):
    """Steps from TRL's trainer state: begin at on_step_begin, end after the optimizer step."""

    def __init__(self, hooks: TrlHooks):
        self.hooks = hooks

    def on_step_begin(self, args, state, control, **kwargs):
        self.hooks.begin_step(state.global_step + 1)

    def on_step_end(self, args, state, control, **kwargs):
        self.hooks.end_step()

    def on_train_end(self, args, state, control, **kwargs):
        self.hooks.end_step()
        self.hooks.prof.close()


def profile(trainer, plan_or_config=None, *, run_id: str | None = None) -> TrlHooks:
    """Install rlprof on a GRPOTrainer instance; returns the hooks (`.prof` is the Profiler)."""
    check_version()
    plan = _plan(plan_or_config)
    acc = getattr(trainer, "accelerator", None)
    rank = acc.process_index if acc is not None else None
    world = acc.num_processes if acc is not None else None
    prof = Profiler(plan, rank=rank, world_size=world, run_id=run_id)
    return TrlHooks(trainer, prof).install()


def _held(inputs) -> dict:
    """What a GRPO micro-batch holds (rows, tokens computed, real tokens, the query-key pairs of its real tokens: each
    row's length squared, summed), from TRL's prompt/completion masks; {} where the inputs are not that shape (another
    trainer, another TRL version)."""
    try:
        pm, cm = inputs["prompt_mask"], inputs["completion_mask"]
        rows = int(pm.shape[0])
        lengths = (pm.sum(1) + cm.sum(1)).tolist()
        return {
            "seqs": rows,
            "tokens": rows * int(pm.shape[1] + cm.shape[1]),
            "real_tokens": int(sum(lengths)),
            "query_key_pairs": int(sum(n * n for n in lengths)),
        }
    except Exception:  # the measure is optional; the training step is not
        return {}

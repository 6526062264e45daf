"""rlprof inside verl's own worker processes: micro-batch sampling of verl's log-prob and update stages,
asked for in verl's profiler config, with no edit to verl's source.

How it gets there: verl imports this module in every process that imports verl, through the `verl.plugins` entry
point rlprof installs (verl 0.9.0 on), or the modules listed in VERL_USE_EXTERNAL_MODULES (verl 0.7.x; Ray's
runtime_env carries it to the workers). verl 0.7.x's `actor_rollout_ref.model.external_lib` is imported too late:
in init_model, after the worker's __init__ has built (and refused) its profiler's tool config.

What it does on import: nothing but wait, after two of verl's modules, to wrap two things in memory:
- verl.utils.profiler.config: the torch schedule dataclass accepts rlprof's `unit`, and tools whose verl config has
  no schedule (torch before 0.9, npu) accept one; verl itself would refuse the key when it builds its workers.
- verl.utils.profiler.profile: DistProfiler.__init__ looks at the tool config it was given. Unless the schedule says
  `unit: micro_batch`, it returns at once and verl's profiler is verl's.

What it does when asked (a DistProfiler enabled on this rank whose schedule says `unit: micro_batch`): that
DistProfiler's backend (`_impl`) becomes a `MicroBatchSampler`. verl still decides the steps and ranks (its
start()/stop() per profiled step, its rank gate) and calls the sampler's annotate() for each stage it marks: each
call of a stage that runs micro-batches (actor/ref compute_log_prob, update_actor, the critic's) becomes a window
of its own whose schedule (torch's or torch_npu's, the same calls) advances at the head of each micro-batch of the
loop verl runs them in: FSDPEngine.forward_backward_batch (0.9.x, head), before verl enters its `micro_batch{k}`
range, so micro-batch k's backward stays in its window; DataParallelPPOActor/-Critic (0.7.x). Each kept micro-batch
is a range `rlprof:micro_batch:K|seqs=..,tokens=..,real_tokens=..` inside `rlprof:stage:<stage>`; each window is a
file named and placed as verl's own profiler names its traces (save_path, `{worker}_{stage}_step{N}_rank..`), so
verl's finish_hook_cmd and `rlprof analyze` see it. Other stages: in discrete mode verl's own backend collects them
as before; in e2e mode the sampled windows replace verl's whole-step trace.

Never breaks the host: every fault inside is one logged warning and verl goes on; a verl release or layout the plugin
does not know is one warning and no patching (verl's own profiler then collects what the warning names).
"""

from __future__ import annotations

import contextvars
import functools
import importlib.abc
import logging
import os
import shlex
import sys
import weakref

from ..frameworks import verl as facts

log = logging.getLogger("rlprof")

# The sampled stage window running in this context (set around a stage call; read by the micro-batch hooks).
_CURRENT: contextvars.ContextVar = contextvars.ContextVar("rlprof_verl_window", default=None)
_said: set = set()  # warnings already given in this process (each is said once)
_layouts: dict = {}  # verl release -> the layout found and patched ("engine", "dp"), or None where unknown


def _say(key, message: str) -> None:
    if key not in _said:
        _said.add(key)
        log.warning("%s", message)


# ---- loading: wait for verl's profiler modules ---------------------------------------------------------------
class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a function on a module right after its first import, then steps aside (a post-import hook)."""

    def __init__(self, hooks: dict):
        self.hooks = hooks

    def find_spec(self, name, path=None, target=None):
        hook = self.hooks.get(name)
        if hook is None:
            return None
        spec = None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        del self.hooks[name]
        if not self.hooks and self in sys.meta_path:
            sys.meta_path.remove(self)
        spec.loader = _HookedLoader(spec.loader, hook)
        return spec


class _HookedLoader(importlib.abc.Loader):
    def __init__(self, loader, hook):
        self.loader, self.hook = loader, hook

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        _guarded(self.hook, module)

    def __getattr__(self, name):  # get_source, get_resource_reader, ...: the real loader's
        return getattr(self.loader, name)


def _guarded(hook, module) -> None:
    try:
        hook(module)
    except Exception as exc:  # never break verl's import
        _say(("attach", module.__name__), f"rlprof: the verl plugin could not attach to {module.__name__} "
             f"({type(exc).__name__}: {exc}); verl goes on without it")


def _install() -> None:
    hooks = {"verl.utils.profiler.config": _teach_config, "verl.utils.profiler.profile": _watch_profilers,
             TRAINER_MODULE: _watch_steps}
    pending = {}
    for name, hook in hooks.items():
        module = sys.modules.get(name)
        if module is not None:
            _guarded(hook, module)
        else:
            pending[name] = hook
    if pending:
        sys.meta_path.insert(0, _AfterImport(pending))


# ---- main_ppo's driver: global_profiler.trigger (integrations/verl_trigger.py) ----------------------------------
TRAINER_MODULE = "verl.trainer.ppo.v1.trainer_base"  # the v1 trainer, in main_ppo's driver


def _watch_steps(module) -> None:
    from .verl_trigger import attach

    attach(module)


# ---- verl's config accepts rlprof's keys -----------------------------------------------------------------------
def _teach_config(module) -> None:
    import dataclasses

    for name, keys in facts.SCHEDULE_CLASSES.items():
        cls = getattr(module, name, None)
        if cls is None or not dataclasses.is_dataclass(cls) or getattr(cls.__init__, "_rlprof_accepts", None):
            continue
        own = {f.name for f in dataclasses.fields(cls)}
        extra = tuple(k for k in keys if k not in own)
        if extra:
            cls.__init__ = _accepting(cls.__init__, extra)


def _accepting(init, extra: tuple[str, ...]):
    """The dataclass's own __init__, with rlprof's keys taken out first and kept on the instance (not as fields:
    verl's code never sees them)."""

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        given = {k: kwargs.pop(k) for k in extra if k in kwargs}
        init(self, *args, **kwargs)
        for key, value in given.items():
            setattr(self, key, value)

    __init__._rlprof_accepts = extra
    return __init__


# ---- verl's DistProfiler: does its config ask? -------------------------------------------------------------------
def _watch_profilers(module) -> None:
    cls = getattr(module, "DistProfiler", None)
    if cls is None or getattr(cls.__init__, "_rlprof_watch", False):
        if cls is None:
            _say("no-dist-profiler", "rlprof: this verl has no DistProfiler (verl.utils.profiler.profile); the verl "
                 "plugin does nothing here")
        return
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        schedule = getattr(getattr(self, "tool_config", None), "schedule", None)
        if schedule is not None:  # the cheap test: most profilers have none, or one without rlprof's unit
            _take_over(self, schedule)

    __init__._rlprof_watch = True
    cls.__init__ = __init__
    build = getattr(module, "build_rollout_dist_profiler", None)
    if callable(build) and not getattr(build, "_rlprof_replica", False):
        module.build_rollout_dist_profiler = _naming_the_replica(build)


def _naming_the_replica(build):
    """verl builds a rollout replica's profiler in that replica's server process, before the server starts its
    engine: where rlprof's vLLM plugin has a plan, the engine processes learn which replica they are."""

    @functools.wraps(build)
    def build_rollout_dist_profiler(replica_rank, *args, **kwargs):
        if os.environ.get(ENV_ENGINE_PLAN):
            os.environ[ENV_ENGINE_REPLICA] = str(int(replica_rank))
        return build(replica_rank, *args, **kwargs)

    build_rollout_dist_profiler._rlprof_replica = True
    return build_rollout_dist_profiler


# ---- the rollout engines' decode-step windows: verl's rollout keys, handed to rlprof's vLLM plugin ---------------
ENV_ENGINE_PLAN, ENV_ENGINE_REPLICA = "RLPROF_PLAN", "RLPROF_REPLICA"  # what integrations/vllm_plugin.py reads
PROFILER_KEYS = ("global_profiler.", "actor_rollout_ref.actor.profiler.", "actor_rollout_ref.rollout.profiler.")
ROLLOUT_PROFILER = "actor_rollout_ref.rollout.profiler."


def _hand_rollout_plan(argv: list[str], environ) -> str | None:
    """In main_ppo's driver: when its command line asks the rollout for decode-step windows (a schedule whose unit is
    decode_step, or verl's profile_token_start/end), the command line's profiler overrides become the plan rlprof's
    vLLM plugin reads (RLPROF_PLAN), in the environment that Ray's processes started from here inherit: vLLM's
    engine processes in each rollout server among them. The rollout block falls back to the actor's as verl's own
    config does (rlprof's verl dialect reads it so). A plan the user gave is left alone; other processes find the
    variable set and stop here."""
    if environ.get(ENV_ENGINE_PLAN):
        return None
    picked = [a for a in argv if a.lstrip("+~").startswith(PROFILER_KEYS)]
    rollout = [a for a in picked if a.lstrip("+~").startswith(ROLLOUT_PROFILER)]
    if not any(facts.TOKEN_WINDOW_UNIT in a or ".profile_token_" in a for a in rollout):
        return None
    environ[ENV_ENGINE_PLAN] = shlex.join(picked)
    return environ[ENV_ENGINE_PLAN]


def _field(obj, key, default=None):
    """A key of one of verl's configs: a dataclass (verl's BaseConfig), a DictConfig or a dict."""
    if obj is None:
        return default
    if isinstance(obj, dict):
        return obj.get(key, default)
    getter = getattr(obj, "get", None)
    if callable(getter):
        try:
            return getter(key, default)
        except Exception:
            pass
    return getattr(obj, key, default)


def _take_over(prof, schedule) -> None:
    unit = _field(schedule, "unit")
    if unit is None or unit == facts.SCHEDULE_UNIT:
        return  # nothing asks, or mini_batch: verl's own meaning (its schedule over update mini-batches)
    if unit == facts.TOKEN_WINDOW_UNIT and os.environ.get(ENV_ENGINE_PLAN):
        return  # a rollout server's: rlprof's vLLM plugin keeps the decode steps inside its engine
    try:
        if not (prof.check_enable() and prof.check_this_rank()):
            return  # nothing is collected on this rank; verl's profiler stays as it is
        sampler = MicroBatchSampler.build(prof)  # a unit that is no unit at all: rlprof's ConfigError
    except Exception as exc:
        from ..errors import ConfigError

        what = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
        _say(("build", what), f"rlprof: the verl plugin does not sample micro-batches: {what}; verl goes on, "
             f"{_instead(prof)}")
        return
    if sampler is not None:
        prof._impl = sampler


def _instead(prof) -> str:
    """What verl's own profiler collects when the plugin does not take over (said in the warning)."""
    tool = getattr(prof, "_tool", None)
    discrete = bool(_field(getattr(prof, "tool_config", None), "discrete", False))
    if tool == "torch":
        return ("its own torch profiler collects each stage in full, the update's mini-batches by the schedule's "
                "counts" + (" (one trace per stage)" if discrete else " (one trace per step)"))
    return f"its own {tool} profiler collects each stage in full"


# ---- the layouts the plugin knows --------------------------------------------------------------------------------
def _release() -> str:
    import verl

    return str(getattr(verl, "__version__", "unknown"))


def _known_layout(release: str, instead: str) -> str | None:
    """Check (and patch, once per process) the micro-batch loop of this verl release. None: one warning said, naming
    what verl's own profiler collects instead."""
    if release in _layouts:
        return _layouts[release]
    major_minor = ".".join(release.split(".")[:2])
    layout = None
    if major_minor not in facts.PLUGIN_RELEASES:
        _say(("release", release), f"rlprof: verl {release} is not a release the verl plugin knows "
             f"({', '.join(facts.PLUGIN_RELEASES)}.x): no patching, no micro-batch sampled; verl's own profiler "
             f"collects instead: {instead}")
    else:
        missing = _patch_dp() if major_minor == "0.7" else _patch_engine()
        if missing:
            _say(("layout", release), f"rlprof: verl {release}'s micro-batch loop is not where the verl plugin looks "
                 f"({missing}): no patching, no micro-batch sampled; verl's own profiler collects instead: {instead}")
        else:
            layout = "dp" if major_minor == "0.7" else "engine"
    _layouts[release] = layout
    return layout


def _patch_engine() -> str | None:
    """verl 0.9.x / head: FSDPEngine.forward_backward_batch iterates what its module's prepare_micro_batches returns."""
    import importlib

    spec = facts.ENGINE_LAYOUT
    try:
        module = importlib.import_module(spec["module"])
    except Exception as exc:
        return f"{spec['module']} does not import: {type(exc).__name__}: {exc}"
    cls = getattr(module, spec["class"], None)
    method = getattr(cls, spec["method"], None)
    code = getattr(method, "__code__", None)
    if code is None or spec["source"] not in code.co_names or not callable(getattr(module, spec["source"], None)):
        return f"{spec['class']}.{spec['method']} does not take its micro-batches from {spec['source']}"
    original = getattr(module, spec["source"])
    if not getattr(original, "_rlprof", False):
        setattr(module, spec["source"], _ticking_micro_batches(original))
    return None


def _ticking_micro_batches(original):
    @functools.wraps(original)
    def prepare_micro_batches(*args, **kwargs):
        result = original(*args, **kwargs)
        window = _CURRENT.get()
        if window is None or not isinstance(result, tuple) or not result:
            return result
        return (_Ticking(result[0], window, _engine_args), *result[1:])

    prepare_micro_batches._rlprof = True
    return prepare_micro_batches


class _Ticking(list):
    """One forward_backward_batch call's micro-batches. Iterating them starts each unit at the head of its loop
    iteration (before verl enters `micro_batch{k}`) and ends the last once the loop asks for more (its backward
    done)."""

    def __init__(self, items, window, describe):
        super().__init__(items)
        self.window, self.describe = window, describe

    def __iter__(self):
        window, describe = self.window, self.describe
        try:
            for item in list.__iter__(self):
                window.unit_begins(functools.partial(describe, item))
                yield item
        finally:
            window.unit_ends()


def _engine_args(micro_batch) -> dict:
    """What a micro-batch of verl's engine holds: rows, tokens the model computes, real (not padding) tokens."""
    from verl.utils import tensordict_utils as tu

    ids = micro_batch["input_ids"]
    if getattr(ids, "is_nested", False):
        lengths = ids.offsets().diff().tolist()
    else:
        lengths = micro_batch["attention_mask"].sum(-1).tolist()
    seqs, real = len(lengths), int(sum(lengths))
    packed = tu.get_non_tensor_data(data=micro_batch, key="use_remove_padding", default=True)
    return {"seqs": seqs, "tokens": real if packed else seqs * int(max(lengths, default=0)), "real_tokens": real}


def _patch_dp() -> str | None:
    """verl 0.7.x: DataParallelPPOActor/-Critic run one _forward_micro_batch per micro-batch (the backward follows in
    the loop body) and _optimizer_step after a mini-batch's last."""
    import importlib

    for spec in facts.DP_LAYOUTS:
        try:
            module = importlib.import_module(spec["module"])
        except Exception as exc:
            return f"{spec['module']} does not import: {type(exc).__name__}: {exc}"
        cls = getattr(module, spec["class"], None)
        names = (spec["forward"], spec["boundary"], *spec["stages"])
        lacking = [n for n in names if not callable(getattr(cls, n, None))]
        if cls is None or lacking:
            return f"{spec['module']}.{spec['class']} lacks {', '.join(lacking) or 'the class'}"
    for spec in facts.DP_LAYOUTS:
        cls = getattr(importlib.import_module(spec["module"]), spec["class"])
        forward, boundary = getattr(cls, spec["forward"]), getattr(cls, spec["boundary"])
        if not getattr(forward, "_rlprof", False):
            setattr(cls, spec["forward"], _dp_forward(forward))
        if not getattr(boundary, "_rlprof", False):
            setattr(cls, spec["boundary"], _dp_boundary(boundary))
    return None


def _dp_forward(original):
    @functools.wraps(original)
    def _forward_micro_batch(self, micro_batch, *args, **kwargs):
        window = _CURRENT.get()
        if window is not None:
            window.unit_begins(functools.partial(_dp_args, micro_batch, getattr(self, "use_remove_padding", False)))
        return original(self, micro_batch, *args, **kwargs)

    _forward_micro_batch._rlprof = True
    return _forward_micro_batch


def _dp_boundary(original):
    @functools.wraps(original)
    def _optimizer_step(self, *args, **kwargs):
        window = _CURRENT.get()
        if window is not None:  # the mini-batch's last micro-batch, backward included, is over
            window.unit_ends()
        return original(self, *args, **kwargs)

    _optimizer_step._rlprof = True
    return _optimizer_step


def _dp_args(micro_batch, packed: bool) -> dict:
    mask = micro_batch["attention_mask"]
    seqs, width = int(mask.shape[0]), int(mask.shape[-1])
    real = int(mask.sum())
    return {"seqs": seqs, "tokens": real if packed else seqs * width, "real_tokens": real}


# ---- the sampler: verl's DistProfiler backend when micro-batches are asked for -----------------------------------
def _plan(prof):
    """The role's plan, read from verl's config as this worker holds it, with verl's meaning (rlprof's dialect)."""
    from ..config import resolve_plan

    config, tool_config = prof.config, prof.tool_config
    tool = getattr(prof, "_tool", None) or _field(config, "tool")
    block_keys = {"torch": ("contents", "discrete"), "npu": ("contents", "discrete", "level", "analysis")}
    block = {k: _plain(_field(tool_config, k)) for k in block_keys.get(tool, ("discrete",))
             if _field(tool_config, k) is not None}
    schedule = _field(tool_config, "schedule")
    block["schedule"] = {k: _plain(_field(schedule, k)) for k in ("unit", "skip_first", "wait", "warmup", "active",
                                                                 "repeat") if _field(schedule, k) is not None}
    role = _worker_role(prof)
    profiler = {"enable": True, "all_ranks": bool(_field(config, "all_ranks", False)),
                "ranks": _plain(_field(config, "ranks")) or [], "tool_config": {tool: block}}
    save_path = _field(config, "save_path")
    data = {"global_profiler": {"tool": tool, "steps": [1], **({"save_path": str(save_path)} if save_path else {})}}
    path = facts.ROLE_BLOCKS["critic" if role == "critic" else "actor"].split(".")
    node = data
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = profiler
    return resolve_plan(data).role("critic" if role == "critic" else "actor")


def _plain(value):
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
        return [_plain(v) for v in value]
    return value


def _worker_role(prof) -> str:
    prefix = getattr(prof, "save_file_prefix", None)
    return facts.WORKER_ROLES.get(facts.STEM_PART.sub("-", str(prefix)).strip("-"), "actor") if prefix else "actor"


class MicroBatchSampler:
    """verl's DistProfiler backend (its `_impl`) for a role whose schedule samples micro-batches.

    verl calls start(profile_step=N) / stop() on each profiled step of the selected ranks, and annotate(role=stage)
    around each stage it marks. A stage that runs micro-batches is a window of its own; other stages go to verl's
    own backend in discrete mode and are not recorded in e2e mode (its whole-step trace would hold the sampled
    stages in full)."""

    def __init__(self, prof, plan, layout: str):
        self.inner = prof._impl  # verl's own backend, for the stages not sampled (discrete mode)
        self.rank = int(getattr(prof, "rank", 0) or 0)
        self.prefix = getattr(prof, "save_file_prefix", None)
        self.role = _worker_role(prof)
        self.plan, self.layout = plan, layout
        self.step_n: int | None = None
        self.windows: weakref.WeakSet = weakref.WeakSet()

    @classmethod
    def build(cls, prof) -> "MicroBatchSampler | None":
        plan = _plan(prof)  # a bad value: rlprof's ConfigError (key, value, what is allowed)
        if plan.schedule is None or plan.schedule.unit != facts.PLUGIN_UNIT:
            unit = plan.schedule.unit if plan.schedule else None
            _say(("unit", unit), f"rlprof: unit {unit} is not sampled inside verl's workers (the verl plugin samples "
                 f"{facts.PLUGIN_UNIT}); verl goes on, {_instead(prof)}")
            return None
        if plan.tool not in ("torch", "npu"):
            _say(("tool", plan.tool), f"rlprof: tool {plan.tool} cannot sample micro-batches (torch and npu can); "
                 f"verl goes on, {_instead(prof)}")
            return None
        from ..config.describe import verl_alone

        release = _release()
        layout = _known_layout(release, verl_alone(plan, release).split(": ", 1)[-1])
        return None if layout is None else cls(prof, plan, layout)

    # verl's backend interface -------------------------------------------------------------------------------
    def start(self, **kwargs):
        self.step_n = kwargs.get("profile_step", kwargs.get("global_step"))
        if self.plan.mode == "discrete":
            return getattr(self.inner, "start", lambda **_: None)(**kwargs)

    def stop(self, *args, **kwargs):
        for window in list(self.windows):  # a stage left open by an error: closed and kept
            window.close()
        if self.plan.mode == "discrete":
            return getattr(self.inner, "stop", lambda *a, **k: None)(*args, **kwargs)

    def step(self):
        """verl's per-mini-batch step(): the unit here is the micro-batch, counted by the loop itself."""

    def annotate(self, message=None, role=None, **kwargs):
        name = role or message
        stage = facts.stage_of_annotation(name) if name else None
        if name == facts.TRAIN_BATCH:  # a TrainingWorker's own update mini-batch (the critic's in verl 0.9.x)
            stage = facts.UPDATE_STAGE_OF_ROLE.get(self.role)
        if stage not in facts.MICRO_BATCH_STAGES:
            if self.plan.mode == "discrete" and hasattr(self.inner, "annotate"):
                return self.inner.annotate(message=message, role=role, **kwargs)
            return _unchanged

        def decorator(func):
            @functools.wraps(func)
            def wrapper(*args, **kw):
                window = self.open(stage)
                if window is None:
                    return func(*args, **kw)
                token = _CURRENT.set(window)
                try:
                    return func(*args, **kw)
                finally:
                    _CURRENT.reset(token)
                    window.close()

            return wrapper

        return decorator

    def open(self, stage: str):
        try:
            window = _Window(self, stage)
        except Exception as exc:
            _say(("open", type(exc).__name__), f"rlprof: could not open a window for {stage} ({type(exc).__name__}: "
                 f"{exc}); verl goes on unprofiled there")
            return None
        self.windows.add(window)
        return window


def _unchanged(func):
    return func


class _Window:
    """One stage call: a backend window whose schedule advances one micro-batch at a time (lazily: the step that ends
    unit k is taken at the head of unit k+1, so nothing after a stage's last micro-batch opens a new cycle)."""

    def __init__(self, sampler: MicroBatchSampler, stage: str):
        from pathlib import Path

        from ..collect.backends import WindowSpec, backend_class
        from ..vocab import STAGE_ROLE

        self.sampler, self.stage = sampler, stage
        plan = sampler.plan
        self.schedule = plan.schedule
        self.save_path = Path(plan.save_path)
        self.save_path.mkdir(parents=True, exist_ok=True)
        self.world_size = _world_size()
        self.stem = _stem(sampler, stage, self.world_size)
        self.k = -1  # the unit now running (0-based within the stage call)
        self.unit = self.stage_range = None
        self.kept: list[int] = []
        self.failed = self.closed = False
        spec = WindowSpec(run_dir=self.save_path, steps=(sampler.step_n,), role=STAGE_ROLE.get(stage, sampler.role),
                          stage=stage, rank=sampler.rank, world_size=self.world_size or 1, replica=None, plan=plan,
                          base_name=lambda index: stage)
        cls = _torch_backend_class() if plan.tool == "torch" else backend_class(plan.tool)
        self.backend = cls(spec)
        self.backend.start()

    def unit_begins(self, describe) -> None:
        if self.failed or self.closed:
            return
        try:
            if self.unit is not None:
                self.unit_ends()
            k = self.k + 1
            phase, _ = self.schedule.phase(k)
            held = describe() if phase == "active" else None  # before the step: its ops stay out of the window
            if self.k >= 0:
                self.backend.step()
            self.k = k
            if phase == "active":
                from ..collect.profiler import unit_range_name

                if self.stage_range is None:
                    self.stage_range = self._enter("rlprof:stage:" + self.stage)
                self.unit = self._enter(unit_range_name(facts.PLUGIN_UNIT, k, held))
                self.kept.append(k)
        except Exception as exc:
            self._fail(exc)

    def unit_ends(self) -> None:
        if self.failed or self.closed:
            return
        try:
            if self.unit is not None:
                unit, self.unit = self.unit, None
                unit.__exit__(None, None, None)
            if self.stage_range is not None:
                now, cycle = self.schedule.phase(self.k)
                after, next_cycle = self.schedule.phase(self.k + 1)
                if not (after == "active" and next_cycle == cycle):  # this cycle's last kept unit: its file ends
                    stage_range, self.stage_range = self.stage_range, None
                    stage_range.__exit__(None, None, None)
        except Exception as exc:
            self._fail(exc)

    def _enter(self, name: str):
        rng = self.backend.range(name)
        rng.__enter__()
        return rng

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.sampler.windows.discard(self)
        if self.failed:
            return
        try:
            self.unit_ends_all()
            outputs = self.backend.stop()
        except Exception as exc:
            self.failed = True
            _say(("fault", type(exc).__name__), f"rlprof: sampling {self.stage} failed ({type(exc).__name__}: "
                 f"{exc}); the window is dropped and training goes on")
            return
        if self.k < 0:  # no micro-batch went through a loop the plugin knows: nothing sampled
            for out in outputs:
                _discard(out)
            _say(("no-units", self.stage), f"rlprof: {self.stage} ran no micro-batch through the loop the verl plugin "
                 f"watches ({self.sampler.layout} layout; another engine or strategy?): nothing was sampled in it")
            return
        for out in outputs:
            try:
                self._finish(out)
            except Exception as exc:
                _discard(out)
                _say(("export", type(exc).__name__), f"rlprof: a {self.stage} window could not be written "
                     f"({type(exc).__name__}: {exc}); training goes on")

    def unit_ends_all(self) -> None:
        if self.unit is not None:
            unit, self.unit = self.unit, None
            unit.__exit__(None, None, None)
        if self.stage_range is not None:
            stage_range, self.stage_range = self.stage_range, None
            stage_range.__exit__(None, None, None)

    def _finish(self, out) -> None:
        from ..collect.tracefile import finalize_trace

        if out.finalize_to is None:  # npu: torch_npu wrote its own directory under save_path/<stage>/
            return
        suffix = f"_part{out.index}" if out.index else ""
        dest = self.save_path / f"{self.stem}{suffix}.json.gz"
        plan = self.sampler.plan
        meta = {"step": self.sampler.step_n, "role": self.backend.spec.role, "stage": self.stage,
                "rank": self.sampler.rank, "world_size": self.world_size, "tool": plan.tool, "mode": "discrete",
                "window": out.index or 0, "framework": "verl", "collected_by": facts.PLUGIN_MODULE,
                "sampled": {"unit": facts.PLUGIN_UNIT, "kept": self.kept}}  # a window of units, not one unit
        try:
            size, truncated = finalize_trace(out.path, dest, meta, plan.max_bytes_per_window)
        finally:
            out.path.unlink(missing_ok=True)
        print(f"[rlprof] rank {self.sampler.rank}: {self.stage} step {self.sampler.step_n}: micro-batch(es) "
              f"{', '.join(map(str, self.kept))} -> {dest}" + (" (truncated)" if truncated else ""), flush=True)

    def _fail(self, exc: BaseException) -> None:
        self.failed = True
        _say(("fault", type(exc).__name__), f"rlprof: sampling {self.stage} failed ({type(exc).__name__}: {exc}); "
             "the window is dropped and training goes on")
        try:
            for out in self.backend.stop():
                _discard(out)
        except Exception:
            pass


def _discard(out) -> None:
    if out.finalize_to is not None and out.path is not None:
        out.path.unlink(missing_ok=True)


def _world_size() -> int | None:
    try:
        import torch.distributed as dist

        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else None
    except Exception:
        return None


def _stem(sampler: MicroBatchSampler, stage: str, world_size: int | None) -> str:
    """verl's own trace stem for this stage (its build_trace_basename where it has one: verl 0.9.1 on)."""
    try:
        from verl.utils.profiler.torch_profile import build_trace_basename
    except ImportError:
        build_trace_basename = None
    if build_trace_basename is not None:
        return build_trace_basename(rank=sampler.rank, role=stage, save_file_prefix=sampler.prefix,
                                    profile_step=sampler.step_n)
    import os
    from datetime import datetime, timezone

    stamp = datetime.now(tz=timezone.utc).astimezone().strftime("%Y%m%d%H%M%S%f")[:-3]
    return facts.trace_stem(sampler.rank, stage, sampler.prefix, sampler.step_n, world_size, os.getpid(), stamp)


def _sampling_torch_backend():
    from ..collect.backends.torch_backend import TorchBackend

    class SamplingTorchBackend(TorchBackend):
        """rlprof's torch backend without torch's ProfilerStep# ranges (a step here is a micro-batch), and keeping
        a cycle the stage ended in the middle of (torch saves a cycle only once it reaches its last unit)."""

        record_steps = False

        def stop(self):
            prof = self._prof
            action = self._torch.profiler.ProfilerAction
            if prof is not None and self.spec.schedule is not None and getattr(prof, "current_action", None) \
                    is action.RECORD:
                prof.current_action = action.RECORD_AND_SAVE
            return super().stop()

    return SamplingTorchBackend


_torch_backend: list = []  # the class above, built on first use (importing torch is the backend's business)


def _torch_backend_class():
    if not _torch_backend:
        _torch_backend.append(_sampling_torch_backend())
    return _torch_backend[0]


def _at_import() -> None:
    try:
        _hand_rollout_plan(sys.argv[1:], os.environ)
    except Exception as exc:  # never break verl's import
        _say("hand-plan", f"rlprof: the rollout's decode-step plan could not be handed to vLLM ({type(exc).__name__}: "
             f"{exc}); verl goes on without it")
    _install()


_at_import()

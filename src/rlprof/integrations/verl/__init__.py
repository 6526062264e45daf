"""rlprof inside verl's own worker processes: micro-batch sampling of verl's log-prob and update stages, asked for in
verl's profiler config, with no edit to verl's source.

How it gets there: verl imports `loader.py` in every process that imports verl, through the `verl.plugins` entry
point rlprof installs (verl 0.9.0 on), or the modules listed in VERL_USE_EXTERNAL_MODULES (verl 0.7.x; Ray's
runtime_env carries it to the workers). verl 0.7.x's `actor_rollout_ref.model.external_lib` is imported too late:
in init_model, after the worker's __init__ has built (and refused) its profiler's tool config.

The modules, one job each:
- `loader.py`: the entry point. On import it only waits, importing nothing but the standard library, `frameworks`
  and the two light modules below, after two of verl's modules, to wrap two things in memory:
  verl.utils.profiler.config (`config_keys.py`: the torch schedule dataclass accepts rlprof's `unit`, and tools
  whose verl config has no schedule (torch before 0.9, npu) accept one; verl itself would refuse the key when it
  builds its workers) and verl.utils.profiler.profile (DistProfiler.__init__ looks at the tool config it was given;
  unless the schedule says `unit: micro_batch`, it returns at once and verl's profiler is verl's).
- `rollout_plan.py`: on main_ppo's driver, a rollout decode window asked for on the command line is handed to
  rlprof's vLLM plugin (`RLPROF_PLAN` in the environment Ray's processes inherit), and each rollout replica's
  engine learns its index.
- `sampler.py`: what happens when asked (a DistProfiler enabled on this rank whose schedule says
  `unit: micro_batch`): that DistProfiler's backend (`_impl`) becomes a `MicroBatchSampler`. verl still decides the
  steps and ranks (its start()/stop() per profiled step, its rank gate) and calls the sampler's annotate() for each
  stage it marks: each call of a stage that runs micro-batches (actor/ref compute_log_prob, update_actor, the
  critic's) becomes a window of its own (collect/window.py's lifecycle) whose schedule (torch's or torch_npu's, the
  same calls) advances at the head of each micro-batch. Each kept micro-batch is a range
  `rlprof:micro_batch:K|seqs=..,tokens=..,real_tokens=..` inside `rlprof:stage:<stage>`; each window is a file
  named and placed as verl's own profiler names its traces (save_path, `{worker}_{stage}_step{N}_rank..`), so
  verl's finish_hook_cmd and `rlprof analyze` see it. Other stages: in discrete mode verl's own backend collects
  them as before; in e2e mode the sampled windows replace verl's whole-step trace.
- `layouts.py`: the micro-batch loops of the verl releases the plugin knows, where the units begin and end:
  FSDPEngine.forward_backward_batch (0.9.x, head), before verl enters its `micro_batch{k}` range, so micro-batch
  k's backward stays in its window; DataParallelPPOActor/-Critic (0.7.x).

Never breaks the host: every fault inside is one logged warning and verl goes on; a verl release or layout the plugin
does not know is one warning and no patching (verl's own profiler then collects what the warning names).
"""

"""The environment variables the vLLM plugin reads in every process of an engine (and the verl plugin sets on
main_ppo's driver). Nothing else: the loader and the verl plugin's light modules import it."""

ENV_PLAN = "RLPROF_PLAN"  # a config file and/or key=value overrides, shell-quoted: the plan an engine follows
ENV_REPLICA = "RLPROF_REPLICA"  # this engine's replica index (default 0)
ENV_STEPS = "RLPROF_VLLM_STEPS"  # what a step is in the engine (STEP_SOURCES)
STEP_SOURCES = ("auto", "profile_calls", "rounds", "driver")

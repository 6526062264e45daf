"""Reference GRPO/DAPO trainer, instrumented with rlprof (the host profiled by `rlprof train`)."""

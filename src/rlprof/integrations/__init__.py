"""Integrations with other trainers and inference engines (they use rlprof.collect)."""

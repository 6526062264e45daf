"""Analysis: reads trace files, never imports torch, the trainer or collect."""

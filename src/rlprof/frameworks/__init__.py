"""What rlprof knows of each RL framework, as data: config keys, file-name patterns, stage annotations.

No torch and no framework import: config/ (dialects) and analyze/ (readers) both read it.
"""

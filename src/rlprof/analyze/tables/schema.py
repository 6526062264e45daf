"""The analysis document's schema version: what its tables and records look like. The background analysis's cache
keys on it (window/per_file.py) and a document read back is checked against it (pipeline.py, result.py)."""

SCHEMA_VERSION = 1

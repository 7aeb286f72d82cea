"""Fuzzing harness (issue 21): seeded mutations of real corpus files, ingested in batches beside a
good file; see run.py."""

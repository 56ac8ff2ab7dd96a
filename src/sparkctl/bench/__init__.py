"""Benchmarks: llama-benchy runs with engine-metric deltas, stored with the deployment's fingerprint."""

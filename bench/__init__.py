"""Benchmarks for agent-server: run them as `python -m bench.<name>` from the repository root."""

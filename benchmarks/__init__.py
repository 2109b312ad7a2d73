"""Benchmarks: reproducible commands that print figures (see benchmarks/README.md)."""

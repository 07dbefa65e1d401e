"""Benchmarks: `python -m benchmarks [--quick] [--only NAME ...]` (`make bench`)."""

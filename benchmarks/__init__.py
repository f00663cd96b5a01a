"""Benchmarks for sglang-replayssm (not part of the installed package).

Run from the repository root, e.g. ``python -m benchmarks.bench_decode --help``; see README.md here.
"""

"""Benchmarks behind docs/design.md's targets and the published-validation scripts: each writes its headline figures
(bench/figures.py)."""

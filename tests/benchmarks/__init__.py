"""Benchmarks: ``python -m tests.benchmarks [NAME ...]`` runs every ``bench_*.py`` module
(or those named) and prints their tables. Not collected by pytest."""

"""Offline replay of span exports: baselines, the pre-deploy gate, backtests, mutants."""

"""Searching architectures: the differentiable per-layer masks, the inner search (budgets, teacher
cache, training loop, discretisation), trial modes, Ray Tune + Optuna studies, study I/O and plots.
"""

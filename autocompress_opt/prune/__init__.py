"""Structured pruning of a real model: importance scores, pruning plans, mask hooks, weight slicing
into a smaller model, export, and the uniform (Minitron-style) baselines.

Imports :mod:`autocompress_opt.arch`, :mod:`~autocompress_opt.hf`, :mod:`~autocompress_opt.serving`
and :mod:`~autocompress_opt.quality`.
"""

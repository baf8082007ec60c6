"""Structured pruning of a real model: importance scores, pruning plans, mask hooks, weight slicing
into a smaller model, export, the uniform (Minitron-style) baselines and the per-layer block
library (:mod:`~autocompress_opt.prune.block_library`: every layer variant scored by replace-one KL).

Imports :mod:`autocompress_opt.arch`, :mod:`~autocompress_opt.hf`, :mod:`~autocompress_opt.serving`
and :mod:`~autocompress_opt.quality`.
"""

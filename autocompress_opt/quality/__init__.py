"""How good a model is: the one KL divergence / cross-entropy / perplexity, held-out text batches.

Imports nothing from the other subpackages but :mod:`autocompress_opt.arch`.
"""

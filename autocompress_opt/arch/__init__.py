"""Architectures as pure data (no torch): :class:`Architecture` and :class:`LayerSpec`, the
per-layer block configs, search spaces, the model catalog, and readers of config / GGUF files.

Lowest layer of the package: it imports nothing from the other subpackages.
"""

"""Hugging Face transformers interop: family adapters (where heads, FFN channels and layers live),
the package's heterogeneous decoder (``autocompress_decilm``), and loading real weights.

Imports only :mod:`autocompress_opt.arch`.
"""

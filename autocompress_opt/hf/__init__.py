"""Hugging Face transformers interop: family adapters (where heads, FFN channels and layers live),
the package's heterogeneous decoder (``autocompress_decilm``), the one decision of which
transformers model an architecture becomes (:mod:`.build`: a plain family model when uniform, else
the heterogeneous decoder; export writes it and CPU timing times it), and loading real weights.

Imports only :mod:`autocompress_opt.arch`.
"""

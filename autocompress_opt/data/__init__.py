"""The text every verb reads: built-in sources, a user's ``--data``, and the split into three roles.

- :mod:`~autocompress_opt.data.textdata`: sources, the calibration / selection / test split by
  document, and token rows with their record; :mod:`~autocompress_opt.data.overlap` keeps nested
  documents in one role and drops held-out rows that share a long n-gram with calibration text.
- :mod:`~autocompress_opt.data.user`: a user's files and datasets as sources (``--data SPEC``: the
  grammar, and every spec checked before a model loads), read by
  :mod:`~autocompress_opt.data.tables` (rows of JSONL, JSON, parquet, ``datasets``; JSONL streamed),
  :mod:`~autocompress_opt.data.rows` (a row's fields as a document: text, named fields, chats),
  :mod:`~autocompress_opt.data.chat` (chats rendered without a template's default system prompt) and
  :mod:`~autocompress_opt.data.file_index` (one pass over a file, kept by its path, size and mtime).
- :mod:`~autocompress_opt.data.stream`: a role's documents read as a stream of rows, for as long
  as a run needs (distillation), tokenised as they are reached and resumable from a position.

This folder also holds the package's data files (hardware tables, profiles, search spaces;
:mod:`autocompress_opt._data`); importing the package reads none of them and imports no torch.
"""

from __future__ import annotations

__all__: list[str] = []

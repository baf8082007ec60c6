"""The text every verb reads: built-in sources, a user's ``--data``, and the split into three roles.

- :mod:`~autocompress_opt.data.textdata`: sources, the calibration / selection / test split by
  document, and token rows with their record.
- :mod:`~autocompress_opt.data.user`: a user's files and datasets as sources (``--data SPEC``).
- :mod:`~autocompress_opt.data.stream`: a role's documents read as a stream of rows, for as long
  as a run needs (distillation), tokenised as they are reached and resumable from a position.

This folder also holds the package's data files (hardware tables, profiles, search spaces;
:mod:`autocompress_opt._data`); importing the package reads none of them and imports no torch.
"""

from __future__ import annotations

__all__: list[str] = []

"""The text every verb reads: built-in sources, a user's ``--data``, and the split into three roles.

- :mod:`~autocompress_opt.data.textdata`: sources, the calibration / selection / test split by
  document, and token rows with their record.
- :mod:`~autocompress_opt.data.user`: a user's files and datasets as sources (``--data SPEC``).

This folder also holds the package's data files (hardware tables, profiles, search spaces;
:mod:`autocompress_opt._data`); importing the package reads none of them and imports no torch.
"""

from __future__ import annotations

__all__: list[str] = []

"""Searching architectures, in two rooms: :mod:`~autocompress_opt.search.inner` (one trial's
differentiable mask search under a budget) and :mod:`~autocompress_opt.search.study` (the Ray Tune +
Optuna study around it). ``study`` imports ``inner``, never the reverse (pyproject's import-linter
contract)."""

"""The inner search of one trial: the differentiable per-layer masks over a frozen parent (the
relaxation), the budget they are held to, the cached teacher targets, the training loop
(:func:`~autocompress_opt.search.inner.inner_search.inner_search`) and the discretisation that turns
trained masks into an exact architecture; and the exact solver over the block library
(:func:`~autocompress_opt.search.inner.block_solver.solve_block_library`, the ``"block-library"``
candidate). Knows nothing of studies, Ray or Optuna."""

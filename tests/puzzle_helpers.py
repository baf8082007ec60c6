"""Masks whose MoE layers keep different sizes, for the Nemotron-H Puzzle tests (prune and engine)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from autocompress_opt.prune.experts import expert_masks
from autocompress_opt.prune.importance import Importance
from autocompress_opt.prune.masking import Masks


def per_layer_masks(
    model: Any, importance: Importance, base: dict[str, int], layers: dict[int, dict[str, int]]
) -> Masks:
    """:func:`expert_masks` of the point ``base`` in every layer, except layer ``i`` of ``layers``, which
    takes the point ``base | layers[i]`` (e.g. its own ``expert_width`` and ``experts_per_token``)."""
    masks = expert_masks(model, importance, base)
    kept = list(masks.layers)
    for i, point in layers.items():
        kept[i] = expert_masks(model, importance, {**base, **point}).layers[i]
    return replace(masks, layers=tuple(kept))


def llamacpp_study(name: str, model_dir: Path, target: Any, tmp_path: Path, trials: int) -> tuple[Any, Any]:
    """A short weights study of the Nemotron-H in ``model_dir`` served by llama.cpp (its trials give each
    MoE layer its own expert width and top-k), run on a local Ray of one CPU: its config and outcome."""
    import ray

    from autocompress_opt.hf.loading import load_model
    from autocompress_opt.search.study import StudyConfig, init_ray, run_study
    from autocompress_opt.search.study.config import expert_space

    parent = load_model(model_dir).architecture
    inner = {"steps": 12, "lr": 0.1, "n_samples": 8, "val_samples": 2, "seq_len": 16}
    config = StudyConfig(
        name=name,
        model=str(model_dir),
        targets=(target,),
        space=_experts_only(expert_space(parent), parent),  # the per-layer expert sizes are what it is about
        mode="weights",
        serve_as="llamacpp",
        inner={**inner, "eval_samples": 2, "eval_seq_len": 16, "importance_samples": 2, "importance_seq_len": 16},
        trials=trials,
        storage=f"sqlite:///{tmp_path}/studies.db",
        concurrency=1,
    )
    init_ray(None, 1, ())
    try:
        [outcome] = run_study(config, progress=False)
    finally:
        ray.shutdown()
    return config, outcome


def _experts_only(space: Any, parent: Any) -> Any:
    """``space`` with the dense choices it varies (depth, attention heads) pinned to the parent's."""
    from dataclasses import replace

    from autocompress_opt.arch.hybrid import sparse_limits
    from autocompress_opt.arch.search_space import Choice
    from autocompress_opt.search.study.config import MOE_DENSE_CHOICES

    limits = sparse_limits(parent)
    pinned = lambda c: Choice(c.name, (limits[c.name],)) if c.name in MOE_DENSE_CHOICES else c
    return replace(space, choices=tuple(pinned(c) for c in space.choices))

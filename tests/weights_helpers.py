"""Shared pieces of the weights-trial tests: a tiny inner-search budget, the target they search
for, and the trial request for a saved tiny parent (tests/search, tests/prune)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autocompress_opt.hf.loading import load_model
from autocompress_opt.serving.targets import Target

PARAMS = {"num_layers": 3, "hidden_size": 32, "ffn_width": 32, "num_kv_heads": 1, "q_per_kv": 2}
INNER = {
    "steps": 3,
    "n_samples": 4,
    "val_samples": 1,
    "seq_len": 32,
    "eval_samples": 2,
    "eval_seq_len": 32,
    "importance_samples": 2,
    "importance_seq_len": 32,
}
TARGET = Target("h100-sxm", "datacenter", constraints={"tpot_ms": "0.95x", "output_throughput_tok_s": "1.05x"})


def request(parent_dir: Path, cache: Path, **changes: Any) -> dict[str, Any]:
    """The request a study sends a weights trial of ``PARAMS`` on the parent saved at ``parent_dir``."""
    arch = load_model(parent_dir).architecture
    return {
        "mode": "weights",
        "params": dict(PARAMS),
        "parent": arch.to_dict(),
        "target": TARGET.to_dict(),
        "layer_order": None,
        "seed": 0,
        "parent_model": str(parent_dir),
        "cache_dir": str(cache),
        "inner": dict(INNER),
        **changes,
    }


def tiny_weights_study(root: Path, *, trials: int, inner: dict[str, Any], **changes: Any) -> Any:
    """A finished weights-mode study ``w`` of ``trials`` trials on a tiny 4-layer Llama saved under
    ``root``, for :data:`TARGET` (its storage ``root/w.db``; its caches where ``changes`` or the
    working directory put them); returns its :class:`~autocompress_opt.search.study.StudyConfig`.
    Ray is shut down after, so that a later test does not reuse a Ray started without its plugins."""
    from tiny_lm import save_hf_dir, tiny_model

    from autocompress_opt.arch.catalog import load_architecture
    from autocompress_opt.arch.search_space import default_space
    from autocompress_opt.search.study import StudyConfig, run_study

    model_dir = save_hf_dir(tiny_model("llama", num_hidden_layers=4), root / "llama")
    config = StudyConfig(
        **{
            "name": "w",
            "model": str(model_dir),
            "targets": (TARGET,),
            "space": default_space(load_architecture(str(model_dir))),
            "trials": trials,
            "storage": f"sqlite:///{root}/w.db",
            "mode": "weights",
            "inner": inner,
            "seed_baselines": False,
            "concurrency": 1,
            # the tiny Llama's FFN (48) is below DeciLM's 256: vLLM's rules would allow only uniform points
            "serve_as": "any",
            **changes,
        }
    )
    try:
        run_study(config, progress=False)
    finally:
        import ray

        ray.shutdown()
    return config

"""The ``weights`` trial of a mixture-of-experts or hybrid parent (issue 30): the point's uniform counts of
experts, top-``k``, expert width and, for Nemotron-H, shared-expert width and Mamba-2 heads, filled by
the expert search, cut, measured and costed.

The ``weights`` trial mode (:func:`run_weights_mode`) hands a MoE parent's request here; request and
result follow :func:`~autocompress_opt.search.study.weights_trial.run_weights_trial`'s contract, with three differences:

* the point must hold the dense axes (``num_layers``, ``hidden_size``, heads, ``ffn_width``) at the
  parent's sizes (:func:`~autocompress_opt.search.inner.experts.expert_point` says which one does not);
  the outer loop chooses how many experts, the top-``k``, the expert width (and shared width and
  Mamba-2 heads where the parent has them), the inner search
  (:func:`~autocompress_opt.search.inner.experts.search_experts`) which experts, channels and heads;
* ``kept`` is the expert record (:func:`~autocompress_opt.prune.expert_kept.expert_kept`), which the
  study stores and :func:`~autocompress_opt.search.study.export.export_trial` cuts exactly;
* the candidates are ``trained`` and ``start`` (the importance choice); seeded baselines
  (``request["baselines"]``) are not weighed: the expert seed (:mod:`.moe_study`) is the ``start``
  candidate of its point;
* ``serve_as``: the point's uniform child is checked before the search
  (:func:`~autocompress_opt.prune.loadability.loadable_problems`). Where the family has a per-layer
  form and the engine reads it (:data:`~autocompress_opt.arch.hybrid.PER_LAYER_MOE`: Nemotron-H's
  Puzzle form for llama.cpp and the package's own class, or ``serve_as`` ``any``), the search gives
  each MoE layer its own expert width and top-``k`` under the point's budgets (issue 43; ``per_layer``
  in the inner record) and the child is a ``nemotron_h_puzzle`` model; else the family's plain config.

The child is :func:`~autocompress_opt.prune.experts.slice_experts` of the parent (the family's plain
model, or its Puzzle form); its held-out quality is cached on disk keyed by the kept record too, since which experts a
trial keeps is not a function of its architecture here.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.hybrid import hybrid_child, is_sparse
from autocompress_opt.cache import cache_key, fetch
from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.device import dtype_name
from autocompress_opt.hf.host_memory import reused_host_memory
from autocompress_opt.prune.expert_kept import expert_kept
from autocompress_opt.prune.loadability import SERVE_AS_ANY, check_serve_as
from autocompress_opt.search.inner.budget import CostGoal
from autocompress_opt.search.inner.experts import ExpertResult, search_experts
from autocompress_opt.search.inner.teacher import teacher_form
from autocompress_opt.search.study.progress import TrialProgress, report
from autocompress_opt.search.study.trials import check_loadable, searches_per_layer
from autocompress_opt.search.study.weights_trial import (
    DEFAULT_CACHE_DIR,
    QUALITY_CACHE_VERSION,
    QUALITY_KIND,
    ParentContext,
    TrialConfig,
    heldout_quality,
    parent_context,
    run_weights_trial,
)
from autocompress_opt.serving.costmodel import estimate_cost
from autocompress_opt.serving.targets import Target

__all__ = ["run_moe_trial", "run_weights_mode"]


def run_weights_mode(request: Mapping[str, Any]) -> dict[str, Any]:
    """The ``weights`` trial mode (:data:`~autocompress_opt.search.study.trials.TRIAL_MODES`):
    :func:`run_moe_trial` for a parent with MoE layers, else
    :func:`~autocompress_opt.search.study.weights_trial.run_weights_trial`."""
    if is_sparse(Architecture.from_dict(request["parent"])):
        return run_moe_trial(request)
    return run_weights_trial(request)


def run_moe_trial(request: Mapping[str, Any]) -> dict[str, Any]:
    """One weights-mode trial of a MoE or hybrid parent (module doc; the request and result of
    :mod:`~autocompress_opt.search.study.weights_trial`), its vocabulary-wide CPU tensors reusing
    freed pages as a dense trial's do (:func:`~autocompress_opt.hf.host_memory.reused_host_memory`)."""
    with reused_host_memory():
        return _moe_trial(request)


def _moe_trial(request: Mapping[str, Any]) -> dict[str, Any]:
    began = time.perf_counter()
    parent_arch = Architecture.from_dict(request["parent"])
    target = Target.from_dict(request["target"])
    config = TrialConfig.from_dict(request.get("inner"), seed=int(request.get("seed", 0))).for_workload(target.workload)
    # The child is the family's plain config (one expert count, width and top-k for every MoE layer), the
    # shape vLLM, SGLang, TensorRT-LLM and llama.cpp load: checked here before the search, at the point.
    serve_as = check_serve_as(str(request.get("serve_as") or SERVE_AS_ANY))
    check_loadable(
        hybrid_child(parent_arch, kept_layers=_present(parent_arch), point=request["params"]), parent_arch, serve_as
    )
    cache_dir = Path(request.get("cache_dir") or DEFAULT_CACHE_DIR)
    ref = str(request.get("parent_model") or parent_arch.name)
    if not ref:
        raise ConfigError("the parent architecture has no name; pass request['parent_model'] (a path or known name)")
    parent, fresh = parent_context(ref, config, cache_dir)
    if replace(parent.architecture, name="") != replace(parent_arch, name=""):
        raise ConfigError(f"request['parent'] does not describe the model loaded from {ref!r}")
    ready = time.perf_counter()
    steps = config.inner.steps
    report(TrialProgress("inner search", 0, steps))
    result = search_experts(
        parent.model,
        parent.architecture,
        parent.importance,
        parent.tokens,
        parent.teacher,
        params=dict(request["params"]),
        goal=CostGoal.for_target(target, parent.architecture),
        config=config.inner,
        on_step=lambda step, kl, violation: report(TrialProgress("inner search", step, steps, kl, violation)),
        measure_at=request.get("measure_at"),
        per_layer=searches_per_layer(parent_arch, serve_as),
    )
    searched = time.perf_counter()
    kept = expert_kept(result.masks, parent.architecture)
    quality, cached = _quality(parent, result, kept, cache_dir)
    done = time.perf_counter()
    timings = {"parent": ready - began, "search": searched - ready, "quality": done - searched, "total": done - began}
    if fresh:
        timings.update({f"parent_{k}": v for k, v in parent.seconds.items()})
    arch = result.architecture
    weight = next(parent.model.parameters())
    return {
        "architecture": arch.to_dict(),
        "kept": kept,
        "metrics": estimate_cost(arch, target.hardware, target.engine_obj(), target.scenario()).to_dict(),
        "quality": math.exp(-quality["kl_to_parent"]),
        "quality_kind": QUALITY_KIND,
        **quality,
        "quality_cached": cached,
        "selection": result.choice(),
        "serve_as": serve_as,
        "compute": {
            "device": str(weight.device),
            "dtype": dtype_name(weight.dtype),
            "devices": sorted({str(p.device) for p in parent.model.parameters()}),
        },
        "teacher": teacher_form(parent.teacher),
        "timings_s": timings,
        "inner": {**result.summary(), "config": config.to_dict()},
    }


def _present(parent: Architecture) -> list[int]:
    """The parent's present layers (an expert trial keeps them all)."""
    return [i for i, layer in enumerate(parent.layers) if not layer.is_noop]


def _quality(
    parent: ParentContext, result: ExpertResult, kept: Mapping[str, Any], cache_dir: Path
) -> tuple[dict[str, float], bool]:
    """Held-out KL and perplexities of the sliced child, and whether they came from the disk cache
    (keyed by the parent, its importance data, the architecture, the kept record and the data)."""
    from autocompress_opt.prune.experts import slice_experts

    def measure() -> dict[str, float]:
        return heldout_quality(parent, slice_experts(parent.model, result.masks))

    imp = parent.importance.meta
    arch = {**result.architecture.to_dict(), "name": ""}
    parts = (parent.parent_id, imp.data_id, imp.method, arch, dict(kept), parent.eval_id)
    return fetch(
        cache_dir / "quality" / f"{cache_key(QUALITY_CACHE_VERSION, *parts)}.json",
        measure,
        lambda out, tmp: tmp.write_text(json.dumps(out, indent=2), encoding="utf-8"),
        lambda path: json.loads(path.read_text(encoding="utf-8")),
    )

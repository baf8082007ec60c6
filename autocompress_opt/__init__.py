"""autocompress_opt: hardware-guided structured pruning of decoder LLMs.

The public API, imported lazily (``import autocompress_opt`` loads neither torch nor transformers;
each name's module is imported on first use)::

    import autocompress_opt as ac

    arch = ac.load_architecture("smollm2-135m")
    cost = ac.estimate_cost(arch, ac.get_hardware("h100-sxm"), ac.get_engine("vllm"),
                            ac.Scenario(batch=8, prompt_len=1024, output_len=256))
    print(cost.tpot_ms, cost.throughput_tok_s)

The package is layered, lowest first (``.importlinter`` checks that imports only run downwards):

* :mod:`autocompress_opt.arch`: architectures as pure data, search spaces, the model catalog;
* :mod:`autocompress_opt.hf`: transformers interop (family adapters, the heterogeneous decoder,
  building the model of an architecture, loading);
* :mod:`autocompress_opt.serving`: hardware, engines, formats, workloads, targets, the cost model,
  its fitting, validation and calibration; :mod:`autocompress_opt.quality`: KL, perplexity,
  held-out text;
* :mod:`autocompress_opt.prune`: importance, plans, masks, slicing, export, baselines;
* :mod:`autocompress_opt.search`: the inner mask search, trial modes, Ray Tune + Optuna studies;
* :mod:`autocompress_opt.recover` (distillation) and :mod:`autocompress_opt.tasks` (the task suite);
* :mod:`autocompress_opt.cli`: the ``autocompress`` command, one thin module per verb.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it (the one implementation; see each module's docstring)
_API: dict[str, str] = {
    # architectures
    "Architecture": "autocompress_opt.arch.architecture",
    "LayerSpec": "autocompress_opt.arch.architecture",
    "load_architecture": "autocompress_opt.arch.catalog",
    "known_architectures": "autocompress_opt.arch.catalog",
    "SearchSpace": "autocompress_opt.arch.search_space",
    "default_space": "autocompress_opt.arch.search_space",
    "load_search_space": "autocompress_opt.arch.search_space",
    # serving cost
    "Hardware": "autocompress_opt.serving.hardware",
    "get_hardware": "autocompress_opt.serving.hardware",
    "load_hardware_file": "autocompress_opt.serving.hardware",
    "get_engine": "autocompress_opt.serving.engine_models",
    "Workload": "autocompress_opt.serving.workloads",
    "get_workload": "autocompress_opt.serving.workloads",
    "Target": "autocompress_opt.serving.targets",
    "Scenario": "autocompress_opt.serving.costmodel",
    "CostEstimate": "autocompress_opt.serving.costmodel",
    "estimate_cost": "autocompress_opt.serving.costmodel",
    # models
    "load_model": "autocompress_opt.hf.loading",
    "estimate_importance": "autocompress_opt.prune.importance",
    "plan_pruning": "autocompress_opt.prune.plan",
    "prune": "autocompress_opt.prune.slicing",
    "uniform_baseline": "autocompress_opt.prune.baselines",
    "export_model": "autocompress_opt.prune.export",
    "load_exported": "autocompress_opt.prune.export",
    # search
    "StudyConfig": "autocompress_opt.search.study.config",
    "run_study": "autocompress_opt.search.study.run",
    "load_records": "autocompress_opt.search.study.storage",
    "pareto_front": "autocompress_opt.search.study.records",
    # quality and recovery
    "kl_divergence": "autocompress_opt.quality.metrics",
    "perplexity": "autocompress_opt.quality.metrics",
    "evaluate": "autocompress_opt.quality.metrics",
    "evaluate_tasks": "autocompress_opt.tasks.scoring",
    "DistillRecipe": "autocompress_opt.recover.recipe",
    "distill": "autocompress_opt.recover.distill",
    "FinalistRecipe": "autocompress_opt.recover.finalists",
    "rank_finalists": "autocompress_opt.recover.finalists",
    # errors
    "AutocompressError": "autocompress_opt.errors",
    "ConfigError": "autocompress_opt.errors",
}

__all__ = sorted(_API)

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from autocompress_opt.arch.architecture import Architecture, LayerSpec
    from autocompress_opt.arch.catalog import known_architectures, load_architecture
    from autocompress_opt.arch.search_space import SearchSpace, default_space, load_search_space
    from autocompress_opt.errors import AutocompressError, ConfigError
    from autocompress_opt.hf.loading import load_model
    from autocompress_opt.prune.baselines import uniform_baseline
    from autocompress_opt.prune.export import export_model, load_exported
    from autocompress_opt.prune.importance import estimate_importance
    from autocompress_opt.prune.plan import plan_pruning
    from autocompress_opt.prune.slicing import prune
    from autocompress_opt.quality.metrics import evaluate, kl_divergence, perplexity
    from autocompress_opt.recover.distill import distill
    from autocompress_opt.recover.finalists import FinalistRecipe, rank_finalists
    from autocompress_opt.recover.recipe import DistillRecipe
    from autocompress_opt.search.study.config import StudyConfig
    from autocompress_opt.search.study.records import pareto_front
    from autocompress_opt.search.study.run import run_study
    from autocompress_opt.search.study.storage import load_records
    from autocompress_opt.serving.costmodel import CostEstimate, Scenario, estimate_cost
    from autocompress_opt.serving.engine_models import get_engine
    from autocompress_opt.serving.hardware import Hardware, get_hardware, load_hardware_file
    from autocompress_opt.serving.targets import Target
    from autocompress_opt.serving.workloads import Workload, get_workload
    from autocompress_opt.tasks.scoring import evaluate_tasks


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'autocompress_opt' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))

"""What defines a study group: :class:`StudyConfig` (its targets, search space, trials, mode and
how they run), its objectives, the trials' ``inner`` settings, and :func:`check_config`, every
option checked against the parent before any storage is touched.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.hybrid import SPARSE_CHOICES, is_moe, sparse_limits
from autocompress_opt.arch.search_space import Choice, SearchSpace, default_space
from autocompress_opt.errors import ConfigError, check_int, suggest
from autocompress_opt.prune.loadability import SERVE_AS_ANY, check_serve_as, parent_problems, rules_engine_for
from autocompress_opt.search.study.placement import check_cache_dir, check_driver_device, check_trial_gpus
from autocompress_opt.search.study.storage import default_storage, resolve_storage
from autocompress_opt.search.study.trials import (
    PLAN_QUALITIES,
    TRIAL_MODES,
    Target,
    load_plugins,
    parent_metrics,
    register_hardware,
)

__all__ = [
    "ASHA_MIN_TRIALS",
    "EXPERT_WIDTH_MULTIPLE",
    "MOE_DENSE_CHOICES",
    "PROXY_POINTS",
    "PROXY_QUALITIES",
    "RUNNERS_UP",
    "SCHEDULERS",
    "SEEDED_BASELINES",
    "Objective",
    "StudyConfig",
    "check_config",
    "check_moe_space",
    "expert_space",
    "inner_settings",
    "sampler_seed",
]

DEFAULT_GROUP: tuple[str, ...] = ("rtx5070", "rtx5080", "h100-sxm", "b200")
_MAXIMISE = {"quality", "output_throughput_tok_s", "max_concurrency"}
PRIMARY_METRIC = {"local-coding": "ttft_ms", "datacenter": "output_throughput_tok_s", "in-game": "tpot_ms"}
# The baselines a study enqueues before its own samples, in this order (prune/baselines.BASELINES).
SEEDED_BASELINES: tuple[str, ...] = ("depth", "minitron", "best-uniform")
# Early stopping of trials by Ray Tune's scheduler (StudyConfig.scheduler, schedulers.make_scheduler).
SCHEDULERS: tuple[str, ...] = ("asha", "none")
ASHA_MIN_TRIALS = 4  # with this many trials or fewer ASHA has too few to compare: off by default
PROXY_POINTS = 4  # weights mode: points the plan-mode proxy enqueues per target by default
PROXY_QUALITIES = ("importance", "estimate")  # what ranks them (StudyConfig.proxy_quality)
RUNNERS_UP = 2  # weights mode: best-uniform's next-best scored candidates seeded after the baselines by default
# The dense choices a MoE parent's weights trial cuts before its expert search (weights_trial.dense_cut).
MOE_DENSE_CHOICES: tuple[str, ...] = ("num_layers", "hidden_size", "num_kv_heads", "q_per_kv")
# Expert widths are multiples of this: transformers' grouped expert matmul (Qwen3-MoE's experts) needs
# 16-byte row strides ("strides should be multiple of 16 bytes", run on CPU), 8 channels in bf16.
EXPERT_WIDTH_MULTIPLE = 8


@dataclass(frozen=True)
class Objective:
    """One optimisation direction: ``quality`` or a cost metric, maximised or minimised.

    ``quality`` is one stored objective name for every trial mode (existing studies keep loading);
    its meaning is the trial's ``quality_kind``: the retained-parameter fraction or retained
    importance in plan mode, ``exp(-KL to parent)`` in weights mode (see
    :data:`~autocompress_opt.search.study.trials.QUALITY_LABELS`).
    """

    metric: str
    direction: str

    def __post_init__(self) -> None:
        from autocompress_opt.serving.costmodel import METRICS

        valid = ("quality",) + METRICS
        if self.metric not in valid:
            raise ConfigError(
                f"unknown objective {self.metric!r}{suggest(self.metric, valid)}; valid: {', '.join(valid)}"
            )
        if self.direction not in ("maximize", "minimize"):
            raise ConfigError(f"objective direction must be 'maximize' or 'minimize', got {self.direction!r}")

    @classmethod
    def parse(cls, text: str) -> Objective:
        """``"tpot_ms"`` (natural direction), ``"tpot_ms:min"``, ``"quality:max"``."""
        metric, _, way = text.strip().partition(":")
        if not way:
            way = "max" if metric in _MAXIMISE else "min"
        direction = {"max": "maximize", "maximize": "maximize", "min": "minimize", "minimize": "minimize"}.get(way)
        if direction is None:
            raise ConfigError(f"objective {text!r}: direction must be max or min, got {way!r}")
        return cls(metric, direction)

    def __str__(self) -> str:
        return f"{self.metric}:{self.direction[:3]}"


SCORED_SEEDS = ("minitron", "best-uniform")  # the seeded baselines that score their top-k candidates


def check_seed_top_k(value: Any) -> dict[str, int]:
    """``seed_top_k`` as ``{baseline: k}``; raises :class:`ConfigError` naming a bad name or count."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(
            "seed_top_k must map baseline names to candidate counts, e.g. {minitron: 3, best-uniform: 8}; "
            f"got {value!r}"
        )
    out: dict[str, int] = {}
    for name, k in value.items():
        if name not in SCORED_SEEDS:
            raise ConfigError(
                f"seed_top_k: unknown baseline {name!r}{suggest(str(name), SCORED_SEEDS)}; "
                f"valid: {', '.join(SCORED_SEEDS)}"
            )
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(f"seed_top_k: {name} must score a whole number >= 1 of candidates, got {k!r}")
        out[str(name)] = k
    return out


@dataclass(frozen=True)
class StudyConfig:
    """Everything that defines a study group; also its identity when resuming.

    ``seed_baselines``: enqueue the ``depth``, ``minitron`` and ``best-uniform`` baselines' global choices before the
    study's own samples (module doc); None (default) means on in ``weights`` mode, off otherwise
    (:attr:`seeds_baselines`). Not part of the identity: a study may be resumed with it changed.
    ``seed_top_k``: how many of their largest feasible candidates the scored seeded baselines
    (:data:`SCORED_SEEDS`: ``minitron``, ``best-uniform``) score, by name; a name left out keeps the
    baseline's own default (10, 20). Fewer cost fewer forward passes in the driver and may choose a
    different (never a larger) seed. Not part of the identity: a resumed study keeps its stored seeds.
    ``proxy_quality``: what ranks the weights-mode proxy's points (:mod:`.proxy`): ``importance``
    (the parent's importance kept) or ``estimate`` (the per-axis estimate); not part of the identity,
    as the proxy's points are stored with the study.
    ``plan_quality``: plan mode's quality stand-in without an importance record: ``params`` (the
    fraction of parameters kept) or ``estimate`` (``exp(−KL̂)`` of the per-axis estimate fitted on
    measured KL, :mod:`autocompress_opt.quality.estimate`) or ``estimate-per-layer`` (the same, with each
    MoE layer's Puzzle-form sizes allotted by the estimate's layer profile where the engine reads that
    form: :func:`~.trials.plan_trial`); part of the identity.
    ``runners_up``: how many of best-uniform's next-best scored candidates are seeded after the
    baselines (:func:`~.seeding.runner_up_seeds`; :attr:`runner_up_seeds` gives the default); stored
    with the seeds and, like them, not part of the identity.
    ``hardware``: user GPU profiles (``Hardware.to_dict()`` of what
    :func:`~autocompress_opt.serving.hardware.load_hardware_file` read) the targets may name; they are
    registered here and in every trial's worker, and a target's profile is part of its identity.
    ``gpus_per_trial``, ``concurrency`` (None: defaults from the cluster) and ``cache_dir``: where
    trials run and keep their caches (:mod:`~autocompress_opt.search.study.placement`); not part of the
    identity either. ``driver_device``: where the driver itself reads the parent to score the
    baselines' candidates and the proxy (``cpu`` by default; ``cuda[:N]``, a GPU of the driver's, only
    when asked), in the trials' compute dtype (:func:`~.placement.driver_compute_dtype`); not part of
    the identity.
    ``allow_data_change``: resume a study whose ``--data`` now holds other rows than when it began
    (the identity records each source's content SHA-256; without it such a resume is refused).
    """

    name: str
    model: str
    targets: tuple[Target, ...]
    space: SearchSpace
    trials: int
    objectives: tuple[Objective, ...] = ()
    mode: str = "plan"
    storage: str | None = None
    seed: int = 0
    concurrency: int | None = None  # trials at once; None: the cluster's GPUs / gpus_per_trial, else 1 (placement)
    address: str | None = None
    max_failures: int | None = None
    plugins: tuple[str, ...] = ()
    inner: Mapping[str, Any] = field(default_factory=dict)  # per-trial budget of the weights mode
    importance: str | None = None  # plan mode: an Importance record of the parent → retained-importance proxy
    seed_baselines: bool | None = None
    hardware: tuple[Mapping[str, Any], ...] = ()  # user hardware profiles (Hardware.to_dict) the targets may name
    serve_as: str | None = None  # engine whose loadable shapes trials keep; None: each target's engine (serve_as_for)
    gpus_per_trial: float | None = None  # None: 1 in weights mode on a cluster with GPUs, else 0 (placement)
    cache_dir: str | None = None  # importance/teacher/quality caches; shared storage on a cluster (placement)
    scheduler: str | None = None  # "asha" | "none"; None: asha in weights mode with > 4 trials (scheduler_name)
    proxy: int | None = None  # points the plan-mode proxy enqueues per target; None: PROXY_POINTS in weights mode
    time_budget: float | None = None  # minutes after which no new trial starts (the run's; trials in flight finish)
    seed_top_k: Mapping[str, int] = field(default_factory=dict)  # candidates a seeded baseline scores (SCORED_SEEDS)
    proxy_quality: str = "importance"  # weights mode: what ranks the proxy's points, "importance" or "estimate"
    plan_quality: str = "params"  # plan mode without importance: one of trials.PLAN_QUALITIES
    runners_up: int | None = None  # best-uniform's next-best candidates seeded too; None: RUNNERS_UP in weights mode
    finalists: int = 0  # weights mode, after the run: each target's best trials ranked again after recovery; 0: none
    allow_data_change: bool = False  # resume although the --data content changed (not part of the identity)
    driver_device: str = "cpu"  # where the driver reads the parent for seeds and proxy (placement.check_driver_device)

    def __post_init__(self) -> None:
        object.__setattr__(self, "seed_top_k", check_seed_top_k(self.seed_top_k))
        if self.seed_baselines not in (None, True, False):
            raise ConfigError(f"seed_baselines must be true, false or unset, got {self.seed_baselines!r}")
        if self.scheduler is not None and self.scheduler not in SCHEDULERS:
            raise ConfigError(f"scheduler must be one of {', '.join(SCHEDULERS)}, got {self.scheduler!r}")
        if self.scheduler == "asha" and self.mode == "plan":
            raise ConfigError(
                "scheduler 'asha' stops trials on their intermediate inner-search results, which plan-mode "
                "trials do not report; use --scheduler none or --mode weights"
            )
        bad_proxy = not isinstance(self.proxy, int) or isinstance(self.proxy, bool) or self.proxy < 0
        if self.proxy is not None and bad_proxy:
            raise ConfigError(f"proxy must be an int >= 0 (points enqueued per target; 0: off), got {self.proxy!r}")
        if self.proxy and self.mode != "weights":
            raise ConfigError(
                f"proxy {self.proxy}: the plan-mode proxy ranks points for weights-mode trials; a {self.mode}-mode "
                "study's trials are as cheap as the proxy. Use --proxy 0 or --mode weights"
            )
        if self.proxy_quality not in PROXY_QUALITIES:
            raise ConfigError(
                f"proxy_quality must be one of {', '.join(PROXY_QUALITIES)} (what ranks the proxy's points), "
                f"got {self.proxy_quality!r}"
            )
        if self.plan_quality not in PLAN_QUALITIES:
            raise ConfigError(
                f"plan_quality must be one of {', '.join(PLAN_QUALITIES)} (plan mode's quality stand-in), "
                f"got {self.plan_quality!r}"
            )
        if self.plan_quality != "params" and (self.mode != "plan" or self.importance):
            raise ConfigError(
                f"plan_quality {self.plan_quality}: the stand-in of plan-mode trials without --importance; "
                f"this study is {self.mode}-mode" + (" with an importance record" if self.importance else "")
            )
        bad_runners = not isinstance(self.runners_up, int) or isinstance(self.runners_up, bool) or self.runners_up < 0
        if self.runners_up is not None and bad_runners:
            raise ConfigError(
                f"runners_up must be an int >= 0 (best-uniform's next-best candidates seeded; 0: none), "
                f"got {self.runners_up!r}"
            )
        check_int(self.finalists, "finalists (best trials ranked again after recovery; 0: none)", 0)
        if self.finalists and self.mode != "weights":
            raise ConfigError(
                f"finalists={self.finalists} ranks weights-mode trials after recovery; mode {self.mode!r} builds no "
                "model to recover: use mode weights, or finalists 0"
            )
        if self.time_budget is not None and (
            isinstance(self.time_budget, bool)
            or not isinstance(self.time_budget, (int, float))
            or not math.isfinite(self.time_budget)
            or self.time_budget <= 0
        ):
            raise ConfigError(f"time_budget must be a number of minutes > 0, got {self.time_budget!r}")
        if not self.name or any(c in self.name for c in "/\\ :"):
            raise ConfigError(f"study name {self.name!r} must be non-empty without '/', '\\\\', ':' or spaces")
        if not isinstance(self.trials, int) or self.trials < 1:
            raise ConfigError(f"trials must be a positive integer, got {self.trials!r}")
        if self.concurrency is not None and self.concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, got {self.concurrency!r}")
        object.__setattr__(self, "gpus_per_trial", check_trial_gpus(self.mode, self.inner, self.gpus_per_trial))
        object.__setattr__(self, "cache_dir", check_cache_dir(self.cache_dir))
        object.__setattr__(self, "driver_device", check_driver_device(self.driver_device))
        load_plugins(self.plugins)
        register_hardware(self.hardware)
        TRIAL_MODES.get(self.mode)
        if self.serve_as is not None:
            check_serve_as(self.serve_as, "serve_as")
        names = [t.hardware for t in self.targets]
        if not names or len(set(names)) != len(names):
            raise ConfigError(f"targets must be distinct hardware names, got {names}")

    def objectives_for(self, target: Target) -> tuple[Objective, ...]:
        """Explicit objectives, else quality plus the workload's primary metric."""
        if self.objectives:
            return self.objectives
        return (Objective("quality", "maximize"), Objective.parse(PRIMARY_METRIC.get(target.workload, "tpot_ms")))

    def study_name(self, target: Target) -> str:
        return f"{self.name}.{target.hardware}"

    @property
    def seeds_baselines(self) -> bool:
        """Whether studies enqueue the baselines first: ``seed_baselines``, by default in weights mode."""
        return self.mode == "weights" if self.seed_baselines is None else self.seed_baselines

    @property
    def proxy_points(self) -> int:
        """Points the plan-mode proxy enqueues per target (:mod:`~autocompress_opt.search.study.proxy`):
        ``proxy``, by default :data:`PROXY_POINTS` in weights mode, 0 (no proxy) otherwise. With
        any, the proxy also screens the sampler's points."""
        if self.proxy is not None:
            return self.proxy
        return PROXY_POINTS if self.mode == "weights" else 0

    @property
    def runner_up_seeds(self) -> int:
        """How many of best-uniform's next-best scored candidates a study seeds after the baselines
        (:func:`~.seeding.runner_up_seeds`): ``runners_up``, by default :data:`RUNNERS_UP` in weights
        mode, 0 otherwise (plan-mode baselines rank by parameters: there is no next-best to seed)."""
        if self.runners_up is not None:
            return self.runners_up
        return RUNNERS_UP if self.mode == "weights" else 0

    @property
    def scheduler_name(self) -> str:
        """The early-stopping scheduler: ``scheduler``, by default ``asha`` in weights mode with more
        than :data:`ASHA_MIN_TRIALS` trials, else ``none``."""
        if self.scheduler is not None:
            return self.scheduler
        return "asha" if self.mode == "weights" and self.trials > ASHA_MIN_TRIALS else "none"

    def serve_as_for(self, target: Target) -> str:
        """The engine whose rules ``target``'s trials keep (:mod:`~autocompress_opt.prune.loadability`):
        ``serve_as`` when given, else the target's own engine (``torch-eager``: ``transformers``; an
        engine without rules: ``any``)."""
        return self.serve_as or rules_engine_for(target.engine_name)

    @property
    def storage_url(self) -> str:
        return self.storage or default_storage(self.name)


def check_config(config: StudyConfig, parent: Architecture) -> None:
    """Every option of a study group checked against ``parent`` without touching any storage: the
    search space fits the parent; each target's hardware, engine, engine options, workload and
    constraints (by costing the parent on it); the ``inner`` keys for the mode (``weights``: the
    :class:`~autocompress_opt.search.study.weights_trial.TrialConfig` keys and values; ``plan`` takes none;
    a plugin's mode checks its own); the ``importance`` record exists; the storage is one that
    :func:`~.storage.resolve_storage` accepts (nothing is opened). Raises ConfigError."""
    resolve_storage(config.storage_url)
    config.space.check_parent(parent)
    if config.serve_as not in (None, SERVE_AS_ANY):
        problems = parent_problems(parent, config.serve_as)
        if problems:
            raise ConfigError(
                f"serve_as {config.serve_as}: no pruned model of {parent.name or parent.family} loads in "
                f"{config.serve_as} ({'; '.join(problems)}); use another engine or serve_as any"
            )
    for target in config.targets:
        config.objectives_for(target)
        parent_metrics(parent, target)
    if config.inner and config.mode == "plan":
        raise ConfigError(
            f"--inner {', '.join(f'{k}={v}' for k, v in config.inner.items())}: inner-search settings apply to "
            "--mode weights only; drop them or use --mode weights"
        )
    if config.mode == "weights":
        from autocompress_opt.search.study.weights_trial import TrialConfig  # torch: the weights mode needs it anyway

        TrialConfig.from_dict(config.inner, seed=config.seed)
        if is_moe(parent):  # the sparse trial: depth, heads and experts, of the families with an experts path
            check_moe_space(config.space, parent)
    if config.importance and not Path(config.importance).exists():
        raise ConfigError(f"importance record {config.importance!r} does not exist")


def sampler_seed(seed: int, target: Target) -> int:
    """The seed of ``target``'s sampler in a study group run with ``seed``: ``seed`` mixed with the
    target's hardware and workload (stable: the same whatever the group's other targets or their order).

    One seed for every target would make every study draw the same random start-up points: measured
    in a four-target weights group (``bench_multifidelity.py`` at 15 minutes, seed 1), the 26 trials
    without early stopping were 7 distinct points, each run once per target, and 21 of the 87
    with it were repeats of another target's point. The inner search of a repeat is not shared (it
    follows the target's constraints), so each target explores its own points instead."""
    digest = hashlib.sha256(f"{int(seed)}:{target.hardware}:{target.workload}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def inner_settings(
    raw: Mapping[str, Any] | None, *, mode: str, device: str | None = None, compute_dtype: str | None = None
) -> dict[str, Any]:
    """The trials' ``inner`` settings (:attr:`StudyConfig.inner`): ``raw`` (a study config's
    ``inner`` mapping, e.g. ``{"steps": 24}``) with ``device`` and ``compute_dtype`` joined as the
    trials' own, which only weights-mode trials take (a ConfigError in another ``mode``). The keys
    and values are checked against the mode by :func:`check_config`."""
    if raw is not None and not isinstance(raw, Mapping):
        raise ConfigError(f"inner must be a mapping of settings such as {{steps: 24}}, got {raw!r}")
    inner = dict(raw or {})
    for key, flag, value in (("device", "--device", device), ("compute_dtype", "--compute-dtype", compute_dtype)):
        if value is not None:
            if mode != "weights":
                raise ConfigError(f"{flag} applies to weights mode (trials on the real model); this is {mode} mode")
            inner[key] = str(value)
    return inner


# What the experts path lacks for the MoE / hybrid families transformers has classes for but it does not prune.
_NO_EXPERTS_PATH = {
    "gpt_oss": "transformers' GptOss experts carry biases and a clamped SwiGLU, its router a bias and its "
    "attention sinks: none is masked or sliced by the experts path yet",
    "granitemoehybrid": "transformers' GraniteMoeHybrid experts are stored as one fused input_linear per "
    "layer and its Mamba-2 mixer differs from Nemotron-H's: no adapter reads them yet",
}


def check_moe_space(space: SearchSpace, parent: Architecture) -> None:
    """Raise :class:`ConfigError` (one line) when a weights-mode study of the MoE ``parent`` cannot run:
    its family has no experts path (:data:`~autocompress_opt.hf.adapters.MOE_ADAPTERS`: Qwen3-MoE,
    Mixtral, Nemotron-H; the others are plan-mode only), or ``space`` varies a choice the trial does not
    prune on a MoE parent yet (dense FFN: pinned to the parent's)."""
    from autocompress_opt.hf.adapters import MOE_ADAPTERS

    if parent.family not in MOE_ADAPTERS:
        why = _NO_EXPERTS_PATH.get(parent.family, "the experts path has no adapter for its modules")
        raise ConfigError(
            f"--mode weights prunes the sparse blocks of {', '.join(MOE_ADAPTERS)} parents only; "
            f"{parent.family} is plan-mode only ({why}): use --mode plan"
        )
    limits = sparse_limits(parent)
    for choice in space.choices:
        if choice.name not in (*SPARSE_CHOICES, *MOE_DENSE_CHOICES) and choice.values != (limits[choice.name],):
            raise ConfigError(
                f"search space: {choice.name} choices {list(choice.values)}: weights mode on a MoE parent prunes "
                f"layers, hidden size, attention heads and experts only, so {choice.name} must be the parent's "
                f"{limits[choice.name]}; pin it, or drop --space for the default expert space, or use --mode plan"
            )
    odd = (
        [w for w in space["expert_width"].values if w % EXPERT_WIDTH_MULTIPLE] if "expert_width" in space.names else []
    )
    if odd:
        raise ConfigError(
            f"search space: expert_width choices {odd} are not multiples of {EXPERT_WIDTH_MULTIPLE} (the 16-byte rows "
            f"transformers' grouped expert kernels need); valid: multiples of {EXPERT_WIDTH_MULTIPLE} up to "
            f"{limits['expert_width']}"
        )
    groups = next((layer.mamba.groups for layer in parent.layers if layer.mamba is not None), 1)
    uneven = [h for h in space["mamba_heads"].values if h % groups] if "mamba_heads" in space.names else []
    if uneven:
        raise ConfigError(
            f"search space: mamba_heads choices {uneven} are not multiples of the parent's {groups} Mamba-2 groups "
            f"(every group keeps the same number); valid: multiples of {groups} up to {limits['mamba_heads']}"
        )


def expert_space(parent: Architecture, sampler: str = "tpe") -> SearchSpace:
    """The default weights-mode space of a MoE ``parent``: the default space's sparse values
    (:data:`~autocompress_opt.arch.hybrid.SPARSE_CHOICES` the parent has; widths that are multiples of
    :data:`EXPERT_WIDTH_MULTIPLE`), depths, hidden sizes and attention heads (:data:`MOE_DENSE_CHOICES`),
    the dense FFN pinned to the parent's: the outer loop chooses how many layers, channels, heads and
    experts, the top-``k`` and the widths, the trial which ones
    (:func:`~autocompress_opt.search.study.weights_trial.dense_cut`, then the expert search)."""
    full = default_space(parent, sampler)
    limits = sparse_limits(parent)

    def pinned(c: Choice) -> Choice:
        if c.name == "expert_width":  # whole 16-byte rows (EXPERT_WIDTH_MULTIPLE); the parent's own if none is
            whole = tuple(w for w in c.values if w % EXPERT_WIDTH_MULTIPLE == 0)
            return Choice(c.name, whole or (limits[c.name],))
        return c if c.name in (*SPARSE_CHOICES, *MOE_DENSE_CHOICES) else Choice(c.name, (limits[c.name],))

    return SearchSpace(tuple(pinned(c) for c in full.choices), sampler=sampler)

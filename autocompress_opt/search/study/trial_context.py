"""What a ``weights`` trial reads (:mod:`.weights_trial`): its settings (:class:`TrialConfig`: the inner
search's budget and the data sizes and roles) and the parent with its data (:class:`ParentContext`,
built once per process and data setting by :func:`parent_context`: the loaded model, its importance,
the calibration rows and the parent's log-probs on them, the selection rows and the parent's logits
on them), and the held-out quality of any model against it (:func:`heldout_quality`).

Split from :mod:`.weights_trial` (which re-exports every public name here), so the trial's flow and
what it reads each fit in one file.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.cache import content_digest
from autocompress_opt.errors import ConfigError, check_bool, check_choice, check_int, check_number, suggest
from autocompress_opt.hf.adapters import MOE_ADAPTERS, model_type_of
from autocompress_opt.hf.device import dtype_name, resolve_compute_dtype, resolve_device
from autocompress_opt.hf.memory import DEFAULT_TEACHER_BUDGET_GIB
from autocompress_opt.prune.importance import Importance, estimate_importance
from autocompress_opt.quality.metrics import Teacher, kl_and_perplexity
from autocompress_opt.search.inner.block_solver import NAME as BLOCK_LIBRARY
from autocompress_opt.search.inner.inner_search import InnerConfig
from autocompress_opt.search.inner.teacher import teacher_log_probs
from autocompress_opt.search.study.placement import DEFAULT_CACHE_DIR as CACHE_DIR_NAME
from autocompress_opt.search.study.placement import trial_device
from autocompress_opt.search.study.progress import TrialProgress, report

if TYPE_CHECKING:
    from autocompress_opt.hf.loading import LoadedModel

__all__ = [
    "DATA_DOMAINS",
    "DEFAULT_CACHE_DIR",
    "QUALITY_CACHE_VERSION",
    "QUALITY_KIND",
    "START_FROM",
    "ParentContext",
    "TrialConfig",
    "calibration_rows",
    "choice_rows",
    "clear_trial_cache",
    "heldout_quality",
    "importance_rows",
    "load_parent",
    "objective_domains",
    "parent_context",
    "parent_identity",
    "parent_importance",
    "parent_parts",
    "search_rows",
    "workload_domain",
]

# TrialConfig's fields that are not counts (checked on their own).
_NOT_COUNTS = ("data", "data_domain", "start_from", "block_library")
# Where a trial's inner search starts (TrialConfig.start_from).
START_FROM = ("importance", BLOCK_LIBRARY)
# With the built-in sources: both domains, or the one a workload serves (workload_domain).
DATA_DOMAINS = ("auto", "mixed", "code", "prose")
DEFAULT_CACHE_DIR = Path(CACHE_DIR_NAME)  # the name is search.placement's (the driver resolves it there)
QUALITY_KIND = "exp_neg_kl"
# The version of the held-out quality's computation (materialise + heldout_quality), part of every
# quality cache key: bump it when their numbers change. (1: keys without a version.)
QUALITY_CACHE_VERSION = "quality/3"  # 3: the objective on selection rows (was the evaluation rows)
_WEIGHT_FILES = (".json", ".safetensors")  # what identifies a parent's weights (config, tokenizer, tensors)


@dataclass(frozen=True)
class TrialConfig:
    """Per-trial budget: the inner search's :class:`InnerConfig` plus data sizes.

    Attributes:
        inner: the inner search (steps, batch, seq_len, calibration rows, ...).
        eval_samples / eval_seq_len / eval_seed: selection rows per domain (code and prose, or the
            ``data_domain``, or the user's ``data``) on which the trial's objective is measured.
        importance_samples / importance_seq_len: calibration rows that score importance.
        data_seed: seed of the search's rows (calibration for training, selection for its choice) and
            of importance's.
        data: the user's ``--data`` specs (:mod:`autocompress_opt.data.user`); empty: the built-in sources.
        data_domain: with the built-in sources, which of them: ``mixed`` (code and prose), ``code``,
            ``prose``, or ``auto``: the target's workload's (:func:`workload_domain`, resolved by
            :meth:`for_workload`; ``mixed`` where no workload is known).

    The three roles of :mod:`autocompress_opt.data.textdata` never share a document: importance and
    the inner search's training steps read calibration rows; the inner search's choice among its
    candidates (its first ``val_samples`` rows) and the trial's objective read selection rows, never
    the same ones (:func:`choice_rows`); no trial reads the test split.
        device / compute_dtype: where the parent computes and in which dtype
            (:mod:`autocompress_opt.hf.device`: ``auto`` is the first CUDA GPU in bf16 when torch sees
            one, else the CPU in fp32); masks, KL and the Lagrangian stay fp32. Resolved where the
            trial runs, so a driver without a GPU can check a GPU worker's setting.
        teacher_budget_gib: host memory the parent's targets on the calibration rows may take: the
            full vocabulary of log-probs when it fits (SmolLM2's and Llama-3-8B's default rows
            do), else the top-k tokens plus tail mass with the largest k that fits (at least 64, or a
            ConfigError; :func:`~autocompress_opt.hf.memory.teacher_top_k`). The inner search's KL
            against top-k targets is a lower bound of the full one.
        block_library: also weigh the block-library solver's answer for the trial's budget and target
            (:func:`~autocompress_opt.search.inner.block_solver.solve_block_library` over
            :func:`~autocompress_opt.prune.block_library.build_block_library` of the search's
            training rows at the trial's hidden size, built once per parent, rows and hidden size
            and cached under ``cache_dir/block_library``) as the inner search's candidate
            ``block-library``, judged like the others on the choice rows. Building costs one
            replace-one pass per layer variant (about 15 minutes for SmolLM2-135M at one hidden size
            on a 2-core CPU in fp32), so it is off by default.
        start_from: where the inner search's masks start: ``importance`` (the trial's uniform
            allocation, repaired and filled by importance and the exact cost model) or
            ``block-library`` (the solver's answer above, built as for ``block_library``, which it
            implies; the importance start where the solver finds nothing feasible). Either way the
            start point is the candidate ``start`` and the training refines it.
    """

    inner: InnerConfig = field(default_factory=InnerConfig)
    eval_samples: int = 8
    eval_seq_len: int = 128
    eval_seed: int = 0
    importance_samples: int = 8
    importance_seq_len: int = 128
    data_seed: int = 0
    data: tuple[str, ...] = ()
    data_domain: str = "auto"
    device: str = "auto"
    compute_dtype: str = "auto"
    teacher_budget_gib: float = DEFAULT_TEACHER_BUDGET_GIB
    block_library: bool = False
    start_from: str = "importance"

    def __post_init__(self) -> None:
        from autocompress_opt.hf.device import check_compute_dtype, check_device

        object.__setattr__(self, "device", check_device(self.device))
        object.__setattr__(self, "compute_dtype", check_compute_dtype(self.compute_dtype))
        if isinstance(self.data, str) or not all(isinstance(d, str) for d in self.data):
            raise ConfigError(f"inner.data must be a list of --data specs (strings), got {self.data!r}")
        object.__setattr__(self, "data", tuple(self.data))
        check_choice(self.data_domain, "inner.data_domain", DATA_DOMAINS)
        check_choice(self.start_from, "inner.start_from", START_FROM)
        check_bool(self.block_library, "inner.block_library")
        for f in fields(self):
            if f.name in ("inner", "device", "compute_dtype", "teacher_budget_gib", *_NOT_COUNTS):
                continue
            value, minimum = getattr(self, f.name), (0 if f.name.endswith("seed") else 1 if "samples" in f.name else 2)
            check_int(value, f"inner.{f.name}", minimum)
        check_number(self.teacher_budget_gib, "inner.teacher_budget_gib")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, *, seed: int | None = None) -> TrialConfig:
        """Split ``request["inner"]`` into inner-search keys and data keys; unknown keys are rejected."""
        data = dict(data or {})
        own = [f.name for f in fields(cls) if f.name != "inner"]
        inner_keys = [f.name for f in fields(InnerConfig)]
        for key in data:
            if key not in own and key not in inner_keys:
                valid = own + inner_keys
                raise ConfigError(
                    f"unknown request['inner'] key {key!r}{suggest(str(key), valid)}; valid: {', '.join(valid)}"
                )
        inner = {k: v for k, v in data.items() if k in inner_keys}
        if seed is not None:
            inner["seed"] = int(seed)
        return cls(inner=InnerConfig.from_dict(inner), **{k: v for k, v in data.items() if k in own})

    def for_workload(self, workload: str | None) -> TrialConfig:
        """This config with ``data_domain="auto"`` resolved for ``workload`` (None: ``mixed``)."""
        if self.data_domain != "auto":
            return self
        return replace(self, data_domain=workload_domain(workload) if workload else "mixed")

    def data_label(self) -> str:
        """Which text the trials read, in words (``study show`` prints it)."""
        if self.data:
            return f"your data ({', '.join(self.data)})"
        what = {"code": "built-in code (python-stdlib)", "prose": "built-in prose (pydoc-topics)"}
        return what.get(self.data_domain, "built-in code and prose (python-stdlib, pydoc-topics)")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(out.pop("inner"))
        return out


# ------------------------------------------------------------------------- the parent
@dataclass
class ParentContext:
    """Everything a trial needs from one parent and one data configuration (cached per process;
    contexts of one parent share its ``model``: :func:`parent_context`).

    ``seconds`` holds how long building it took: ``load`` (only when building it loaded the model),
    ``importance``, ``teacher`` (calibration log-probs) and ``eval_teacher`` (held-out rows and the
    parent's logits on them).
    """

    model: Any
    tokenizer: Any
    architecture: Architecture
    parent_id: str
    importance: Importance
    tokens: torch.Tensor  # (n, T) calibration rows of the search
    teacher: Teacher  # (n, T, V) parent log-probs on them, or top-k targets (TrialConfig.teacher_budget_gib)
    eval_tokens: dict[str, torch.Tensor]  # domain -> (n, T)
    eval_teacher: dict[str, torch.Tensor]  # domain -> (n, T, V) parent logits
    eval_id: str
    seconds: dict[str, float]


@dataclass
class _Loaded:
    """The one parent model a process holds, and the data contexts built on it (most recent last)."""

    key: str  # the reference, device and dtype it was loaded with
    parts: tuple[Any, Any, Architecture, str]  # model, tokenizer, architecture, parent_id
    contexts: OrderedDict[str, ParentContext] = field(default_factory=OrderedDict)


_LOADED: list[_Loaded] = []  # at most one: a process holds one parent model
# Data contexts kept beside it. A study group's targets read at most two data settings by default
# (code for local-coding, prose for the others: workload_domain), and their trials take turns on the
# same actors, so two contexts make a switch free. For SmolLM2-135M each costs ~0.45 GB (the fp16
# calibration teacher, 20 x 128 x 49152 x 2 bytes = 0.25 GB, and the fp32 evaluation logits,
# 8 x 128 x 49152 x 4 bytes = 0.2 GB) beside the 0.54 GB fp32 model: ~1.4 GB a process.
_CONTEXTS_SIZE = 2


def clear_trial_cache() -> None:
    """Forget the in-process parent cache (model, importance, teacher log-probs, evaluation data)."""
    _LOADED.clear()


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _parent_id(path: Path, arch: Architecture) -> str:
    """Identity of the weights: the content of the top-level ``.json`` and ``.safetensors`` files (not their
    place or modification times, so per-node copies of one model share the importance, teacher and
    quality caches; :func:`~autocompress_opt.cache.content_digest`, hashed once per process) and the
    architecture; the folder's name leads it for readability."""
    return f"{path.name}:{_digest(content_digest(path, _WEIGHT_FILES, recursive=False), arch.to_dict())}"


def load_parent(ref: str, config: TrialConfig, cache_dir: Path | None = None) -> LoadedModel:
    """Parent ``ref`` as a trial with ``config`` loads it, frozen in eval mode: on ``config.device``
    (under Ray: the first GPU it assigned the trial, spread over all of them when it assigned
    several; :func:`~autocompress_opt.search.study.placement.trial_device`) in ``config.compute_dtype``,
    a fresh copy no other cache holds (16-bit on the CPU with eager attention:
    :func:`~autocompress_opt.hf.loading.load_model`). With ``cache_dir``, a GGUF parent is converted once per host
    and dtype and read from its dequantised copy under ``cache_dir/parents`` after that (the study's
    driver converts it while seeding, its trial processes read the copy;
    :func:`~autocompress_opt.hf.loading.load_model`'s ``dequantised_dir``): the same tensors."""
    from autocompress_opt.hf.loading import load_model
    from autocompress_opt.search.study.placement import trial_gpus

    device = resolve_device(trial_device(config.device))
    dtype = resolve_compute_dtype(config.compute_dtype, device)
    copies = cache_dir / "parents" if cache_dir is not None else None
    loaded = load_model(ref, cache=False, dtype=dtype, device=device, gpus=trial_gpus(device), dequantised_dir=copies)
    loaded.model.eval()
    for p in loaded.model.parameters():
        p.requires_grad_(False)
    return loaded


def parent_context(ref: str, config: TrialConfig, cache_dir: Path) -> tuple[ParentContext, bool]:
    """The context of parent ``ref`` under ``config``'s data settings, and whether it was built by this
    call. Cached per process: one parent model (:func:`_loaded_parent`) and, beside it, the contexts
    of the last :data:`_CONTEXTS_SIZE` data settings, which share that model (a switch between
    them loads nothing); importance and teacher log-probs are also on disk under ``cache_dir``.
    ``seconds`` of a context has ``load`` only when building it loaded the model."""
    from autocompress_opt.data.user import data_batches
    from autocompress_opt.quality.metrics import cache_teacher_logits

    settings = config.to_dict()
    key = _digest(ref, str(cache_dir), {k: settings[k] for k in _CONTEXT_KEYS})
    loaded, seconds = _loaded_parent(ref, config, cache_dir)
    if key in loaded.contexts:
        loaded.contexts.move_to_end(key)
        return loaded.contexts[key], False
    model, tokenizer, arch, parent_id = loaded.parts

    began = time.perf_counter()
    report(TrialProgress("importance", 0, config.inner.steps))
    importance = parent_importance(model, tokenizer, parent_id, config, cache_dir)
    seconds["importance"] = time.perf_counter() - began

    began = time.perf_counter()
    report(TrialProgress("teacher", 0, config.inner.steps))
    parts = search_rows(tokenizer, config)
    rows = torch.cat([p.tokens for p in parts])
    teacher = teacher_log_probs(
        model,
        rows,
        parent_id=parent_id,
        data_id=_digest([p.to_dict() for p in parts]),
        cache_dir=cache_dir / "teacher",
        budget_gib=config.teacher_budget_gib,
    )
    seconds["teacher"] = time.perf_counter() - began

    began = time.perf_counter()
    evals = {
        dom: data_batches(
            tokenizer,
            role="selection",
            n_samples=config.eval_samples,
            seq_len=config.eval_seq_len,
            seed=config.eval_seed,
            **({"data": config.data} if dom == "data" else {"domain": dom}),
        )
        for dom in objective_domains(config)
    }
    eval_teacher = {dom: cache_teacher_logits(model, b.tokens, progress=False) for dom, b in evals.items()}
    seconds["eval_teacher"] = time.perf_counter() - began
    parent = ParentContext(
        model,
        tokenizer,
        arch,
        parent_id,
        importance,
        rows,
        teacher,
        {d: b.tokens for d, b in evals.items()},
        eval_teacher,
        _digest({d: b.to_dict() for d, b in evals.items()}),
        seconds,
    )
    loaded.contexts[key] = parent
    while len(loaded.contexts) > _CONTEXTS_SIZE:
        loaded.contexts.popitem(last=False)
    return parent, True


def _loaded_parent(ref: str, config: TrialConfig, cache_dir: Path) -> tuple[_Loaded, dict[str, float]]:
    """The process's parent model for ``ref`` on ``config``'s device and dtype, loaded only when it
    holds no such model (then it replaces the one held, with its contexts), and ``{"load": seconds}``
    when it was loaded by this call, else ``{}``. Contexts that differ only by data share it."""
    key = _digest(ref, config.device, config.compute_dtype)
    if _LOADED and _LOADED[0].key == key:
        return _LOADED[0], {}
    _LOADED.clear()  # free the old model (and its contexts) before loading another
    report(TrialProgress("load parent", 0, config.inner.steps))
    model, tokenizer, arch, parent_id, seconds = parent_parts(ref, config, cache_dir)
    _LOADED.append(_Loaded(key, (model, tokenizer, arch, parent_id)))
    return _LOADED[0], seconds


# The settings that decide what a parent context holds (the rest only steer the search).
_CONTEXT_KEYS = (
    "val_samples",
    "data",
    "data_domain",
    "n_samples",
    "seq_len",
    "eval_samples",
    "eval_seq_len",
    "eval_seed",
    "importance_samples",
    "importance_seq_len",
    "data_seed",
    "device",
    "compute_dtype",
    "teacher_budget_gib",
)


def parent_parts(
    ref: str, config: TrialConfig, cache_dir: Path | None = None
) -> tuple[Any, Any, Architecture, str, dict[str, float]]:
    """``(model, tokenizer, architecture, parent_id, {"load": seconds})`` of parent ``ref`` loaded by
    :func:`load_parent` (not cached here: :func:`parent_context` holds it)."""
    began = time.perf_counter()
    loaded = load_parent(ref, config, cache_dir)
    model, tokenizer, arch = loaded.model, loaded.tokenizer, loaded.architecture
    return model, tokenizer, arch, parent_identity(loaded), {"load": time.perf_counter() - began}


def parent_identity(loaded: LoadedModel) -> str:
    """The id by which the importance, teacher, quality and seed-score caches know a loaded parent:
    its weights' content and architecture (:func:`_parent_id`), and its dtype unless fp32 (a bf16
    parent is another parent)."""
    dtype = next(loaded.model.parameters()).dtype
    return _parent_id(loaded.path, loaded.architecture) + ("" if dtype == torch.float32 else f":{dtype_name(dtype)}")


def parent_importance(
    model: Any, tokenizer: Any, parent_id: str, config: TrialConfig, cache_dir: Path, *, folder: Path | None = None
) -> Importance:
    """The trials' importance of the parent under ``config``'s data settings: estimated on its
    calibration rows, on disk under ``cache_dir/importance`` (one entry per parent and data, shared
    by every trial, the study's seeding and ``prune --baseline``; ``folder`` names another
    importance folder, the entry's key is the same)."""
    imp_rows = importance_rows(tokenizer, config)
    return estimate_importance(
        model,
        imp_rows.tokens,
        adapter=MOE_ADAPTERS.get(model_type_of(model)),  # the experts path's adapter; None: the family's
        model_id=parent_id,
        data_id=_digest(imp_rows.to_dict()),
        seed=config.data_seed,
        cache_dir=folder if folder is not None else cache_dir / "importance",
        progress=False,
    )


def importance_rows(tokenizer: Any, config: TrialConfig) -> Any:
    """The rows :func:`parent_importance` estimates on: ``importance_samples`` calibration rows of
    ``importance_seq_len`` tokens, seed ``data_seed``, of the trial's text."""
    from autocompress_opt.data.user import data_batches

    return data_batches(
        tokenizer,
        role="calibration",
        n_samples=config.importance_samples,
        seq_len=config.importance_seq_len,
        seed=config.data_seed,
        **_data_kwargs(config),
    )


def search_rows(tokenizer: Any, config: TrialConfig) -> list[Any]:
    """The inner search's rows as their batches: first its ``val_samples`` choice rows, which choose
    among its candidates (:func:`choice_rows`: selection rows, none of them a row of the trial's
    objective), then its training rows (:func:`calibration_rows`); either part is left out when
    empty."""
    parts = [choice_rows(tokenizer, config)] if config.inner.val_samples else []
    training = calibration_rows(tokenizer, config)
    return parts + ([training] if training is not None else [])


def calibration_rows(tokenizer: Any, config: TrialConfig) -> Any | None:
    """The inner search's training rows: ``n_samples − val_samples`` calibration rows of
    ``seq_len`` tokens, seed ``data_seed`` (None when there are none)."""
    from autocompress_opt.data.user import data_batches

    inner = config.inner
    n = inner.n_samples - inner.val_samples
    if not n:
        return None
    return data_batches(
        tokenizer, role="calibration", n_samples=n, seq_len=inner.seq_len, seed=config.data_seed, **_data_kwargs(config)
    )


def choice_rows(tokenizer: Any, config: TrialConfig) -> Any:
    """The rows on which the inner search chooses among its candidates: ``val_samples`` selection
    rows, shared among the :func:`objective_domains` as evenly as they go, none of them a row of the
    trial's objective (:func:`heldout_quality` reads the first ``eval_samples`` selection rows of
    each domain, ``eval_seq_len`` tokens, seed ``eval_seed``).

    Each domain's are the rows that follow its objective rows in the same draw (same seed and
    length: the objective's rows are the draw's first ones, so the text is disjoint); a row equal to
    an objective row is skipped all the same. Cut to the search's ``seq_len`` (which may not exceed
    ``eval_seq_len``). The choice rows never choose on the rows that then score the choice: a
    heterogeneous trial would otherwise report a quality inflated by its own pick."""
    from autocompress_opt.data.user import data_batches

    inner = config.inner
    if inner.seq_len > config.eval_seq_len:
        raise ConfigError(
            f"inner.seq_len={inner.seq_len} exceeds eval_seq_len={config.eval_seq_len}: the inner search's "
            "choice rows are selection rows drawn beside the objective's; make seq_len <= eval_seq_len"
        )
    domains = objective_domains(config)
    counts = [inner.val_samples // len(domains) + (i < inner.val_samples % len(domains)) for i in range(len(domains))]
    parts: list[tuple[Any, list[int]]] = []
    for dom, count in zip(domains, counts, strict=True):
        if not count:
            continue
        draw = lambda n, dom=dom: data_batches(
            tokenizer,
            role="selection",
            n_samples=n,
            seq_len=config.eval_seq_len,
            seed=config.eval_seed,
            **({"data": config.data} if dom == "data" else {"domain": dom}),
        )
        taken = {tuple(row) for row in draw(config.eval_samples).tokens.tolist()}
        wider = draw(config.eval_samples + 2 * count)
        fresh = [i for i, row in enumerate(wider.tokens.tolist()) if tuple(row) not in taken][:count]
        if len(fresh) < count:
            raise ConfigError(
                f"the selection text of {dom!r} gives {len(fresh)} rows beside the objective's {config.eval_samples}, "
                f"the inner search's choice needs {count}: lower inner.val_samples or eval_samples, or give more data"
            )
        parts.append((wider, fresh))
    order = [(p, i) for k in range(max(len(f) for _, f in parts)) for p, f in parts if k < len(f) for i in f[k : k + 1]]
    first = parts[0][0]
    return replace(
        first,
        tokens=torch.stack([p.tokens[i, : inner.seq_len] for p, i in order]),
        domain=first.domain if len(parts) == 1 else "mixed",
        documents=tuple(dict.fromkeys(d for p, i in order for d in p.row_documents[i])),
        row_documents=tuple(p.row_documents[i] for p, i in order),
        weights=tuple(w for p, _ in parts for w in p.weights),
    )


# ----------------------------------------------------------------------------- quality
def heldout_quality(parent: ParentContext, model: Any) -> dict[str, float]:
    """KL to the parent and perplexity of any ``model`` with the parent's tokenizer (a child cut from
    it, or one recovered by distillation) on the trial's selection rows: ``kl_<domain>`` and
    ``ppl_<domain>`` for each of :func:`objective_domains` (``code`` and ``prose`` by default) and
    ``kl_to_parent``, their mean (the trial's objective)."""
    out: dict[str, float] = {}
    for dom, tokens in parent.eval_tokens.items():
        out[f"kl_{dom}"], out[f"ppl_{dom}"] = kl_and_perplexity(model, tokens, parent.eval_teacher[dom], progress=False)
    # Every domain has the same number of positions: the token-weighted mean is the plain mean.
    out["kl_to_parent"] = sum(out[f"kl_{dom}"] for dom in parent.eval_tokens) / len(parent.eval_tokens)
    return out


def objective_domains(config: TrialConfig) -> tuple[str, ...]:
    """The row groups of a trial's objective: ``("data",)`` with the user's data, else the built-in
    domains ``data_domain`` names (``mixed``: code and prose)."""
    if config.data:
        return ("data",)
    return (config.data_domain,) if config.data_domain in ("code", "prose") else ("code", "prose")


def workload_domain(workload: str) -> str:
    """The built-in text a workload's trials calibrate and select on when the user gives no data:
    ``code`` for a coding assistant (``local-coding``), ``prose`` for chat and dialogue (every other
    workload: ``in-game``, ``datacenter``, ...; pydoc-topics is the built-in prose)."""
    return "code" if workload == "local-coding" else "prose"


def _data_kwargs(config: TrialConfig) -> dict[str, Any]:
    """:func:`~autocompress_opt.data.user.data_batches` arguments of the trial's calibration text."""
    if config.data:
        return {"data": config.data}
    return {"domain": config.data_domain if config.data_domain in ("code", "prose") else "mixed"}

"""Score task items on a causal LM exactly the way lm-evaluation-harness does, and compare models.

Every number follows lm-evaluation-harness 0.4.13's ``HFLM`` (``lm_eval/models/huggingface.py``,
``lm_eval/api/model.py``, ``lm_eval/api/task.py``):

- **Tokens** (:func:`encode_pair`): trailing whitespace of the context moves onto the
  continuation; ``whole = tok(context + continuation)``, ``ctx = tok(context)`` and the
  continuation's tokens are ``whole[len(ctx):]``. ``tok`` is ``tokenizer.encode`` with the
  tokenizer's own special-token default (HFLM's ``add_bos_token=None``): SmolLM2 adds nothing,
  a Llama-2 style tokenizer prepends BOS. An empty context is replaced by the BOS (else EOS) id.
- **Log-likelihood** (:func:`loglikelihoods`): the sum over continuation tokens of
  ``log_softmax`` (nats), and ``is_greedy`` — the argmax at every continuation position is the
  continuation's token. Inputs longer than the model's context are cut from the left
  (``(ctx + cont)[-(max_length + 1):][:-1]``); requests run longest first in right-padded batches.
- **Metrics**: ``acc`` is the argmax of the summed log-likelihoods, ``acc_norm`` the argmax of
  log-likelihood per UTF-8 byte of the choice (lm-eval calls this ``acc_bytes``; its own
  ``acc_norm`` divides by characters, identical on ASCII choices), ``greedy`` is ``is_greedy`` of
  a cloze item's one continuation. Ties go to the lowest index, like ``np.argmax``.

Three deliberate differences, none changing a float32 result beyond rounding: log-softmax runs
in float32 whatever the model's dtype (lm-eval uses the model's dtype); only the positions that
can hold a continuation token go through the LM head (``logits_to_keep``); and the choices of an
item share one forward pass of their context through a KV cache (lm-eval runs each choice whole).

A task's score is the mean of its metric over items, with standard error ``sqrt(p(1-p)/n)``.
:func:`evaluate_tasks` builds and scores a suite; :func:`paired_bootstrap` gives a confidence
interval for the difference in average accuracy of two models on the same items.
"""

from __future__ import annotations

import functools
import inspect
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from autocompress_opt.errors import ConfigError, UnknownNameError, check_int
from autocompress_opt.quality.metrics import QualityReport, inference_mode, log_probs
from autocompress_opt.registry import Registry
from autocompress_opt.tasks.items import PERPLEXITY_TASK, Item, TaskSpec

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "EVALUATORS",
    "ItemResult",
    "SuiteReport",
    "TaskInfo",
    "TaskResult",
    "check_bootstrap",
    "describe_tasks",
    "encode_pair",
    "evaluate_tasks",
    "holm",
    "loglikelihoods",
    "model_max_length",
    "paired_bootstrap",
    "score_task",
    "seeded_bootstrap",
    "seeded_bootstrap_p",
    "two_sided_p",
]

DEFAULT_BATCH_SIZE = 16  # requests per forward pass; items are short (tens of tokens)
# lm-eval's fallback context length and its "no limit set" tokenizer sentinel (lm_eval/models/utils.py).
_LMEVAL_DEFAULT_MAX_LENGTH = 2048
_TOKENIZER_INFINITY = 1_000_000_000_000_000_019_884_624_838_656


# ---------------------------------------------------------------- tokenising
def encode_pair(tokenizer: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """``(context_ids, continuation_ids)`` exactly as lm-eval's HFLM encodes a loglikelihood request.

    Raises :class:`ConfigError` when the continuation has no tokens of its own.
    """
    if context == "":  # lm_eval.api.model.LM.loglikelihood: BOS (else EOS) stands in for the context
        cont = _encode(tokenizer, continuation, add_special_tokens=False)
        prefix = _prefix_token_id(tokenizer)
        if prefix is None:
            raise ConfigError(f"empty context before {continuation!r} needs a BOS or EOS token; the tokenizer has none")
        ctx, cont = ([prefix], cont) if not cont or cont[0] != prefix else (cont[:1], cont[1:])
    else:  # HFLM._encode_pair (causal)
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
        whole = _encode(tokenizer, context + continuation)
        ctx = _encode(tokenizer, context)
        cont = whole[len(ctx) :]
    if not cont:
        raise ConfigError(f"continuation {continuation!r} after context {context[-40:]!r} has no tokens to score")
    return ctx, cont


def _encode(tokenizer: Any, text: str, add_special_tokens: bool | None = None) -> list[int]:
    """HFLM.tok_encode with ``add_bos_token=None``: the tokenizer's default, unless text starts with BOS."""
    if add_special_tokens is None:
        prefix = _prefix_token_id(tokenizer)
        prefix_text = tokenizer.decode(prefix) if prefix is not None else ""
        if prefix_text and text.startswith(prefix_text):
            add_special_tokens = False
    kwargs = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
    return list(tokenizer.encode(text, **kwargs))


def _prefix_token_id(tokenizer: Any) -> int | None:
    """HFLM.prefix_token_id: BOS, else EOS."""
    return tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id


def model_max_length(model: Any, tokenizer: Any) -> int:
    """Context length lm-eval assumes (``resolve_max_length``): config, then tokenizer, then 2048."""
    config = getattr(model.config, "text_config", None) or model.config
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(config, attr, None)
        if value is not None:
            return int(value)
    limit = getattr(tokenizer, "model_max_length", None)
    if limit is not None and limit != _TOKENIZER_INFINITY:
        return int(limit)
    return _LMEVAL_DEFAULT_MAX_LENGTH


# ----------------------------------------------------------- log-likelihoods
def loglikelihoods(
    model: Any,
    tokenizer: Any,
    pairs: Sequence[tuple[str, str]],
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_length: int | None = None,
    share_context: bool = True,
    progress: bool = True,
    desc: str = "loglikelihood",
) -> list[tuple[float, bool]]:
    """``(log-likelihood in nats, is_greedy)`` of each ``(context, continuation)`` pair, in order.

    ``share_context``: pairs whose context encodes to the same tokens (the choices of one item) run
    the context once and their continuations on a copy of its KV cache, in one batch (48-70% fewer
    tokens through SmolLM2 on the multiple-choice tasks of :mod:`~autocompress_opt.tasks.builders`,
    none on cloze). Other pairs (and every pair when the model takes no cache, or
    when its input is cut) run whole, longest first, ``batch_size`` per right-padded forward pass.
    Both paths compute the same numbers up to float rounding (~1e-6 relative), so the result does
    not depend on ``batch_size`` or ``share_context`` beyond that. Deterministic; leaves the model's
    training flag unchanged.
    """
    check_int(batch_size, "batch_size")
    limit = max_length or model_max_length(model, tokenizer)
    encoded = [encode_pair(tokenizer, ctx, cont) for ctx, cont in pairs]
    rows = [_row(ctx, cont, limit) for ctx, cont in encoded]
    groups: dict[tuple[int, ...], list[int]] = {}
    if share_context and _cache_kwarg(model.__class__) is not None:
        for index, (ctx, cont) in enumerate(encoded):
            if len(ctx) + len(cont) <= limit + 1:  # not cut: the input is exactly ctx + cont[:-1]
                groups.setdefault(tuple(ctx), []).append(index)
    # a group's continuations share one batch: at most batch_size of them (each chunk reruns the context)
    shared = [
        members[i : i + batch_size]
        for members in groups.values()
        if len(members) > 1
        for i in range(0, len(members), batch_size)
    ]
    in_shared = {i for members in shared for i in members}
    # lm-eval's Collator order: longest first (padding waste is small, the slowest batch comes first).
    order = sorted(
        (i for i in range(len(rows)) if i not in in_shared), key=lambda i: (-rows[i][2], rows[i][0] + rows[i][1])
    )
    results: list[tuple[float, bool]] = [(math.nan, False)] * len(rows)
    from tqdm.auto import tqdm

    with inference_mode(model), tqdm(total=len(rows), desc=desc, unit="req", disable=not progress, leave=False) as bar:
        for members in shared:
            scores = _score_shared(model, list(encoded[members[0]][0]), [encoded[i][1] for i in members])
            for index, result in zip(members, scores):
                results[index] = result
            bar.update(len(members))
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            for index, result in zip(chunk, _score_batch(model, [rows[i] for i in chunk])):
                results[index] = result
            bar.update(len(chunk))
    return results


def _row(ctx: list[int], cont: list[int], limit: int) -> tuple[list[int], list[int], int]:
    """(model input, continuation, full length): the input is cut from the left to ``limit`` tokens."""
    if len(cont) > limit:
        raise ConfigError(f"a continuation of {len(cont)} tokens exceeds the model's context of {limit} tokens")
    return (ctx + cont)[-(limit + 1) :][:-1], cont, len(ctx) + len(cont)


def _score_batch(model: Any, rows: list[tuple[list[int], list[int], int]]) -> list[tuple[float, bool]]:
    """One right-padded forward pass over ``rows``; continuation token k of a row of input length
    ``n`` is predicted by the logits at position ``n - len(cont) + k``."""
    width = max(len(inp) for inp, _, _ in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)  # (B, T); the pad id is never attended
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for r, (inp, _, _) in enumerate(rows):
        ids[r, : len(inp)] = torch.tensor(inp)
        mask[r, : len(inp)] = 1
    starts = [len(inp) - len(cont) for inp, cont, _ in rows]
    keep = width - min(starts)  # trailing positions that hold any row's continuation
    logits = _forward(model, ids, attention_mask=mask, keep=keep)  # (B, keep, V)
    return [_score(logits[r, starts[r] - (width - keep) :][: len(cont)], cont) for r, (_, cont, _) in enumerate(rows)]


def _score_shared(model: Any, ctx: list[int], conts: list[list[int]]) -> list[tuple[float, bool]]:
    """One context, several continuations: the context's forward fills a KV cache and predicts
    every continuation's first token; the cache, repeated once per continuation, serves a
    right-padded batch of ``cont[:-1]`` whose logits predict ``cont[1:]``."""
    cache = _new_cache(model)
    last = _forward(model, torch.tensor([ctx]), keep=1, cache=cache)[0]  # (1, V): predicts cont[0]
    width = max(len(cont) for cont in conts) - 1
    if width == 0:  # single-token continuations: the context's last logits are all there is
        return [_score(last, cont) for cont in conts]
    cache.batch_repeat_interleave(len(conts))
    ids = torch.zeros(len(conts), width, dtype=torch.long)  # (k, W); right padding, invisible to real tokens
    for r, cont in enumerate(conts):
        ids[r, : len(cont) - 1] = torch.tensor(cont[:-1])
    rest = _forward(model, ids, keep=width, cache=cache)  # (k, W, V)
    return [_score(torch.cat([last, rest[r, : len(cont) - 1]]), cont) for r, cont in enumerate(conts)]


def _score(logits: torch.Tensor, cont: list[int]) -> tuple[float, bool]:
    """(summed log-probability, is_greedy) of ``cont`` under ``logits`` (len(cont), V), in float32."""
    normalised = log_probs(logits)  # (len(cont), V) float32
    target = torch.tensor(cont, device=normalised.device)
    picked = normalised.gather(-1, target[:, None])  # (len(cont), 1)
    return float(picked.sum(dtype=torch.float64)), bool((normalised.argmax(-1) == target).all())


def _forward(
    model: Any, ids: torch.Tensor, *, keep: int, attention_mask: torch.Tensor | None = None, cache: Any | None = None
) -> torch.Tensor:
    """``(B, keep, V)`` logits of the last ``keep`` positions (the LM head skips the rest when it can).

    With ``cache``, ``ids`` continue the cached sequence and the cache grows by them.
    """
    device = next(model.parameters()).device
    kwargs: dict[str, Any] = {"input_ids": ids.to(device), "use_cache": cache is not None}
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask.to(device)
    if cache is not None:
        name = _cache_kwarg(model.__class__)
        if name is None:
            raise ConfigError(f"{type(model).__name__}.forward takes no KV cache ('cache' or 'past_key_values')")
        kwargs[name] = cache
    if _accepts(model.__class__, "logits_to_keep"):
        kwargs["logits_to_keep"] = keep
    return model(**kwargs).logits[:, -keep:]


def _new_cache(model: Any) -> Any:
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)  # per-layer kinds (sliding windows) from the config
    except TypeError:  # transformers releases whose DynamicCache takes no config
        return DynamicCache()


@functools.cache
def _accepts(model_type: Any, name: str) -> bool:
    """Whether ``model_type.forward`` (a model class, cached per class) takes the keyword ``name``."""
    return name in inspect.signature(model_type.forward).parameters


def _cache_kwarg(model_type: Any) -> str | None:
    """The forward's KV-cache argument: ``cache`` (transformers >= 5.2x), ``past_key_values`` before."""
    return next((name for name in ("cache", "past_key_values") if _accepts(model_type, name)), None)


# ------------------------------------------------------------------ results
def _argmax(values: Sequence[float]) -> int:
    """Index of the largest value, the lowest index on ties (like ``np.argmax``)."""
    return max(range(len(values)), key=lambda i: (values[i], -i))


@dataclass(frozen=True)
class ItemResult:
    """How a model scored one item.

    Attributes:
        id / gold: the item's id and gold index.
        logliks_nats: summed log-likelihood of each choice's continuation tokens (nats).
        greedy: lm-eval's ``is_greedy`` of each choice.
        pred / pred_norm: argmax of ``logliks_nats`` and of ``logliks_nats / len(choice in UTF-8 bytes)``.
        acc / acc_norm / is_greedy: ``pred == gold``, ``pred_norm == gold``, ``greedy[gold]``.
    """

    id: str
    gold: int
    logliks_nats: tuple[float, ...]
    greedy: tuple[bool, ...]
    pred: int
    pred_norm: int
    acc: bool
    acc_norm: bool
    is_greedy: bool

    @classmethod
    def from_scores(cls, item: Item, logliks_nats: Sequence[float], greedy: Sequence[bool]) -> ItemResult:
        """The result of ``item`` given each choice's ``(log-likelihood, is_greedy)``."""
        if len(logliks_nats) != len(item.choices) or len(greedy) != len(item.choices):
            raise ConfigError(f"item {item.id!r}: {len(item.choices)} choices but {len(logliks_nats)} scores")
        per_byte = [ll / len(choice.encode("utf-8")) for ll, choice in zip(logliks_nats, item.choices)]
        pred, pred_norm = _argmax(logliks_nats), _argmax(per_byte)
        return cls(
            id=item.id,
            gold=item.gold,
            logliks_nats=tuple(float(x) for x in logliks_nats),
            greedy=tuple(bool(g) for g in greedy),
            pred=pred,
            pred_norm=pred_norm,
            acc=pred == item.gold,
            acc_norm=pred_norm == item.gold,
            is_greedy=bool(greedy[item.gold]),
        )

    def correct(self, metric: str) -> bool:
        """Whether the item counts as right under ``metric`` (acc, acc_norm or greedy)."""
        return {"acc": self.acc, "acc_norm": self.acc_norm, "greedy": self.is_greedy}[metric]

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "gold": self.gold,
            "logliks_nats": list(self.logliks_nats),
            "greedy": list(self.greedy),
            "pred": self.pred,
            "pred_norm": self.pred_norm,
            "acc": self.acc,
            "acc_norm": self.acc_norm,
            "is_greedy": self.is_greedy,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ItemResult:
        return cls(**{**data, "logliks_nats": tuple(data["logliks_nats"]), "greedy": tuple(data["greedy"])})


@dataclass(frozen=True)
class TaskResult:
    """One task scored by one evaluator.

    Attributes:
        score: mean of ``metric`` over items, a fraction in [0, 1].
        stderr: ``sqrt(score (1 - score) / n)``.
        chance / source / seed: copied from the :class:`TaskSpec`.
        evaluator: the :data:`EVALUATORS` name that scored it.
        seconds: wall-clock scoring time (building the task not included).
        items: per-item results, in the task's item order.
    """

    name: str
    metric: str
    score: float
    stderr: float
    n: int
    chance: float
    seconds: float
    evaluator: str
    seed: int
    source: dict[str, Any] = field(default_factory=dict)
    items: tuple[ItemResult, ...] = field(default=(), repr=False)

    @classmethod
    def from_items(cls, spec: TaskSpec, items: Sequence[ItemResult], *, seconds: float, evaluator: str) -> TaskResult:
        correct = [r.correct(spec.metric) for r in items]
        score = sum(correct) / len(correct) if correct else math.nan
        return cls(
            name=spec.name,
            metric=spec.metric,
            score=score,
            stderr=_stderr(score, len(correct)),
            n=len(correct),
            chance=spec.chance,
            seconds=seconds,
            evaluator=evaluator,
            seed=spec.seed,
            source=dict(spec.source),
            items=tuple(items),
        )

    @property
    def correct(self) -> list[bool]:
        """Per-item correctness under the task's metric (the vector :func:`paired_bootstrap` resamples)."""
        return [r.correct(self.metric) for r in self.items]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "metric": self.metric,
            "score": self.score,
            "stderr": self.stderr,
            "n": self.n,
            "chance": self.chance,
            "seconds": self.seconds,
            "evaluator": self.evaluator,
            "seed": self.seed,
            "source": dict(self.source),
            "correct": self.correct,
            "items": [r.to_dict() for r in self.items],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TaskResult:
        fields = {k: v for k, v in data.items() if k not in ("correct", "items")}
        return cls(**fields, items=tuple(ItemResult.from_dict(r) for r in data.get("items", ())))


def _stderr(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / n) if n else math.nan


# ---------------------------------------------------------------- evaluators
# An evaluator scores one built task: (model, tokenizer, spec, *, batch_size, progress) -> TaskResult.
Evaluator = Callable[..., TaskResult]
EVALUATORS: Registry[Evaluator] = Registry("evaluator")


def score_task(
    model: Any,
    tokenizer: Any,
    spec: TaskSpec,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = True,
    max_length: int | None = None,
    share_context: bool = True,
) -> TaskResult:
    """Score every item of ``spec`` with the built-in lm-eval-equivalent scorer (see :func:`loglikelihoods`)."""
    start = time.perf_counter()
    pairs = [(item.context, choice) for item in spec.items for choice in item.choices]
    scores = loglikelihoods(
        model,
        tokenizer,
        pairs,
        batch_size=batch_size,
        max_length=max_length,
        share_context=share_context,
        progress=progress,
        desc=spec.name,
    )
    results, offset = [], 0
    for item in spec.items:
        mine = scores[offset : offset + len(item.choices)]
        results.append(ItemResult.from_scores(item, [ll for ll, _ in mine], [g for _, g in mine]))
        offset += len(item.choices)
    return TaskResult.from_items(spec, results, seconds=time.perf_counter() - start, evaluator="builtin")


EVALUATORS.register("builtin", score_task)
# lm-evaluation-harness, an optional dependency: registered lazily (its module imports this one).
EVALUATORS.register_lazy("lm-eval", "autocompress_opt.tasks.lmeval:score_task_lmeval", aliases=("lm_eval", "lmeval"))


# --------------------------------------------------------------------- suite
@dataclass(frozen=True)
class SuiteReport:
    """A model scored on a suite of tasks.

    Attributes:
        tasks: scored item tasks, in the order asked for.
        skipped: task name → why it was not scored (its source is not installed: the install hint).
        heldout: perplexity on held-out code and prose when ``heldout-perplexity`` was asked for.
        average_accuracy: unweighted mean of ``score`` over :attr:`averaged_tasks` (every scored
            item task), a fraction; None when no item task was scored.
        settings: n_items, seed, batch_size, evaluator, ppl_samples, ppl_seq_len.
        timings_s: per-task ``build`` seconds and the ``total``.
    """

    tasks: tuple[TaskResult, ...]
    skipped: dict[str, str]
    heldout: QualityReport | None
    average_accuracy: float | None
    averaged_tasks: tuple[str, ...]
    settings: dict[str, Any]
    timings_s: dict[str, float] = field(repr=False)

    @property
    def correct(self) -> dict[str, list[bool]]:
        """Per-task correctness vectors of the averaged tasks, for :func:`paired_bootstrap`."""
        return {t.name: t.correct for t in self.tasks if t.name in self.averaged_tasks}

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe copy of every field (per-item results included)."""
        return {
            "average_accuracy": self.average_accuracy,
            "averaged_tasks": list(self.averaged_tasks),
            "tasks": [t.to_dict() for t in self.tasks],
            "skipped": dict(self.skipped),
            "heldout_perplexity": self.heldout.to_dict() if self.heldout else None,
            "settings": dict(self.settings),
            "timings_s": dict(self.timings_s),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SuiteReport:
        """Inverse of :meth:`to_dict` (after a JSON round trip)."""
        heldout = data.get("heldout_perplexity")
        return cls(
            tasks=tuple(TaskResult.from_dict(t) for t in data["tasks"]),
            skipped=dict(data["skipped"]),
            heldout=QualityReport(**heldout) if heldout else None,
            average_accuracy=data["average_accuracy"],
            averaged_tasks=tuple(data["averaged_tasks"]),
            settings=dict(data["settings"]),
            timings_s=dict(data["timings_s"]),
        )


def evaluate_tasks(
    model: Any,
    tokenizer: Any,
    task_names: Sequence[str],
    *,
    n_items: int = 200,
    seed: int = 0,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = True,
    data_dir: str | Path | None = None,
    ppl_samples: int = 16,
    ppl_seq_len: int = 256,
    evaluator: str = "builtin",
) -> SuiteReport:
    """Build and score each named task; ``heldout-perplexity`` runs :func:`autocompress_opt.quality.metrics.evaluate`.

    A task whose source data is not installed is recorded in ``skipped`` with the builder's install
    hint and never scored. ``n_items`` items per task are drawn with ``seed`` (the same arguments give
    the same items, so two models' reports can be compared item by item). Deterministic.

    Raises:
        UnknownNameError: a name that is not a task (with a suggestion).
    """
    from autocompress_opt.tasks.builders import TASK_NAMES, build_task
    from autocompress_opt.tasks.sources import MissingSourceError

    scorer = EVALUATORS.get(evaluator)
    names = list(dict.fromkeys(task_names))
    for name in names:
        if name not in TASK_NAMES:
            raise UnknownNameError("task", name, TASK_NAMES)
    start = time.perf_counter()
    results, skipped, timings, heldout = [], {}, {}, None
    for name in names:
        began = time.perf_counter()
        if name == PERPLEXITY_TASK:
            from autocompress_opt.quality.metrics import evaluate

            heldout = evaluate(
                model, tokenizer, n_samples=ppl_samples, seq_len=ppl_seq_len, seed=seed, progress=progress
            )
            timings[name] = time.perf_counter() - began
            continue
        try:
            spec = build_task(name, n_items=n_items, seed=seed, data_dir=data_dir)
        except MissingSourceError as exc:
            skipped[name] = str(exc)  # names the source, what is missing and the install hint
            continue
        timings[f"build {name}"] = time.perf_counter() - began
        if not spec.items:
            skipped[name] = "the installed source yielded no items"
            continue
        results.append(scorer(model, tokenizer, spec, batch_size=batch_size, progress=progress))
    timings["total"] = time.perf_counter() - start
    averaged = tuple(r.name for r in results)
    average = sum(r.score for r in results) / len(results) if results else None
    settings = {
        "n_items": n_items,
        "seed": seed,
        "batch_size": batch_size,
        "evaluator": evaluator,
        "ppl_samples": ppl_samples,
        "ppl_seq_len": ppl_seq_len,
        "data_dir": str(data_dir) if data_dir else None,
    }
    return SuiteReport(
        tasks=tuple(results),
        skipped=skipped,
        heldout=heldout,
        average_accuracy=average,
        averaged_tasks=averaged,
        settings=settings,
        timings_s=timings,
    )


@dataclass(frozen=True)
class TaskInfo:
    """What ``autocompress eval --list-tasks`` shows of one task."""

    name: str
    metric: str
    available: bool
    hint: str


def describe_tasks(data_dir: str | Path | None = None) -> list[TaskInfo]:
    """Every task with its metric, whether its source is installed and, if not, how to install it.

    The metric comes from the builders' ``TASK_METRICS``; nothing is built.
    """
    from autocompress_opt.tasks import builders

    infos = []
    for name in builders.TASK_NAMES:
        available, hint = builders.task_available(name, data_dir=data_dir)
        metric = "perplexity" if name == PERPLEXITY_TASK else builders.TASK_METRICS[name]
        infos.append(TaskInfo(name=name, metric=metric, available=bool(available), hint=hint or ""))
    return infos


# ----------------------------------------------------------------- bootstrap
def check_bootstrap(confidence: float, n_boot: int) -> None:
    """Raise :class:`ConfigError` unless ``0 < confidence < 1`` and ``n_boot >= 1`` (every bootstrap here)."""
    if not 0 < confidence < 1 or n_boot < 1:
        raise ConfigError(f"need 0 < confidence < 1 and n_boot >= 1, got confidence={confidence}, n_boot={n_boot}")


def paired_bootstrap(
    a_correct: Mapping[str, Sequence[bool]],
    b_correct: Mapping[str, Sequence[bool]],
    *,
    n_boot: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> tuple[float, float, float]:
    """``(difference, lo, hi)`` of average accuracy, model A minus model B, in points (×100).

    The average weights tasks equally. Each bootstrap replicate resamples the items of every task
    with replacement — the same items for both models (paired) — and re-averages; ``lo``/``hi`` are
    the percentile interval at ``confidence``. Identical inputs give ``(0, 0, 0)``. Deterministic
    given ``seed``.
    """
    if set(a_correct) != set(b_correct) or not a_correct:
        raise ConfigError(
            f"paired_bootstrap needs the same non-empty set of tasks for both models, got "
            f"{sorted(a_correct)} and {sorted(b_correct)}"
        )
    check_bootstrap(confidence, n_boot)
    rng = np.random.default_rng(seed)
    observed, replicates = 0.0, np.zeros(n_boot)
    for task in sorted(a_correct):
        a, b = np.asarray(a_correct[task], dtype=float), np.asarray(b_correct[task], dtype=float)
        if a.shape != b.shape or a.ndim != 1 or not len(a):
            raise ConfigError(f"task {task!r}: the models were scored on different items ({a.shape} vs {b.shape})")
        diff = a - b  # (n_items,) in {-1, 0, 1}
        observed += diff.mean()
        replicates += diff[rng.integers(0, len(diff), size=(n_boot, len(diff)))].mean(axis=1)
    scale = 100.0 / len(a_correct)
    tail = (1 - confidence) / 2
    lo, hi = np.quantile(replicates * scale, [tail, 1 - tail])
    return float(observed * scale), float(lo), float(hi)


def seeded_bootstrap(
    a_runs: Sequence[Mapping[str, Sequence[float]]],
    b_runs: Sequence[Mapping[str, Sequence[float]]],
    *,
    n_boot: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
    scale: float = 100.0,
) -> tuple[float, float, float]:
    """:func:`paired_bootstrap` over items *and* seeds: ``(difference, lo, hi)`` in points (×100) of
    the average accuracy, model A minus model B, each model's accuracy the mean over its runs.

    ``a_runs`` / ``b_runs`` hold one per-task correctness mapping per run (e.g. per recovery seed;
    the two may have different numbers of runs). Each replicate resamples the items of every task
    (the same items for both models: paired) and, independently for each model, its runs with
    replacement, so the interval carries the spread between seeds as well as between items. One run
    each gives :func:`paired_bootstrap`'s interval. Deterministic given ``seed``.

    Items may carry any per-item value, not only correctness: with ``scale=1`` and per-row KL (nats)
    under one key per text domain, the result is the difference of the mean KL over the domains
    (each domain weighted equally, as tasks are), with its paired interval over rows and seeds.
    ``scale`` multiplies the mean over tasks (100: points of accuracy).
    """
    check_bootstrap(confidence, n_boot)
    observed, replicates = _seeded_replicates(a_runs, b_runs, n_boot=n_boot, seed=seed, scale=scale)
    tail = (1 - confidence) / 2
    lo, hi = np.quantile(replicates, [tail, 1 - tail])
    return observed, float(lo), float(hi)


def seeded_bootstrap_p(
    a_runs: Sequence[Mapping[str, Sequence[float]]],
    b_runs: Sequence[Mapping[str, Sequence[float]]],
    *,
    n_boot: int = 10_000,
    seed: int = 0,
) -> float:
    """The two-sided bootstrap p-value of :func:`seeded_bootstrap`'s difference (the same replicates
    for the same ``seed``): ``2 · min(P*(d ≤ 0), P*(d ≥ 0))`` with the add-one correction
    ``(k + 1) / (n_boot + 1)``, at most 1. Below ``1 - confidence`` exactly when that interval
    excludes 0 (up to the quantiles' interpolation); :func:`holm` corrects a table of them."""
    _, replicates = _seeded_replicates(a_runs, b_runs, n_boot=n_boot, seed=seed, scale=1.0)
    return two_sided_p(replicates)


def two_sided_p(replicates: np.ndarray) -> float:
    """The two-sided bootstrap p-value of a difference from its replicates: ``2 · min(P*(d ≤ 0),
    P*(d ≥ 0))`` with the add-one correction ``(k + 1) / (n + 1)``, at most 1."""
    below, above = int((replicates <= 0).sum()), int((replicates >= 0).sum())
    return min(1.0, 2 * (min(below, above) + 1) / (len(replicates) + 1))


def holm(p_values: Mapping[str, float]) -> dict[str, float]:
    """Holm's step-down adjustment of a family of p-values by name: the i-th smallest of m becomes
    ``max over j <= i of min(1, (m - j + 1) · p_(j))``; a comparison is resolved at level α after
    correction when its adjusted value is below α (the family-wise error rate held at α)."""
    ranked = sorted(p_values.items(), key=lambda kv: kv[1])
    out: dict[str, float] = {}
    running = 0.0
    for j, (name, p) in enumerate(ranked):
        running = max(running, min(1.0, (len(ranked) - j) * p))
        out[name] = running
    return {name: out[name] for name in p_values}


def _seeded_replicates(
    a_runs: Sequence[Mapping[str, Sequence[float]]],
    b_runs: Sequence[Mapping[str, Sequence[float]]],
    *,
    n_boot: int,
    seed: int,
    scale: float,
) -> tuple[float, np.ndarray]:
    """The observed difference and its ``n_boot`` bootstrap replicates (see :func:`seeded_bootstrap`)."""
    if not a_runs or not b_runs:
        raise ConfigError(f"seeded_bootstrap needs at least one run per model, got {len(a_runs)} and {len(b_runs)}")
    tasks = set(a_runs[0])
    if not tasks or any(set(r) != tasks for r in [*a_runs, *b_runs]):
        raise ConfigError("seeded_bootstrap needs the same non-empty set of tasks in every run of both models")
    if n_boot < 1:
        raise ConfigError(f"need n_boot >= 1, got n_boot={n_boot}")
    rng = np.random.default_rng(seed)
    pick_a = rng.integers(0, len(a_runs), size=(n_boot, len(a_runs)))
    pick_b = rng.integers(0, len(b_runs), size=(n_boot, len(b_runs)))
    observed, replicates = 0.0, np.zeros(n_boot)
    for task in sorted(tasks):
        a = np.asarray([r[task] for r in a_runs], dtype=float)  # (runs, items)
        b = np.asarray([r[task] for r in b_runs], dtype=float)
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or not a.shape[1]:
            raise ConfigError(f"task {task!r}: the runs were scored on different items ({a.shape} vs {b.shape})")
        observed += a.mean() - b.mean()
        items = rng.integers(0, a.shape[1], size=(n_boot, a.shape[1]))
        # per replicate and run: the mean over the resampled items, then over the resampled runs
        a_item = np.take_along_axis(a[None, :, :], items[:, None, :], axis=2).mean(axis=2)  # (n_boot, runs)
        b_item = np.take_along_axis(b[None, :, :], items[:, None, :], axis=2).mean(axis=2)
        replicates += np.take_along_axis(a_item, pick_a, axis=1).mean(axis=1)
        replicates -= np.take_along_axis(b_item, pick_b, axis=1).mean(axis=1)
    per_task = scale / len(tasks)
    return float(observed * per_task), replicates * per_task

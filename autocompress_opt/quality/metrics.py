"""Quality of a (pruned) model on held-out text: perplexity and KL divergence to its parent.

Both metrics are token-weighted means over every predicted position of every row, so a result
does not depend on how rows are grouped into batches beyond float rounding (CPU GEMMs may block
differently for another ``batch_size``: expect ~1e-6 relative differences, never more).

- :func:`perplexity`: ``exp(Σ CE / #targets)`` in which row ``r`` position ``t < L-1`` predicts
  token ``t+1``; the first token of a row is context only.
- :func:`kl_divergence`: mean over all ``L`` positions of ``KL(teacher ‖ student)`` of the
  next-token distributions, in nats. Zero for a model against itself; never negative.
- :func:`kl_and_perplexity`: both of a student against cached teacher logits, in one student pass.
- :func:`row_scores`: both per row (mean KL and mean CE of each row), for paired comparisons of two
  models on the same rows; their means are the two numbers above.
- :func:`evaluate`: both on the held-out code and prose of :mod:`autocompress_opt.data.textdata`.

The two tensor-level building blocks are the one definition of the KL in the package; the inner
mask search (a differentiable mean over a batch), the weights trial and distillation (with a
temperature) call them rather than writing their own:

- :func:`log_probs`: ``log_softmax(logits / T)`` in float32, the one normalisation every path uses
  (so cached teacher logits give exactly what a live teacher gives).
- :func:`token_kl`: per-position ``KL(teacher ‖ student) = Σ_v p_t (log p_t − log p_s)`` of two
  log-probability tensors; differentiable.
- :class:`TeacherTargets` and :func:`sparse_token_kl`: the teacher's distribution kept as its top-k
  tokens plus the mass of the rest (a fraction of the memory of the full vocabulary), and the KL
  against it (a lower bound of :func:`token_kl`, equal at ``k = V``); :func:`teacher_kl` takes
  either form.

Every function is deterministic given its inputs (eval mode, no sampling, no dropout) and leaves
the model's training flag as it found it.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import torch

from autocompress_opt.data.textdata import DEFAULT_SPLIT_SEED, TextBatches, check_token_ids, text_batches
from autocompress_opt.errors import ConfigError, check_int

__all__ = [
    "QualityReport",
    "Teacher",
    "TeacherTargets",
    "cache_teacher_logits",
    "evaluate",
    "inference_mode",
    "kl_and_perplexity",
    "kl_divergence",
    "log_probs",
    "perplexity",
    "row_scores",
    "sparse_token_kl",
    "teacher_kl",
    "teacher_targets",
    "token_kl",
]

DEFAULT_BATCH_SIZE = 4  # rows per forward pass; (4, 512, 49152) fp32 logits are 0.4 GB


@dataclass
class _Totals:
    """Running sums of one scoring pass (nats and counts), and the same sums per row in row order."""

    ce_nats: float = 0.0
    n_targets: int = 0
    kl_nats: float = 0.0
    n_positions: int = 0
    row_ce_nats: list[float] = field(default_factory=list)
    row_kl_nats: list[float] = field(default_factory=list)

    def __iadd__(self, other: _Totals) -> _Totals:
        self.ce_nats += other.ce_nats
        self.n_targets += other.n_targets
        self.kl_nats += other.kl_nats
        self.n_positions += other.n_positions
        self.row_ce_nats += other.row_ce_nats
        self.row_kl_nats += other.row_kl_nats
        return self

    @property
    def perplexity(self) -> float:
        return math.exp(self.ce_nats / self.n_targets)

    @property
    def kl(self) -> float:
        return self.kl_nats / self.n_positions


# ---------------------------------------------------------------- tensor level
def log_probs(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Float32 log-probabilities ``log_softmax(logits / temperature)`` over the last dimension.

    ``logits``: ``(..., V)`` in any float dtype; the result has the same shape, in float32, and is
    differentiable. ``temperature`` (> 0) softens (> 1) or sharpens (< 1) the distribution; at 1 the
    logits are not divided (bit-identical either way). The one normalisation of the package: every
    KL and cross-entropy goes through it, so cached float32 teacher logits reproduce a live teacher.
    """
    if not temperature > 0:
        raise ConfigError(f"temperature must be > 0, got {temperature!r}")
    scaled = logits.float() if temperature == 1.0 else logits.float() / temperature
    return torch.log_softmax(scaled, dim=-1)


def token_kl(student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor) -> torch.Tensor:
    """Per-position ``KL(teacher ‖ student) = Σ_v p_t·(log p_t − log p_s)`` in nats.

    Both arguments are log-probabilities of the same shape ``(..., V)`` (e.g. ``(B, L, V)``, from
    :func:`log_probs`); the result has shape ``(...)`` (e.g. ``(B, L)``), in their dtype, and is
    differentiable w.r.t. both. Never negative up to rounding; zero where the two agree. Reduce it
    as the caller's contract needs (a mean over positions for a loss, float64 sums for a report).
    """
    if student_log_probs.shape != teacher_log_probs.shape:
        raise ConfigError(
            f"student and teacher disagree on the vocabulary: log-probabilities {tuple(student_log_probs.shape)} "
            f"vs {tuple(teacher_log_probs.shape)}; they must share the tokenizer"
        )
    return (teacher_log_probs.exp() * (teacher_log_probs - student_log_probs)).sum(-1)


@dataclass(frozen=True)
class TeacherTargets:
    """A teacher's next-token distributions at ``(...)`` positions, kept sparse: per position its
    ``k`` most likely tokens and their log-probabilities, and the log of the probability of every
    other token together (the *tail*). ``k·(id + value)`` bytes a position instead of ``V·value``
    (SmolLM2, V = 49,152: 98 KB a position in float16 in full; 388 B at k = 64).

    Attributes:
        ids: ``(..., k)`` token ids (int32), most likely first.
        log_probs: ``(..., k)`` their log-probabilities (any float dtype; float16 in the caches).
        tail_log_mass: ``(...)`` float32 ``log(1 − Σ_top-k p)``, computed as a log-sum-exp over the
            other tokens (``-inf`` when there are none, ``k = V``).

    Slices like a tensor over the leading position dimensions (``targets[rows]``, ``targets[a:b]``);
    ``shape`` is ``ids``' (so ``shape[:2]`` is ``(n, T)`` as for a full ``(n, T, V)`` tensor).
    """

    ids: torch.Tensor
    log_probs: torch.Tensor
    tail_log_mass: torch.Tensor

    def __post_init__(self) -> None:
        if self.ids.shape != self.log_probs.shape or self.ids.shape[:-1] != self.tail_log_mass.shape:
            raise ConfigError(
                f"teacher targets disagree: ids {tuple(self.ids.shape)}, log_probs {tuple(self.log_probs.shape)}, "
                f"tail_log_mass {tuple(self.tail_log_mass.shape)} (need (..., k), (..., k), (...))"
            )

    @classmethod
    def from_log_probs(cls, log_probs: torch.Tensor, k: int, dtype: torch.dtype = torch.float16) -> TeacherTargets:
        """The top-``k`` targets of full ``(..., V)`` log-probabilities (``1 <= k <= V``); values in
        ``dtype``, the tail's log-mass from the full float32 values."""
        check_int(k, "k")
        vocab = log_probs.shape[-1]
        if k > vocab:
            raise ConfigError(f"top-k of k={k} exceeds the vocabulary of {vocab} tokens")
        full = log_probs.float()
        values, ids = full.topk(k, dim=-1)  # (..., k), sorted, most likely first
        if k == vocab:
            tail = torch.full(full.shape[:-1], -math.inf)
        else:
            tail = torch.logsumexp(full.scatter(-1, ids, -math.inf), dim=-1)  # the other V - k tokens
        return cls(ids.to(torch.int32), values.to(dtype), tail.to(device=full.device, dtype=torch.float32))

    @property
    def k(self) -> int:
        return int(self.ids.shape[-1])

    @property
    def shape(self) -> torch.Size:
        return self.ids.shape

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.ids, self.log_probs, self.tail_log_mass))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: Any) -> TeacherTargets:
        return TeacherTargets(self.ids[index], self.log_probs[index], self.tail_log_mass[index])

    def to(self, device: Any) -> TeacherTargets:
        """The same targets on ``device`` (dtypes kept)."""
        return TeacherTargets(self.ids.to(device), self.log_probs.to(device), self.tail_log_mass.to(device))

    def as_dict(self) -> dict[str, torch.Tensor]:
        """The three tensors by field name (contiguous), e.g. for safetensors."""
        return {n: getattr(self, n).contiguous() for n in ("ids", "log_probs", "tail_log_mass")}


# A teacher's next-token distributions: full ``(..., V)`` log-probabilities or top-k targets.
Teacher: TypeAlias = torch.Tensor | TeacherTargets


def sparse_token_kl(student_log_probs: torch.Tensor, teacher: TeacherTargets) -> torch.Tensor:
    """Per-position KL of the teacher's and the student's distributions lumped into ``k + 1``
    buckets (the teacher's top-k tokens, and one bucket for every other token), in nats::

        Σ_{v ∈ top-k} p_t(v)·(log p_t(v) − log p_s(v))  +  p_t(tail)·(log p_t(tail) − log p_s(tail))

    with ``p_s(tail) = 1 − Σ_{top-k} p_s(v)`` computed as a log-sum-exp of the student's other
    tokens (exact and stable: no ``1 − x`` cancellation). ``student_log_probs`` ``(..., V)`` (from
    :func:`log_probs`); the result ``(...)`` in float32, differentiable w.r.t. the student.

    Lumping tokens never raises a KL (the log-sum inequality), so this is a **lower bound** of
    :func:`token_kl` against the full teacher, **equal** to it at ``k = V`` (up to summation order)
    and close when the teacher's mass is in its top-k (peaked distributions). A position whose
    tail mass is 0 contributes no tail term (and no NaN gradient).
    """
    vocab = student_log_probs.shape[-1]
    if teacher.ids.shape[:-1] != student_log_probs.shape[:-1] or teacher.k > vocab:
        raise ConfigError(
            f"teacher targets {tuple(teacher.ids.shape)} do not fit student log-probabilities "
            f"{tuple(student_log_probs.shape)} (need the same positions and k <= V)"
        )
    ids = teacher.ids.to(student_log_probs.device).long()
    lt = teacher.log_probs.to(student_log_probs.device).float()  # (..., k)
    head = (lt.exp() * (lt - student_log_probs.gather(-1, ids).float())).sum(-1)
    if teacher.k == vocab:
        return head
    student_tail = torch.logsumexp(student_log_probs.float().scatter(-1, ids, -math.inf), dim=-1)  # (...)
    tail = teacher.tail_log_mass.to(student_log_probs.device).float()
    has_tail = torch.isfinite(tail)
    safe = torch.where(has_tail, tail, torch.zeros_like(tail))
    return head + torch.where(has_tail, safe.exp() * (safe - student_tail), torch.zeros_like(tail))


def teacher_kl(student_log_probs: torch.Tensor, teacher: Teacher) -> torch.Tensor:
    """Per-position ``KL(teacher ‖ student)`` against either form of the teacher: :func:`token_kl`
    for full ``(..., V)`` log-probabilities (compared in float32), :func:`sparse_token_kl` for
    :class:`TeacherTargets`."""
    if isinstance(teacher, TeacherTargets):
        return sparse_token_kl(student_log_probs, teacher)
    return token_kl(student_log_probs, teacher.float())


# ------------------------------------------------------------------------- API
def perplexity(
    model: Any, batches: torch.Tensor | TextBatches, *, batch_size: int = DEFAULT_BATCH_SIZE, progress: bool = True
) -> float:
    """Perplexity of ``model`` on ``batches`` (``(n, L)`` token ids): ``exp`` of the mean next-token CE.

    Token-weighted over all ``n·(L-1)`` targets (not a mean of per-row perplexities).
    ``progress`` shows a tqdm bar on stderr.
    """
    return _score(model, _tokens(batches), batch_size=batch_size, progress=progress, desc="perplexity").perplexity


def kl_divergence(
    student: Any,
    teacher: Any | None,
    batches: torch.Tensor | TextBatches,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    teacher_logits: torch.Tensor | None = None,
    progress: bool = True,
) -> float:
    """Mean per-position ``KL(teacher ‖ student)`` of next-token distributions, in nats.

    ``teacher_logits``: the teacher's ``(n, L, V)`` logits on ``batches`` (e.g. from
    :func:`cache_teacher_logits`, computed once and reused across students) or its log-probabilities;
    when given, ``teacher`` is not run and may be None. Cached float32 logits give exactly the value
    a live teacher gives at the same ``batch_size`` (both go through ``log_softmax`` in float32,
    which leaves log-probabilities unchanged up to rounding).
    """
    tokens = _tokens(batches)
    if teacher is None and teacher_logits is None:
        raise ConfigError("kl_divergence needs a teacher model or its cached teacher_logits")
    if teacher_logits is not None:
        _check_teacher_logits(teacher_logits, tokens)
    return _score(
        student,
        tokens,
        teacher=teacher,
        teacher_logits=teacher_logits,
        batch_size=batch_size,
        progress=progress,
        desc="KL to teacher",
    ).kl


def kl_and_perplexity(
    model: Any,
    batches: torch.Tensor | TextBatches,
    teacher_logits: torch.Tensor,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = True,
) -> tuple[float, float]:
    """``(kl_divergence, perplexity)`` of ``model`` on ``batches`` in one pass of the model.

    ``teacher_logits``: the teacher's ``(n, L, V)`` logits (or log-probabilities) on ``batches``, as
    from :func:`cache_teacher_logits`. Both numbers are exactly what :func:`kl_divergence` (with
    these ``teacher_logits``) and :func:`perplexity` return at the same ``batch_size``; this costs
    one forward pass per batch instead of two.
    """
    tokens = _tokens(batches)
    _check_teacher_logits(teacher_logits, tokens)
    totals = _score(
        model, tokens, teacher_logits=teacher_logits, batch_size=batch_size, progress=progress, desc="KL and perplexity"
    )
    return totals.kl, totals.perplexity


def row_scores(
    model: Any,
    batches: torch.Tensor | TextBatches,
    *,
    teacher: Any | None = None,
    teacher_logits: torch.Tensor | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = False,
) -> dict[str, list[float]]:
    """Per-row quality of ``model`` on ``batches`` (``(n, L)`` token ids), in row order, one pass:
    ``"ce"``, each row's mean next-token cross-entropy over its ``L-1`` targets (nats), and, with a
    teacher (a live ``teacher`` model or its cached ``teacher_logits``, as for :func:`kl_divergence`),
    ``"kl"``, each row's mean ``KL(teacher ‖ model)`` over its ``L`` positions (nats).

    Every row has the same length, so ``mean(kl)`` is :func:`kl_divergence` and ``exp(mean(ce))``
    is :func:`perplexity` on the same rows (up to float rounding): per-row values let two models
    scored on the same rows be compared row by row (a paired interval over rows).
    """
    tokens = _tokens(batches)
    if teacher_logits is not None:
        _check_teacher_logits(teacher_logits, tokens)
    totals = _score(
        model,
        tokens,
        teacher=teacher,
        teacher_logits=teacher_logits,
        batch_size=batch_size,
        progress=progress,
        desc="per-row scores",
    )
    length = tokens.shape[1]
    out = {"ce": [ce / (length - 1) for ce in totals.row_ce_nats]}
    if teacher is not None or teacher_logits is not None:
        out["kl"] = [kl / length for kl in totals.row_kl_nats]
    return out


def cache_teacher_logits(
    teacher: Any,
    batches: torch.Tensor | TextBatches,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    dtype: torch.dtype = torch.float32,
    progress: bool = True,
) -> torch.Tensor:
    """The teacher's ``(n, L, V)`` next-token logits on ``batches``, on the CPU, in ``dtype``.

    Pass the result as ``teacher_logits`` to :func:`kl_divergence` to score many students against
    one teacher pass. Memory is ``n·L·V·bytes``: 16 rows of 256 tokens of SmolLM2 (V = 49152)
    take 0.8 GB in float32; float16 halves that at ~1e-3 nats error in the KL, float32 reproduces a
    live teacher exactly when ``batch_size`` matches.
    """
    tokens = _tokens(batches)
    check_int(batch_size, "batch_size")
    parts = []
    with inference_mode(teacher):
        for chunk in _chunks(tokens, batch_size, progress, "teacher logits"):
            parts.append(_logits(teacher, chunk).to("cpu", dtype))
    return torch.cat(parts)


def teacher_targets(
    teacher: Any,
    batches: torch.Tensor | TextBatches,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    dtype: torch.dtype = torch.float16,
    top_k: int | None = None,
    progress: bool = False,
) -> Teacher:
    """The teacher's next-token targets on ``batches``, on the CPU: its ``(n, L, V)``
    log-probabilities (:func:`log_probs`) in ``dtype`` or, with ``top_k``, the
    :class:`TeacherTargets` of its ``top_k`` most likely tokens. One batch of ``batch_size`` rows
    at a time, so only the kept form of the whole set is ever held (per row, the same values as
    :func:`log_probs` of :func:`cache_teacher_logits`)."""
    tokens = _tokens(batches)
    check_int(batch_size, "batch_size")
    full: list[torch.Tensor] = []
    sparse: list[TeacherTargets] = []
    with inference_mode(teacher):
        for chunk in _chunks(tokens, batch_size, progress, "teacher targets"):
            lp = log_probs(_logits(teacher, chunk))  # (B, L, V) float32
            if top_k is None:
                full.append(lp.to("cpu", dtype))
            else:
                sparse.append(TeacherTargets.from_log_probs(lp, top_k, dtype).to("cpu"))
    if top_k is None:
        return torch.cat(full)
    return TeacherTargets(*(torch.cat([getattr(t, n) for t in sparse]) for n in ("ids", "log_probs", "tail_log_mass")))


@dataclass(frozen=True)
class QualityReport:
    """Held-out quality of one model (and its distance to a parent).

    Attributes:
        ppl_code / ppl_prose: perplexity on test-split code / prose.
        kl_to_parent: mean per-position KL(parent ‖ model) in nats over every row (code, prose and
            the user's data) together; None without a parent. ``kl_code`` / ``kl_prose``: the same per domain.
        ppl_data / kl_data: the same on the test split of the user's ``--data`` (None without it).
        n_samples / seq_len / seed: rows per domain, tokens per row, sampling seed.
        data: the :meth:`TextBatches.to_dict` record of the code and the prose rows.
        timings_s: wall-clock seconds of ``data`` (tokenising), ``code``, ``prose`` and ``total``.
    """

    ppl_code: float
    ppl_prose: float
    kl_to_parent: float | None
    kl_code: float | None
    kl_prose: float | None
    n_samples: int
    seq_len: int
    seed: int
    data: dict[str, Any] = field(repr=False)
    timings_s: dict[str, float] = field(repr=False)
    ppl_data: float | None = None
    kl_data: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe copy of every field."""
        return {
            "ppl_code": self.ppl_code,
            "ppl_prose": self.ppl_prose,
            "kl_to_parent": self.kl_to_parent,
            "kl_code": self.kl_code,
            "kl_prose": self.kl_prose,
            "ppl_data": self.ppl_data,
            "kl_data": self.kl_data,
            "n_samples": self.n_samples,
            "seq_len": self.seq_len,
            "seed": self.seed,
            "data": {k: dict(v) for k, v in self.data.items()},
            "timings_s": dict(self.timings_s),
        }


def evaluate(
    model: Any,
    tokenizer: Any,
    *,
    parent: Any | None = None,
    n_samples: int = 16,
    seq_len: int = 256,
    seed: int = 0,
    batch_size: int = DEFAULT_BATCH_SIZE,
    split_seed: int = DEFAULT_SPLIT_SEED,
    progress: bool = True,
    data: Sequence[str] | None = None,
) -> QualityReport:
    """Perplexity on test-split code and prose (and the user's ``data``), and KL to ``parent`` when given.

    ``n_samples`` rows of ``seq_len`` tokens per domain (and of ``data``, its specs' weights sharing
    them) come from test documents only (see :mod:`autocompress_opt.data.textdata`; never a
    calibration or selection document for the same ``split_seed``).
    ``model`` and ``parent`` must share ``tokenizer``'s vocabulary. Each row costs one forward
    pass of the model (and one of the parent). Deterministic given the arguments.
    """
    start = time.perf_counter()
    data_rows = {
        dom: text_batches(
            tokenizer,
            role="test",
            n_samples=n_samples,
            seq_len=seq_len,
            seed=seed,
            domain=dom,
            split_seed=split_seed,
        )
        for dom in ("code", "prose")
    }
    if data:
        from autocompress_opt.data.user import data_batches

        data_rows["data"] = data_batches(
            tokenizer, role="test", n_samples=n_samples, seq_len=seq_len, seed=seed, data=data, split_seed=split_seed
        )
    timings = {"data": time.perf_counter() - start}
    totals = {}
    for dom, batches in data_rows.items():
        began = time.perf_counter()
        totals[dom] = _score(
            model, batches.tokens, teacher=parent, batch_size=batch_size, progress=progress, desc=f"eval {dom}"
        )
        timings[dom] = time.perf_counter() - began
    both = _Totals()
    for part in totals.values():
        both += part
    timings["total"] = time.perf_counter() - start
    kl = (lambda t: t.kl) if parent is not None else (lambda t: None)
    return QualityReport(
        ppl_code=totals["code"].perplexity,
        ppl_prose=totals["prose"].perplexity,
        kl_to_parent=kl(both),
        kl_code=kl(totals["code"]),
        kl_prose=kl(totals["prose"]),
        n_samples=n_samples,
        seq_len=seq_len,
        seed=seed,
        data={dom: b.to_dict() for dom, b in data_rows.items()},
        timings_s=timings,
        ppl_data=totals["data"].perplexity if data else None,
        kl_data=kl(totals["data"]) if data else None,
    )


@contextlib.contextmanager
def inference_mode(model: Any | None) -> Iterator[None]:
    """Eval mode and ``torch.inference_mode`` for the block; ``model``'s training flag is restored
    afterwards (also on an exception). ``model=None`` does nothing (an optional teacher)."""
    if model is None:
        yield
        return
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        model.train(was_training)


# ------------------------------------------------------------------- internals
def _score(
    model: Any,
    tokens: torch.Tensor,
    *,
    teacher: Any | None = None,
    teacher_logits: torch.Tensor | None = None,
    batch_size: int,
    progress: bool,
    desc: str,
) -> _Totals:
    """CE of ``model`` on ``tokens`` and, with a teacher (live or cached), the KL sums: one student pass."""
    check_int(batch_size, "batch_size")
    totals, offset = _Totals(), 0
    with inference_mode(model), inference_mode(teacher):
        for chunk in _chunks(tokens, batch_size, progress, desc):
            student = log_probs(_logits(model, chunk))  # (B, L, V) float32
            totals += _cross_entropy(student, chunk.to(student.device))
            if teacher_logits is not None:
                cached = teacher_logits[offset : offset + len(chunk)].to(student.device)
                totals += _kl_totals(student, log_probs(cached))
            elif teacher is not None:
                totals += _kl_totals(student, log_probs(_logits(teacher, chunk)).to(student.device))
            offset += len(chunk)
    return totals


def _logits(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    """``(B, L, V)`` next-token logits of ``model`` on ``tokens`` (B, L), in the model's dtype."""
    device = next(model.parameters()).device
    return model(input_ids=tokens.to(device), use_cache=False).logits


def _cross_entropy(log_probs: torch.Tensor, tokens: torch.Tensor) -> _Totals:
    """Summed CE of positions 0..L-2 predicting tokens 1..L-1 (in all and per row)."""
    picked = log_probs[:, :-1].gather(-1, tokens[:, 1:, None])  # (B, L-1, 1)
    rows = picked.sum(dim=(1, 2), dtype=torch.float64)  # (B,)
    return _Totals(ce_nats=-float(rows.sum()), n_targets=picked.numel(), row_ce_nats=(-rows).tolist())


def _kl_totals(student: torch.Tensor, teacher: torch.Tensor) -> _Totals:
    """Summed ``KL(teacher ‖ student)`` over positions (in all and per row); both ``(B, L, V)`` log-probabilities."""
    per_position = token_kl(student, teacher)  # (B, L)
    rows = per_position.sum(dim=1, dtype=torch.float64)  # (B,)
    return _Totals(kl_nats=float(rows.sum()), n_positions=per_position.numel(), row_kl_nats=rows.tolist())


def _chunks(tokens: torch.Tensor, batch_size: int, progress: bool, desc: str) -> Iterator[torch.Tensor]:
    from tqdm.auto import tqdm

    starts = range(0, len(tokens), batch_size)
    for start in tqdm(starts, desc=desc, unit="batch", disable=not progress, leave=False):
        yield tokens[start : start + batch_size]


def _tokens(batches: torch.Tensor | TextBatches) -> torch.Tensor:
    return check_token_ids(batches.tokens if isinstance(batches, TextBatches) else batches, "batches")


def _check_teacher_logits(teacher_logits: torch.Tensor, tokens: torch.Tensor) -> None:
    if tuple(teacher_logits.shape[:2]) != tuple(tokens.shape):
        raise ConfigError(
            f"teacher_logits has shape {tuple(teacher_logits.shape)}; batches {tuple(tokens.shape)} "
            "need (n_samples, seq_len, vocab)"
        )

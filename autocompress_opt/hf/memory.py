"""Peak device memory of a weights trial and of distillation, predicted from the architecture alone.

Pure arithmetic over an :class:`~autocompress_opt.arch.architecture.Architecture` (no weights, no
torch import): :func:`predict_memory` returns the peak live tensor bytes of each stage of a run,
and :func:`training_step_bytes` the peak of one forward + backward, the building block checked
against measurement. :func:`measure_peak_bytes` measures the same quantity for a real call — every
storage an aten op allocates, tracked until it is freed, by a ``TorchDispatchMode`` — on the CPU or
on the ``meta`` device (no memory, no arithmetic), so the predictor is tested without a GPU.

**What autograd keeps** (transformers' Llama-style decoder, SDPA flash attention: Q·Kᵀ is never
materialised; ``c`` = bytes of the compute dtype, ``D`` hidden, ``Hq·d`` / ``Hkv·d`` the query and
KV widths, ``F`` the FFN width), per token, for backward:

* each RMSNorm: its normalised input and output, ``2·D·c`` (in bf16/fp16 the float32 upcast of the
  input replaces the first: ``D·4 + 2·D·c``);
* attention: rotated q and k, v, the SDPA output and its logsumexp (``Hq`` float32), the
  ``o_proj`` input (a contiguous copy of the output), the residual sum;
* the gated FFN: gate, act(gate), up and their product (``4·F·c``), the residual sum;
* the LM head's output ``V·c`` and the loss's float32 log-probabilities (``V·4`` each).

With activation checkpointing (transformers' ``activation_checkpointing_enable``, non-reentrant)
only each layer's input (``D·c``) is kept, and one layer's activations are rebuilt during its
backward. The figures are live-tensor bytes; a CUDA process adds its context and the caching
allocator's slack (:data:`CUDA_OVERHEAD_BYTES`), which :func:`predict_memory` adds to every stage.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autocompress_opt.arch.architecture import Architecture, LayerSpec
from autocompress_opt.errors import ConfigError, check_int, check_number

if TYPE_CHECKING:
    import torch

__all__ = [
    "CUDA_OVERHEAD_BYTES",
    "DEFAULT_TEACHER_BUDGET_GIB",
    "DTYPE_BYTES",
    "MIN_TEACHER_TOP_K",
    "MODES",
    "DistillShape",
    "MeasuredPeak",
    "MemoryPrediction",
    "Stage",
    "WeightsTrialShape",
    "activation_bytes",
    "measure_peak_bytes",
    "predict_memory",
    "teacher_target_bytes",
    "teacher_top_k",
    "training_step_bytes",
]

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
MODES = ("weights", "distill")
_F32 = 4
# The CUDA context (~0.5 GiB with cuBLAS/cuDNN loaded) plus the caching allocator's fragmentation
# and cuBLAS workspaces: 1 GiB is the slack a PyTorch training process on an H100 shows between
# torch.cuda.max_memory_allocated() and nvidia-smi in our experience; stated as an assumption.
CUDA_OVERHEAD_BYTES = 2**30
# Host memory the parent's calibration targets may take before they are kept as top-k (below):
# SmolLM2's and Llama-3-8B's default calibration sets (20 x 128 tokens: 0.23 and 0.61 GiB in
# full, float16) stay full; a million Llama-3 tokens (239 GiB in full) get k = 357.
DEFAULT_TEACHER_BUDGET_GIB = 2.0
# Fewer kept tokens than this and the lumped KL drifts from the full one (measured on SmolLM2 in
# the teacher note); a budget that does not hold them is an error rather than a silent k = 8.
MIN_TEACHER_TOP_K = 64
_TEACHER_ID_BYTES = 4  # int32 token ids of top-k targets


def _dtype_bytes(name: str, what: str = "compute dtype") -> int:
    if name not in DTYPE_BYTES:
        raise ConfigError(f"{what} {name!r} is not one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[name]


# ------------------------------------------------------------------ activations
def _norm_bytes(d_model: int, c: int, trainable: bool) -> int:
    """Bytes per token an RMSNorm keeps: the (upcast) input times its rsqrt, and the output."""
    if c == _F32:
        return 2 * d_model * c if trainable else d_model * c
    # bf16/fp16: float32 copy of the input (pow, mul), the normalised input cast back (kept for the
    # weight's gradient), the output.
    return d_model * _F32 + (2 if trainable else 1) * d_model * c


def _layer_bytes(arch: Architecture, layer: LayerSpec, c: int, trainable: bool) -> int:
    """Bytes per token one decoder layer keeps for backward (see the module docstring)."""
    d_model, total = arch.hidden_size, 0
    if layer.attention:
        q, kv = layer.num_heads * layer.head_dim, layer.num_kv_heads * layer.head_dim
        total += _norm_bytes(d_model, c, trainable)
        total += (q + 2 * kv) * c  # rotated q, rotated k, v: SDPA's inputs
        total += q * c + layer.num_heads * _F32  # SDPA output (already o_proj's layout), logsumexp
        total += d_model * c  # residual sum
    if layer.ffn:
        total += _norm_bytes(d_model, c, trainable)
        total += 4 * layer.ffn_width * c  # gate, act(gate), up, act(gate)·up
        total += d_model * c  # residual sum
    return total


def activation_bytes(
    arch: Architecture,
    tokens: int,
    compute_dtype: str = "fp32",
    *,
    checkpointing: bool = False,
    trainable: bool = True,
) -> int:
    """Bytes autograd keeps through the decoder stack for ``tokens`` (= batch · seq_len) tokens.

    Embedding output, every layer and the final norm; not the LM head's logits (see
    :func:`training_step_bytes`). ``checkpointing``: only each layer's input is kept, plus the
    largest layer's activations while it is rebuilt. ``trainable=False`` (a frozen model) drops the
    norms' inputs kept only for their weights' gradients; other activations are kept as if trained,
    an upper bound for the inner search's masked parent (its masks make every activation after
    the first need a gradient).
    """
    c = _dtype_bytes(compute_dtype)
    d_model = arch.hidden_size
    per_layer = [_layer_bytes(arch, layer, c, trainable) for layer in arch.layers]
    ends = d_model * c + _norm_bytes(d_model, c, trainable)  # embedding output, final norm
    if checkpointing:
        return tokens * (ends + arch.num_layers * d_model * c + max(per_layer))
    return tokens * (ends + sum(per_layer))


def _loss_bytes(vocab: int, c: int, *, teacher_on_device: bool) -> int:
    """Bytes per token at the peak of ``T²·KL(teacher ‖ student)`` of ``(B, T, V)`` logits and its backward.

    Student logits (``c``) and their float32 log-probabilities (kept by log_softmax); the teacher's
    logits, its float32 log-probabilities, ``p_t = exp`` of them (kept by the product) and the two
    float32 temporaries of ``p_t·(log p_t − log p_s)``, at whose product the peak comes. (The
    float32 upcasts of bf16 logits are freed as soon as log_softmax has read them.)
    """
    student = c + _F32
    teacher = (c if teacher_on_device else 0) + 4 * _F32
    return vocab * (student + teacher)


def training_step_bytes(
    arch: Architecture,
    batch_size: int,
    seq_len: int,
    compute_dtype: str = "fp32",
    *,
    checkpointing: bool = False,
    kl_chunk: int | None = None,
    param_grads: bool = True,
) -> int:
    """Peak live bytes of one forward + backward of ``T²·KL(teacher ‖ student)``, weights included.

    The larger of three moments: the end of the forward (every kept activation and the KL's
    vocabulary-sized temporaries), the LM head's backward (the head's gradient appears) and each
    layer's backward, walked from the last layer to the first (gradients accumulate as activations
    are freed; with ``checkpointing`` the layer's activations are rebuilt first), then the
    embedding's gradient. The caller holds the student's and teacher's logits throughout. Weights
    and gradients in ``compute_dtype``; ``param_grads=False`` for a
    frozen model. Teacher logits are given, in ``compute_dtype``, on the device. ``kl_chunk``: the
    KL's float32 tensors exist for ``kl_chunk`` positions at a time (the loss's gradient w.r.t.
    the logits is accumulated chunk by chunk, in ``compute_dtype``).
    """
    check_int(batch_size, "batch_size")
    check_int(seq_len, "seq_len")
    c = _dtype_bytes(compute_dtype)
    tokens, v, d_model = batch_size * seq_len, arch.vocab_size, arch.hidden_size
    weights = arch.num_params * c
    ends = d_model * c + _norm_bytes(d_model, c, param_grads)  # embedding output, final norm
    per_layer = [_layer_bytes(arch, layer, c, param_grads) for layer in arch.layers]
    kept = [d_model * c if checkpointing else b for b in per_layer]
    acts = tokens * (ends + sum(kept))
    logits = tokens * v * 2 * c  # student and teacher logits
    if kl_chunk is None:
        loss_fwd = tokens * v * 4 * _F32 + tokens * v * _F32  # p_t, log p_t, two temporaries; log p_s
        loss_bwd = tokens * v * 3 * _F32  # log p_s, its gradient, log_softmax's input gradient
        held = logits
    else:
        check_int(kl_chunk, "kl_chunk")
        rows = min(tokens, batch_size * kl_chunk)
        loss_fwd = tokens * v * c + rows * v * 5 * _F32  # d loss / d logits, whole; one chunk's tensors
        # The gradient of the logits, whole; the head's peak comes with its weight gradient, which
        # is computed transposed and copied into place (two V x D tensors at once, measured).
        loss_bwd = tokens * v * c + (v * d_model * c if param_grads else 0)
        held = logits + tokens * v * c  # the logits' gradient lives until the model's backward ends
    grad = (lambda n: n * c) if param_grads else (lambda n: 0)
    head = grad(v * d_model + d_model)  # LM head and final norm
    moments = [weights + acts + logits + loss_fwd, weights + acts + logits + loss_bwd + head]
    done, live_acts = head, acts
    for i in reversed(range(arch.num_layers)):
        rebuilt = tokens * per_layer[i] if checkpointing else 0
        step = grad(arch.layer_params(i)) + live_acts + rebuilt + 3 * tokens * d_model * c
        moments.append(weights + held + done + step)
        done += grad(arch.layer_params(i))
        live_acts -= tokens * kept[i]
    # The embedding's gradient; tied to the head, it is added to the head's (a third V x D tensor).
    embed = grad(v * d_model) * (2 if arch.tie_embeddings else 1)
    moments.append(weights + held + done + embed + 2 * tokens * d_model * c)
    return max(moments)


# ------------------------------------------------------------------ teacher targets
def teacher_target_bytes(tokens: int, vocab: int, top_k: int | None = None, value_bytes: int = 2) -> int:
    """Bytes of a teacher's next-token targets at ``tokens`` positions: the full vocabulary
    (``V·value_bytes`` a position) or, with ``top_k``, ``k`` int32 ids and values plus one float32
    tail log-mass (``k·(4 + value_bytes) + 4``; :class:`~autocompress_opt.quality.metrics.TeacherTargets`)."""
    if top_k is None:
        return tokens * vocab * value_bytes
    return tokens * (top_k * (_TEACHER_ID_BYTES + value_bytes) + _F32)


def teacher_top_k(tokens: int, vocab: int, budget_gib: float, value_bytes: int = 2) -> int | None:
    """The form of ``tokens`` positions of teacher targets that fits ``budget_gib`` GiB: None (the
    full vocabulary) when it fits, else the largest ``k`` whose top-k targets fit. Raises
    :class:`ConfigError` when not even :data:`MIN_TEACHER_TOP_K` fit."""
    check_int(tokens, "tokens")
    check_int(vocab, "vocab")
    budget = check_number(budget_gib, "teacher_budget_gib") * 2**30
    if teacher_target_bytes(tokens, vocab, None, value_bytes) <= budget:
        return None
    k = min(int((budget / tokens - _F32) // (_TEACHER_ID_BYTES + value_bytes)), vocab)
    if k < min(MIN_TEACHER_TOP_K, vocab):
        need = teacher_target_bytes(tokens, vocab, min(MIN_TEACHER_TOP_K, vocab), value_bytes) / 2**30
        raise ConfigError(
            f"teacher_budget_gib={budget_gib:g} holds the teacher targets of {tokens:,} calibration tokens "
            f"neither in full ({teacher_target_bytes(tokens, vocab, None, value_bytes) / 2**30:.3g} GiB) nor as "
            f"the top {MIN_TEACHER_TOP_K} tokens ({need:.3g} GiB); raise it to at least {need:.3g} or use fewer "
            "calibration tokens (n_samples x seq_len)"
        )
    return k


# ------------------------------------------------------------------ stages
@dataclass(frozen=True)
class Stage:
    """Peak device bytes of one stage of a run and what is live at that peak (bytes per part)."""

    name: str
    parts: dict[str, int]

    @property
    def peak_bytes(self) -> int:
        return sum(self.parts.values())

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "peak_bytes": self.peak_bytes, "parts": dict(self.parts)}


@dataclass(frozen=True)
class WeightsTrialShape:
    """The sizes of a weights trial that decide its memory (defaults: :class:`TrialConfig`'s).

    ``search_batch`` × ``search_seq_len``: rows and tokens per inner-search step;
    ``n_samples``: calibration rows whose teacher targets exist (fp16); ``teacher_budget_gib``:
    the memory they may take before they are kept as top-k (:func:`teacher_top_k`, the trial's
    ``teacher_budget_gib``); ``teacher_on_device``: they are held on the device rather than
    sliced per step from host memory; ``checkpointing``: the inner search recomputes each decoder
    layer in backward (``InnerConfig.checkpoint_activations``); ``importance_batch`` ×
    ``importance_seq_len`` and ``eval_batch`` × ``eval_seq_len``: the no-grad passes of
    importance scoring and held-out quality.
    """

    search_batch: int = 2
    search_seq_len: int = 128
    n_samples: int = 20
    teacher_on_device: bool = False
    teacher_budget_gib: float = DEFAULT_TEACHER_BUDGET_GIB
    checkpointing: bool = False
    importance_batch: int = 4
    importance_seq_len: int = 128
    eval_batch: int = 4
    eval_seq_len: int = 128

    def __post_init__(self) -> None:
        check_number(self.teacher_budget_gib, "teacher_budget_gib")


@dataclass(frozen=True)
class DistillShape:
    """The sizes of a distillation run that decide its memory (defaults: ``DistillRecipe``'s).

    ``batch_size`` rows per step in all; under FSDP each GPU trains on its share of them.

    ``master_dtype``: the student's trained weights, gradients and AdamW moments (``fp32``: mixed
    precision, the forward casts to the compute dtype; ``bf16``: pure bf16 training).
    ``checkpointing`` / ``kl_chunk``: activation checkpointing and the chunked KL
    (None = the whole sequence at once), off by default as in ``distill`` (its
    ``--gradient-checkpointing`` / ``--kl-chunk``). ``n_eval_rows``: the held-out rows whose KL
    ``distill`` measures before the first and after the last update, ``batch_size`` rows at a
    time, split over the GPUs like the training batch, with the same KL chunk
    (:mod:`autocompress_opt.recover.held_out`). ``student``: the student's architecture (None: the
    same as the teacher's, the upper bound for any pruned child).
    """

    batch_size: int = 8
    seq_len: int = 256
    master_dtype: str = "fp32"
    checkpointing: bool = False
    kl_chunk: int | None = None
    n_eval_rows: int = 8
    student: Architecture | None = None

    def __post_init__(self) -> None:
        for name in ("batch_size", "seq_len", "n_eval_rows"):
            check_int(getattr(self, name), name)
        check_int(self.kl_chunk, "kl_chunk", also=(None,))


@dataclass(frozen=True)
class MemoryPrediction:
    """Predicted peak device memory per GPU of a run, stage by stage.

    ``peak_bytes`` is the largest stage plus :data:`CUDA_OVERHEAD_BYTES` when ``cuda`` is set;
    ``assumptions`` lists what the figures take for granted, in words; ``host_bytes`` the host-memory
    bytes of what a run keeps off the device (a weights trial's teacher targets).
    """

    mode: str
    model: str
    gpus: int
    compute_dtype: str
    stages: tuple[Stage, ...]
    assumptions: tuple[str, ...] = field(default=())
    overhead_bytes: int = 0
    host_bytes: dict[str, int] = field(default_factory=dict)

    @property
    def peak_stage(self) -> Stage:
        return max(self.stages, key=lambda s: s.peak_bytes)

    @property
    def peak_bytes(self) -> int:
        return self.peak_stage.peak_bytes + self.overhead_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "model": self.model,
            "gpus": self.gpus,
            "compute_dtype": self.compute_dtype,
            "peak_bytes": self.peak_bytes,
            "peak_gb": self.peak_bytes / 1e9,
            "peak_stage": self.peak_stage.name,
            "overhead_bytes": self.overhead_bytes,
            "stages": [s.to_dict() for s in self.stages],
            "assumptions": list(self.assumptions),
            "host_bytes": dict(self.host_bytes),
        }


def predict_memory(
    arch: Architecture,
    mode: str,
    *,
    gpus: int = 1,
    compute_dtype: str = "bf16",
    cuda: bool = True,
    weights: WeightsTrialShape | None = None,
    distill: DistillShape | None = None,
) -> MemoryPrediction:
    """Peak device bytes per GPU of a ``weights`` trial or a ``distill`` run on parent ``arch``.

    ``gpus``: FSDP shards the student's weights, gradients and AdamW moments ``gpus`` ways
    (distill; a weights trial runs on one GPU, so ``gpus`` must be 1). ``cuda`` adds
    :data:`CUDA_OVERHEAD_BYTES`. Pure arithmetic: the same arguments give the same figures.
    """
    if mode not in MODES:
        raise ConfigError(f"memory mode {mode!r} is not one of {', '.join(MODES)}")
    check_int(gpus, "gpus")
    _dtype_bytes(compute_dtype)
    host: dict[str, int] = {}
    if mode == "weights":
        if gpus != 1:
            raise ConfigError(f"a weights trial runs on one GPU; got gpus={gpus} (valid: 1, or use --mode distill)")
        stages, assumptions, host = _weights_stages(arch, compute_dtype, weights or WeightsTrialShape())
    else:
        stages, assumptions = _distill_stages(arch, compute_dtype, gpus, distill or DistillShape())
    overhead = CUDA_OVERHEAD_BYTES if cuda else 0
    if cuda:
        assumptions += (f"{overhead / 2**30:g} GiB added for the CUDA context and allocator slack",)
    return MemoryPrediction(
        mode=mode,
        model=arch.name,
        gpus=gpus,
        compute_dtype=compute_dtype,
        stages=tuple(stages),
        assumptions=assumptions,
        overhead_bytes=overhead,
        host_bytes=host,
    )


def _no_grad_pass(arch: Architecture, tokens: int, c: int) -> int:
    """Largest transient of a no-grad forward of ``tokens`` tokens: the logits, their float32
    log-probabilities and one layer's widest intermediates (gate and up, the residual)."""
    widest = max((4 * layer.ffn_width + 2 * arch.hidden_size) * c for layer in arch.layers)
    return tokens * (arch.vocab_size * (c + 2 * _F32) + widest)


def _weights_stages(
    arch: Architecture, dtype: str, shape: WeightsTrialShape
) -> tuple[list[Stage], tuple[str, ...], dict[str, int]]:
    c = _dtype_bytes(dtype)
    parent = arch.num_params * c
    v = arch.vocab_size
    search_tokens = shape.search_batch * shape.search_seq_len
    calibration = shape.n_samples * shape.search_seq_len
    top_k = teacher_top_k(calibration, v, shape.teacher_budget_gib)
    targets = teacher_target_bytes(calibration, v, top_k)
    teacher_cache = targets if shape.teacher_on_device else 0
    # Masks and their Adam moments: one float32 per head and FFN channel, three copies.
    masks = 3 * _F32 * sum(layer.num_heads + layer.ffn_width for layer in arch.layers)
    # One step through the frozen parent: activations kept as if every one needed a gradient (the
    # masks make all after the first do), the KL against the step's teacher slice (counted as a
    # full-vocabulary slice: top-k targets make fewer vocabulary-sized temporaries, so an upper bound).
    step = (
        training_step_bytes(
            arch, shape.search_batch, shape.search_seq_len, dtype, checkpointing=shape.checkpointing, param_grads=False
        )
        - parent
    )
    # Mask hooks keep o_proj's and down_proj's unmasked inputs for the masks' gradients; with
    # checkpointing only the layer being rebuilt holds them.
    per_layer_hooks = [
        search_tokens * c * (layer.num_heads * layer.head_dim + layer.ffn_width) for layer in arch.layers
    ]
    hooks = max(per_layer_hooks) if shape.checkpointing else sum(per_layer_hooks)
    stages = [
        Stage("load parent", {"parent weights": parent}),
        Stage(
            "importance",
            {
                "parent weights": parent,
                "forward": _no_grad_pass(arch, shape.importance_batch * shape.importance_seq_len, c),
            },
        ),
        Stage(
            "teacher targets",
            {"parent weights": parent, "forward": _no_grad_pass(arch, shape.importance_batch * shape.search_seq_len, c)}
            | ({"teacher cache": teacher_cache} if teacher_cache else {}),
        ),
        Stage(
            "inner search",
            {
                "parent weights": parent,
                "masks + Adam": masks,
                "forward + backward": step,
                "mask hooks": hooks,
            }
            | ({"teacher cache": teacher_cache} if teacher_cache else {}),
        ),
        Stage("materialise child", {"parent weights": parent, "child weights": parent}),
        Stage(
            "held-out quality",
            {
                "parent weights": parent,
                "child weights": parent,
                "forward": _no_grad_pass(arch, shape.eval_batch * shape.eval_seq_len, c),
            },
        ),
    ]
    form = "the full vocabulary" if top_k is None else f"the top {top_k} tokens + tail mass"
    assumptions = (
        f"parent weights in {dtype} on one GPU; SDPA flash attention (no T x T scores)",
        f"inner search: {shape.search_batch} x {shape.search_seq_len} tokens per step, activations kept as if "
        "every one needed a gradient (an upper bound for the masked frozen parent); activation checkpointing "
        + ("on" if shape.checkpointing else "off"),
        f"teacher targets of {calibration:,} calibration tokens as {form} (fp16, "
        f"{targets / 2**30:.3g} GiB, budget {shape.teacher_budget_gib:g} GiB) "
        + ("held on the device" if shape.teacher_on_device else "on the host, one step's slice on the device"),
        "the materialised child counted at the parent's size (the upper bound for any child)",
    )
    return stages, assumptions, ({} if shape.teacher_on_device else {"teacher targets": targets})


def _held_out_bytes(
    arch: Architecture, student: Architecture, shape: DistillShape, gpus: int, c: int
) -> dict[str, int]:
    """The held-out KL's transient bytes per GPU (:func:`~autocompress_opt.recover.held_out.held_out_kl`):
    both models' logits of one batch of this GPU's share of the rows in the compute dtype, and five
    float32 ``(rows, chunk, V)`` tensors of the chunk's KL (two log-probabilities, the teacher's
    probabilities, their difference and its product; measured in the tests); or, if larger, the
    teacher's forward beside the student's logits (its widest layer's intermediates, or its logits)."""
    rows = min(shape.batch_size, -(-shape.n_eval_rows // gpus))
    tokens, vocab = rows * shape.seq_len, arch.vocab_size
    positions = rows * min(shape.kl_chunk or shape.seq_len, shape.seq_len)
    kl = 2 * tokens * vocab * c + 5 * positions * vocab * _F32
    # The teacher's forward beside the student's logits: one layer's FFN transients (act(gate), up,
    # their product) and the residual stream, then its logits beside the student's (and the final norm).
    d = arch.hidden_size
    widest = max(max(3 * layer.ffn_width + 2 * d, vocab + d) for layer in (*arch.layers, *student.layers))
    forward = tokens * c * (vocab + widest)
    if kl >= forward:
        return {"logits (student, teacher)": 2 * tokens * vocab * c, "KL chunk (float32)": 5 * positions * vocab * _F32}
    return {"forward (teacher, beside the student's logits)": forward}


def _distill_stages(
    arch: Architecture, dtype: str, gpus: int, shape: DistillShape
) -> tuple[list[Stage], tuple[str, ...]]:
    c, m = _dtype_bytes(dtype), _dtype_bytes(shape.master_dtype, "master dtype")
    student = shape.student or arch
    rows = -(-shape.batch_size // gpus)  # each process trains on its share of the step's rows
    # The teacher: whole on one GPU; under FSDP sharded like the student (recover.fsdp.shard_frozen),
    # each GPU gathering one layer (and the next, prefetched) plus embeddings and head for its forward.
    teacher = math.ceil(arch.num_params * c / gpus)
    widest_teacher = max(arch.layer_params(i) for i in range(arch.num_layers))
    teacher_gathered = (2 * widest_teacher + arch.embedding_params) * c if gpus > 1 else 0
    master = math.ceil(student.num_params * m / gpus)
    # The forward works on full weights: under FSDP (``distill(fsdp=True)``, no mixed-precision
    # policy) the all-gathered layer and the prefetched next one, plus embeddings and head, in the
    # master dtype, and autocast's compute-dtype copies of them; unsharded mixed precision:
    # autocast's cache of every weight cast.
    widest_layer = max(student.layer_params(i) for i in range(student.num_layers))
    if gpus > 1:
        working = (2 * widest_layer + student.embedding_params) * (m + (c if m != c else 0))
    else:
        working = student.num_params * c if m != c else 0
    # One forward + backward of the student (training_step_bytes, checked against measurement):
    # its activations, logits, the KL and, on one GPU, the gradients present at the step's peak.
    # Under FSDP the gradients are reduce-scattered layer by layer: the sharded gradients of the
    # whole model plus the unsharded ones of the two layers in flight, in the master dtype.
    one_gpu = gpus == 1
    step = (
        training_step_bytes(
            student,
            rows,
            shape.seq_len,
            dtype,
            checkpointing=shape.checkpointing,
            kl_chunk=shape.kl_chunk,
            param_grads=one_gpu,
        )
        - student.num_params * c
    )
    grads = 0 if one_gpu else master + 2 * widest_layer * m
    base = {"teacher weights": teacher, "student weights (shard)": master}  # the teacher's: its shard under FSDP
    gathered = {"teacher gathered weights": teacher_gathered} if gpus > 1 else {}
    stages = [
        Stage("load", dict(base)),
        Stage("held-out KL", base | gathered | _held_out_bytes(arch, student, shape, gpus, c)),
        Stage(
            "train step",
            base
            | {
                "AdamW moments (shard)": 2 * master,  # kept from the previous step
                "gathered weights": working,
                "activations, logits, KL" + (", gradients" if one_gpu else ""): step,
            }
            | ({} if one_gpu else {"gradients (shard + 2 layers)": grads}),
        ),
        Stage(
            "optimizer step",
            base
            | {
                "gradients (shard)": master,
                "AdamW moments (shard)": 2 * master,
                "AdamW temporaries": master,
            },
        ),
    ]
    chunk = "whole sequence" if shape.kl_chunk is None else f"{shape.kl_chunk} positions at a time"
    assumptions = (
        f"teacher weights in {dtype}"
        + (f", FSDP-sharded {gpus} ways, one layer gathered at a time" if gpus > 1 else ", on the GPU"),
        f"student weights, gradients and AdamW moments in {shape.master_dtype}"
        + (f", FSDP-sharded {gpus} ways" if gpus > 1 else ", on one GPU")
        + f"; forward and backward in {dtype}",
        f"{shape.batch_size} x {shape.seq_len} tokens per step, {rows} row(s) per GPU; activation checkpointing "
        + ("on" if shape.checkpointing else "off")
        + f"; KL over the vocabulary {chunk}",
        f"held-out KL on {shape.n_eval_rows} rows, at most {shape.batch_size} at a time, split over the GPUs, "
        f"KL {chunk}",
        "student counted at the teacher's size unless given (the upper bound for any pruned child)",
    )
    return stages, assumptions


# ------------------------------------------------------------------ measurement
@dataclass(frozen=True)
class MeasuredPeak:
    """Live tensor bytes measured around a call: ``peak_bytes`` (the most at once, ``baseline``
    included) and ``baseline_bytes`` (storages of the tensors handed in as already live)."""

    peak_bytes: int
    baseline_bytes: int


def measure_peak_bytes(fn: Callable[[], Any], *, live: Iterable[torch.Tensor] = ()) -> MeasuredPeak:
    """Run ``fn()`` and measure the peak of live tensor storage bytes on any device.

    Every storage an aten op returns is counted from its creation until it is freed (a weak
    reference to the storage expires); ``live`` (e.g. ``model.parameters()``) are counted from the
    start. Works on the CPU and on the ``meta`` device, where nothing is computed. On ``meta``: a
    scalar read of data (``Tensor.item()``, e.g. transformers' check that rows are not packed)
    answers 1, the value unpadded, unpacked calibration rows give; and an unmasked causal
    ``scaled_dot_product_attention`` runs the flash kernel's meta function (which keeps q, k, v,
    the output and its logsumexp, as the CPU and CUDA flash kernels do) instead of the math
    fallback, which would materialise the ``T × T`` scores. Allocations inside one kernel
    (workspaces) and outside aten (a CUDA context) are not seen.
    """
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class _Tracker(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.storages: dict[int, tuple[Any, int]] = {}
            self.current = 0
            self.peak = 0

        def add(self, tensor: torch.Tensor) -> None:
            storage = tensor.untyped_storage()
            ref = StorageWeakRef(storage)
            if ref.cdata not in self.storages:
                self.storages[ref.cdata] = (ref, storage.nbytes())
                self.current += storage.nbytes()

        def sweep(self) -> None:
            for key in [k for k, (ref, _) in self.storages.items() if ref.expired()]:
                self.current -= self.storages.pop(key)[1]

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.sweep()
            if func is torch.ops.aten._local_scalar_dense.default and args[0].device.type == "meta":
                return True if args[0].dtype == torch.bool else 1
            out = func(*args, **(kwargs or {}))
            for item in tree_flatten(out)[0]:
                if isinstance(item, torch.Tensor):
                    self.add(item)
            self.peak = max(self.peak, self.current)
            return out

    tracker = _Tracker()
    for tensor in live:
        tracker.add(tensor)
    baseline = tracker.current
    tracker.peak = baseline
    functional = torch.nn.functional
    sdpa = functional.scaled_dot_product_attention

    def flash_on_meta(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if q.device.type != "meta" or args or kwargs.get("attn_mask") is not None:
            return sdpa(q, k, v, *args, **kwargs)
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        return flash(q, k, v, kwargs.get("dropout_p", 0.0), kwargs.get("is_causal", False), scale=kwargs.get("scale"))[
            0
        ]

    # Patched for the call only (transformers looks the function up at each call, checkpointed
    # recomputation included); the math fallback is what meta tensors would otherwise get.
    functional.scaled_dot_product_attention = flash_on_meta  # type: ignore[assignment]
    try:
        with tracker:
            fn()
    finally:
        functional.scaled_dot_product_attention = sdpa
    return MeasuredPeak(peak_bytes=tracker.peak, baseline_bytes=baseline)

"""Recover a pruned model's quality by logit distillation from its parent, on a fixed token budget.

:func:`distill` trains every parameter of a *student* (a checkpoint this package exported, or any
Hugging Face safetensors directory) to match a frozen *teacher*'s next-token distributions:

    loss = T² · mean over positions of KL(softmax(teacher / T) ‖ softmax(student / T))

(Hinton et al. 2015, "Distilling the Knowledge in a Neural Network": the T² keeps gradient
magnitudes comparable across temperatures). AdamW, linear warmup then cosine decay to
:data:`MIN_LR_RATIO` of the peak rate, gradient-norm clipping.

**Precision.** The student's weights, gradients and AdamW moments are float32 (the master
weights) unless ``pure_bf16``. ``compute_dtype="bf16"`` computes in bf16 over them: the teacher
is loaded in bf16, the student's forward and backward run under bf16 autocast (one process) or on
bf16 copies FSDP2 all-gathers (``MixedPrecisionPolicy``, sharded); the loss is float32. An update
below bf16's resolution (~0.4 % of a weight) is kept, which pure bf16 weights would round away.
``pure_bf16=True`` keeps the student in bf16 too (weights, gradients, moments: half the memory),
on request only.

**Memory** (for 8B-class models; :mod:`autocompress_opt.hf.memory` predicts the peak): on request,
pure bf16 (above), activation checkpointing (``gradient_checkpointing``: each decoder
layer's activations are recomputed in backward instead of kept) and a chunked KL (``kl_chunk``:
the loss and its gradient w.r.t. the logits are computed ``kl_chunk`` positions at a time, so the
``(B, L, V)`` float32 log-probabilities never exist at once; same loss up to float rounding). The
defaults keep all three off.

**Sharding** (``fsdp=True``, under ``torchrun`` with an initialised process group of ``W``
processes; :mod:`autocompress_opt.recover.fsdp` after torchtune's distributed recipe): every
process builds the student on the ``meta`` device, wraps every decoder layer and then the whole
student with FSDP2's ``fully_shard`` and allocates its shard only; rank 0 reads the weights into
host memory and broadcasts them, each process keeping its shard, so its weights, gradients and
AdamW moments are split ``W`` ways and no GPU ever holds the whole student; each process
trains on rows ``rank, rank + W, ...`` of the step's batch (``batch_size`` must divide by ``W``)
against the teacher, sharded the same way (each process holds ``1/W`` of it on its device and
gathers one layer at a time for its forward: :func:`~autocompress_opt.recover.fsdp.shard_frozen`);
FSDP averages the gradients, so an update is that of the whole batch on one process (up to float
rounding), and the reported loss is the mean over the
processes. Every collective runs on the process group's device (the GPU under NCCL, the CPU
under gloo). Rank 0 gathers the full weights and moments, shard by shard into host memory, to write
each checkpoint, in the same format as an unsharded run, so a checkpoint resumes with or without
sharding. Only rank 0 looks at the output directory (checkpoint or not, which step) and reads a
checkpoint; it broadcasts what it found, the weights and the moments, so the processes agree
even when each node has its own disk (the output directory need only be on rank 0's node).

**Budget.** A run is ``steps × batch_size × seq_len`` tokens, all of them calibration text
(:mod:`autocompress_opt.data.textdata`; never a held-out document). The :class:`DistillRecipe` and the
data record are written into every checkpoint and the result, so two arms of a comparison can be
shown to have had identical budgets.

**Data order.** The rows are read from a :class:`~autocompress_opt.data.stream.TokenStream` of the
calibration documents (the user's ``data``, else the built-in sources) with the recipe's
``seq_len`` and ``seed``: step ``i`` trains on its next ``batch_size`` rows. Documents are tokenised
as the stream reaches them (one per group in memory, however large the corpus), and no token of
the text is trained on twice until all of it has been; then the stream begins another pass in a
new order, warns once (:class:`~autocompress_opt.data.stream.TextRepeatsWarning`), and the passes
are counted in the result and the model card (``data_passes``, ``stream``). The stream's position
is part of every checkpoint, so a resumed run reads the rows an uninterrupted one would.

**Checkpoints.** Every ``save_every`` steps and at the end, the output directory is replaced by a
complete checkpoint written beside it and renamed into place (the previous one is renamed aside
first, then deleted, so no half-written checkpoint is ever read): the student in the export
format of :func:`~autocompress_opt.prune.export.export_model` (a heterogeneous student stays
heterogeneous; ``load_model(out)`` loads it), the student's model card with a ``distillation``
record added, and ``distill_state/`` holding the AdamW moments and the RNG states
(``state.safetensors``, nothing pickled) plus step, losses, recipe and data record
(``state.json``); the moments take twice the model's size on disk. Calling :func:`distill` again
with the same arguments continues from the last checkpoint and ends with the same weights as an
uninterrupted run (bit for bit on CPU); a checkpoint made with another recipe, teacher, student or
data is refused naming the field, unless ``restart=True``. A finished run called again returns its
result without training.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch

from autocompress_opt.errors import ConfigError, check_int
from autocompress_opt.quality.metrics import log_probs, token_kl
from autocompress_opt.recover.balance import check_balanced_student, router_balance
from autocompress_opt.recover.checkpoint import (
    _STATE_FORMAT,
    _STATE_JSON,
    _STATE_TENSORS,
    SHARDS_DIR,
    STATE_DIR,
    RecipeMismatchError,
    _check_same,
    _optimizer_tensors,
    _read_state,
    _replace_dir,
    _restore,
    _restore_shards,
    _rng_tensors,
    _staging_dir,
    _student_card,
)
from autocompress_opt.recover.fsdp import (
    _barrier,
    _from_rank0,
    _load_sharded,
    _mean_over_processes,
    _shard,
    _skeleton,
    _world_size,
    shard_frozen,
)
from autocompress_opt.recover.held_out import held_out_kl
from autocompress_opt.recover.preflight import (
    check_compatible,
    checkpoint_layers,
    resolve_student_dir,
    training_device,
    training_dtypes,
)
from autocompress_opt.recover.recipe import MIN_LR_RATIO, DistillRecipe, learning_rate

__all__ = [
    "MIN_LR_RATIO",
    "STATE_DIR",
    "DistillRecipe",
    "DistillResult",
    "RecipeMismatchError",
    "distill",
    "distillation_backward",
    "distillation_loss",
    "learning_rate",
]


def distillation_loss(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """``T² · mean_positions KL(teacher ‖ student)`` of ``(B, L, V)`` logits, in nats, computed in float32.

    Both distributions are softened by ``temperature`` (:func:`~autocompress_opt.quality.metrics.log_probs`);
    the ``T²`` keeps gradient magnitudes comparable across temperatures (Hinton et al. 2015). At
    ``T = 1`` this is the ``kl_divergence`` of :mod:`autocompress_opt.quality.metrics` (same
    :func:`~autocompress_opt.quality.metrics.token_kl`). Differentiable w.r.t. ``student_logits``;
    shapes that differ raise ``ConfigError``.
    """
    per_position = token_kl(log_probs(student_logits, temperature), log_probs(teacher_logits, temperature))  # (B, L)
    return per_position.mean() * temperature**2


def distillation_backward(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    temperature: float = 1.0,
    *,
    chunk: int | None = None,
    extra: torch.Tensor | None = None,
) -> torch.Tensor:
    """Backpropagate :func:`distillation_loss` of ``(B, L, V)`` logits, plus ``extra`` (a scalar of the same
    graph: the load-balance loss, :mod:`.balance`); returns the distillation loss (detached).

    ``chunk``: positions per piece. The loss of each piece of ``chunk`` positions (weighted by its
    share of ``L``) is differentiated w.r.t. that piece of the logits alone, the pieces' gradients
    are written into one ``(B, L, V)`` gradient in the logits' dtype, and one backward through the
    model follows; so the float32 log-probabilities and KL temporaries exist for ``B · chunk``
    positions at a time instead of ``B · L``. Loss and gradients equal the unchunked ones up to
    float rounding (the mean is summed in pieces). ``None`` (or ``chunk >= L``): one piece.
    """
    length = student_logits.shape[1]
    check_int(chunk, "kl_chunk (positions per piece)", also=(None,))
    if chunk is None or chunk >= length:
        loss = distillation_loss(student_logits, teacher_logits, temperature)
        (loss if extra is None else loss + extra).backward()
        return loss.detach()
    if student_logits.shape != teacher_logits.shape:
        raise ConfigError(
            f"student logits {tuple(student_logits.shape)} and teacher logits {tuple(teacher_logits.shape)} differ"
        )
    grad = torch.empty_like(student_logits)  # (B, L, V), filled piece by piece
    total = torch.zeros((), dtype=torch.float32, device=student_logits.device)
    for start in range(0, length, chunk):
        end = min(start + chunk, length)
        piece = student_logits[:, start:end].detach().requires_grad_()  # (B, chunk, V), a leaf
        loss = distillation_loss(piece, teacher_logits[:, start:end], temperature) * ((end - start) / length)
        loss.backward()
        assert piece.grad is not None
        grad[:, start:end] = piece.grad
        total += loss.detach()
    if extra is None:
        student_logits.backward(grad)
    else:
        torch.autograd.backward([student_logits, extra], [grad, torch.ones_like(extra)])
    return total


# ------------------------------------------------------------------------------ the result
@dataclass(frozen=True)
class DistillResult:
    """What a :func:`distill` call produced.

    Attributes:
        out_dir: the checkpoint directory (``load_model(out_dir)`` loads the student).
        recipe: the recipe trained with.
        teacher / student: resolved paths of the teacher's weights and the starting student.
        steps_done / tokens_seen: updates and tokens trained on so far (the whole budget when complete).
        resumed_from_step: the checkpoint step this call started from (0 = a fresh run).
        initial_kl / final_kl: held-out mean per-position KL(teacher ‖ student) in nats before
            training and after the last step (None until the run is complete).
        losses: training loss of every update, in order.
        train_s: seconds this call spent in updates; ``seconds_per_step`` and ``tokens_per_s`` are
            over this call's updates (None when it made none).
        data / eval_data: records of the calibration stream and the held-out rows.
        device / precision: where and how it trained (``fp32``, ``bf16-autocast``, ``bf16-mixed``:
            bf16 compute over fp32 master weights, or ``bf16``: pure bf16 weights).
        gradient_checkpointing / kl_chunk: the memory options it trained with.
        data_passes: passes over the calibration text begun by the group that began the most
            (1: no token trained on twice; more: the text ran out and was read again).
        stream: the stream's :meth:`~autocompress_opt.data.stream.TokenStream.summary` at the end of
            this call (rows; per group passes, document tokens read, tokens of one whole pass).
    """

    out_dir: Path
    recipe: DistillRecipe
    teacher: str
    student: str
    steps_done: int
    tokens_seen: int
    resumed_from_step: int
    initial_kl: float
    final_kl: float | None
    losses: tuple[float, ...] = field(repr=False)
    train_s: float
    seconds_per_step: float | None
    tokens_per_s: float | None
    data: dict[str, Any] = field(repr=False)
    eval_data: dict[str, Any] = field(repr=False)
    device: str
    precision: str
    gradient_checkpointing: bool = False
    kl_chunk: int | None = None
    data_passes: int = 1
    stream: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def complete(self) -> bool:
        return self.steps_done == self.recipe.steps

    def summary(self) -> str:
        """One line: steps, tokens, speed and the held-out KL before → after."""
        speed = (
            f", {self.seconds_per_step:.2f} s/step, {self.tokens_per_s:,.0f} tokens/s"
            if self.seconds_per_step is not None
            else ""
        )
        after = f"{self.final_kl:.4f}" if self.final_kl is not None else "(incomplete)"
        passes = (
            "1 pass over the calibration text"
            if self.data_passes == 1
            else f"{self.data_passes} passes over the calibration text: it repeats"
        )
        return (
            f"{self.steps_done}/{self.recipe.steps} steps, {self.tokens_seen:,} tokens ({passes}){speed}; "
            f"held-out KL {self.initial_kl:.4f} -> {after} nats; wrote {self.out_dir}"
        )

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data.update(
            out_dir=str(self.out_dir),
            recipe=self.recipe.to_dict(),
            losses=list(self.losses),
            complete=self.complete,
            budget_tokens=self.recipe.budget_tokens,
        )
        return data


# ------------------------------------------------------------------------------- the API
def distill(
    student_ref: str | Path,
    teacher_ref: str | Path,
    out_dir: str | Path,
    recipe: DistillRecipe,
    *,
    progress: bool = True,
    restart: bool = False,
    force: bool = False,
    device: str = "cpu",
    bf16: bool = False,
    compute_dtype: str = "fp32",
    pure_bf16: bool = False,
    gradient_checkpointing: bool = False,
    kl_chunk: int | None = None,
    fsdp: bool = False,
    sharded_checkpoints: bool = False,
    data: Sequence[str] = (),
) -> DistillResult:
    """Distil ``teacher_ref`` into the student in directory ``student_ref``; write the result to ``out_dir``.

    Args:
        student_ref: a checkpoint directory (an :func:`~autocompress_opt.prune.export.export_model`
            output or a Hugging Face safetensors directory with its tokenizer).
        teacher_ref: anything :func:`~autocompress_opt.hf.loading.load_model` loads; it must share the
            student's vocabulary. Its text is tokenised with the student's tokenizer.
        out_dir: the output checkpoint; a checkpoint of this run in it is resumed.
        recipe: the training recipe (the run's identity together with teacher, student and data).
        progress: show a tqdm bar (loss, tokens/s) on stderr.
        restart: discard a checkpoint in ``out_dir`` and start over.
        force: replace a non-empty ``out_dir`` that holds no distillation checkpoint.
        device: ``cpu``, ``cuda`` (or ``cuda:N``) or ``auto`` (CUDA when available).
        bf16: bf16 autocast for the forward passes (CUDA only); weights and the loss stay float32.
        compute_dtype: ``fp32`` (default), ``bf16`` (bf16 compute over float32 master weights,
            see the module docstring; CPU or CUDA) or ``auto`` (bf16 on a CUDA GPU with native
            bf16, else fp32; :mod:`autocompress_opt.hf.device`). ``fp16`` is refused (it would
            need loss scaling).
        pure_bf16: with ``compute_dtype`` bf16, keep the student's weights, gradients and AdamW
            moments in bf16 too (half the memory; updates under ~0.4 % of a weight are lost).
        gradient_checkpointing: recompute each decoder layer's activations in backward instead
            of keeping them (transformers' ``activation_checkpointing_enable``, or the same
            non-reentrant ``torch.utils.checkpoint`` per layer for a heterogeneous student).
        kl_chunk: compute the loss ``kl_chunk`` positions at a time (:func:`distillation_backward`).
        fsdp: shard the student with FSDP2 over the initialised ``torch.distributed`` process
            group (see the module docstring); every process calls :func:`distill` alike. On CUDA
            each process uses GPU ``LOCAL_RANK`` (torchrun sets it).
        sharded_checkpoints: with ``fsdp``, write the checkpoints before the last step as a
            distributed checkpoint, each process its own shards, instead of gathering the whole
            model into rank 0's host memory (:mod:`~autocompress_opt.recover.checkpoint`); the
            output directory must then be on storage every process sees. Such a checkpoint resumes
            under any number of processes, with or without this flag.
        data: the user's ``--data`` specs (:mod:`autocompress_opt.data.user`): the training rows
            are streamed from their calibration split and the KL before/after comes from their test
            split; empty: the built-in sources. Their record (SHA-256, groups) is part of the run's identity.

    Deterministic given its arguments on a given device; the caller's torch RNG state is restored
    on return. Raises :class:`ConfigError` for a missing student, ``out_dir`` equal to it, a
    vocabulary mismatch or ``seq_len`` beyond the model's context;
    :class:`~autocompress_opt.prune.export.OutputExistsError` for an unrelated non-empty ``out_dir``
    without ``force``; :class:`RecipeMismatchError` naming the field that differs from the checkpoint.
    """
    if not isinstance(recipe, DistillRecipe):
        raise ConfigError(f"recipe must be a DistillRecipe, got {type(recipe).__name__}")
    student_dir = resolve_student_dir(student_ref)
    out = Path(out_dir).expanduser().resolve()
    if out == student_dir:
        raise ConfigError(f"the output directory must differ from the student's ({str(out)!r})")
    torch_device, precision = training_device(device, bf16)
    dtype, teacher_dtype, precision = training_dtypes(compute_dtype, torch_device, precision, pure_bf16)
    check_int(kl_chunk, "kl_chunk (positions per piece)", also=(None,))
    world = _world_size(fsdp, recipe)
    if sharded_checkpoints and world == 1:
        raise ConfigError(
            "sharded_checkpoints=True (--sharded-checkpoints) splits a checkpoint over the processes of an "
            "FSDP run: use it with fsdp=True (--fsdp) under torchrun with more than one process"
        )
    if world > 1 and torch_device.type == "cuda":  # one GPU per process: torchrun's LOCAL_RANK
        import os

        torch_device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(torch_device)
    options = _Options(
        dtype=dtype,
        teacher_dtype=teacher_dtype,
        gradient_checkpointing=bool(gradient_checkpointing),
        kl_chunk=kl_chunk,
        world_size=world,
        sharded_checkpoints=bool(sharded_checkpoints),
        data=tuple(data),
    )
    # Rank 0 alone looks at `out` (node-local disks may differ) and hands its finding to every process.
    state = _from_rank0(lambda: _checkpoint_in(out, recipe, student_dir, restart, force), world)
    with torch.random.fork_rng(devices=[torch_device] if torch_device.type == "cuda" else []):
        run = _Run.start(student_dir, teacher_ref, out, recipe, state, torch_device, precision, options)
        return run.train(progress)


def _checkpoint_in(
    out: Path, recipe: DistillRecipe, student_dir: Path, restart: bool, force: bool
) -> dict[str, Any] | None:
    """The ``state.json`` of the checkpoint of this run in ``out`` to resume (None: start afresh);
    raises when ``out`` cannot take the run's checkpoint or holds another run's."""
    from autocompress_opt.prune.export import OutputExistsError

    if out.exists() and not out.is_dir():
        raise OutputExistsError(f"output path {str(out)!r} exists and is not a directory")
    ours = (out / STATE_DIR / _STATE_JSON).is_file()
    if not ours and out.is_dir() and any(out.iterdir()) and not force:
        raise OutputExistsError(
            f"output directory {str(out)!r} is not empty and holds no distillation "
            "checkpoint; pass force=True (--force) to replace it"
        )
    state = _read_state(out) if ours and not restart else None
    if state is not None:
        _check_same(state["identity"], {"recipe": recipe.to_dict(), "student": str(student_dir)}, out)
    return state


# ------------------------------------------------------------------------------ internals
@dataclass(frozen=True)
class _Options:
    """How a run uses memory: the weights' dtypes, activation checkpointing, the KL's chunk."""

    dtype: torch.dtype = torch.float32  # the student's (master) weights, gradients and moments
    teacher_dtype: torch.dtype = torch.float32
    gradient_checkpointing: bool = False
    kl_chunk: int | None = None
    world_size: int = 1  # > 1: the student is FSDP-sharded over that many processes
    sharded_checkpoints: bool = False  # the checkpoints before the last step: each process writes its shards
    data: tuple[str, ...] = ()  # the user's --data specs (the text, not how memory is used: kept here for brevity)

    @property
    def rank(self) -> int:
        return torch.distributed.get_rank() if self.world_size > 1 else 0


@dataclass
class _Run:
    """One call's training session: models, data, optimizer, and where the checkpoint left off."""

    recipe: DistillRecipe
    student: Any  # LoadedModel of the student (its .model is `model`, in train mode)
    teacher: Any  # LoadedModel of the teacher, frozen, eval mode
    model: Any
    optimizer: torch.optim.Optimizer
    stream: Any  # TokenStream of the calibration rows, at the position of start_step
    eval_tokens: torch.Tensor  # (n_eval_rows, seq_len) held-out rows
    identity: dict[str, Any]  # recipe, student, teacher, data records: what a resume must match
    card: dict[str, Any]  # the student's model card ({} when it has none)
    student_dir: Path
    out: Path
    device: torch.device
    precision: str
    options: _Options
    shadow: Any  # rank 0 of a sharded run: the unsharded host copy the gathered weights are exported from
    initial_kl: float
    final_kl: float | None
    start_step: int
    losses: list[float]
    train_s_total: float

    @classmethod
    def start(
        cls,
        student_dir: Path,
        teacher_ref: str | Path,
        out: Path,
        recipe: DistillRecipe,
        state: dict[str, Any] | None,
        device: torch.device,
        precision: str,
        options: _Options,
    ) -> _Run:
        from transformers import AutoTokenizer

        from autocompress_opt.data.stream import data_stream
        from autocompress_opt.data.user import data_batches
        from autocompress_opt.hf.loading import load_model

        sharded = options.world_size > 1  # then the teacher is read into host memory and sharded (below)
        where = torch.device("cpu") if sharded else device
        teacher = load_model(teacher_ref, cache=False, device=where, dtype=options.teacher_dtype)
        teacher.model.requires_grad_(False).eval()
        # the starting weights: the checkpoint's own student files, or (none yet, or a sharded
        # checkpoint, whose weights are loaded below) the student's
        whole = state is not None and state.get("weights") != "sharded"
        source = out if whole else student_dir
        if options.world_size > 1:  # the whole student only on rank 0, in host memory
            student = load_model(source, cache=False, dtype=options.dtype) if options.rank == 0 else None
            model = _skeleton(student_dir, options.dtype)  # on the meta device
        else:
            student = load_model(source, cache=False, device=device, dtype=options.dtype)
            model = student.model
        check_compatible(model, teacher.model, student_dir, teacher_ref, recipe.seq_len)
        check_balanced_student(model, recipe.load_balance)  # a load-balance loss needs MoE routers
        # Text is always tokenised by the starting student's tokenizer, so a resume draws the same rows.
        tokenizer = AutoTokenizer.from_pretrained(student_dir, local_files_only=True)
        data = options.data or None  # the user's --data specs, else the built-in sources
        # Every process reads the whole stream (and keeps its own rows of each batch); one warns.
        stream = data_stream(
            tokenizer, data=data, role="calibration", seq_len=recipe.seq_len, seed=recipe.seed, quiet=options.rank > 0
        )
        held_out = data_batches(  # reported only (the KL before/after), so from the test split
            tokenizer, role="test", n_samples=recipe.n_eval_rows, seq_len=recipe.seq_len, seed=recipe.seed, data=data
        )
        identity = {
            "recipe": recipe.to_dict(),
            "student": str(student_dir),
            "teacher": str(teacher.path),
            "data": stream.record(),
            "eval_data": held_out.to_dict(),
        }
        if state is not None:
            _check_same(state["identity"], identity, out)
        model.train()
        if options.gradient_checkpointing:
            checkpoint_layers(model)
        shadow = None
        if options.world_size > 1:
            shadow = student.model if student is not None else None
            _shard(model, device, options.world_size, precision)
            _load_sharded(model, shadow, device)
            teacher = replace(teacher, model=shard_frozen(teacher.model, device, options.world_size))
        optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
        if state is None:
            torch.manual_seed(recipe.seed)
            world = options.world_size
            initial_kl = held_out_kl(
                model, teacher.model, held_out.tokens, recipe.batch_size, chunk=options.kl_chunk, world=world
            )
            state = {"step": 0, "losses": [], "train_s_total": 0.0, "final_kl": None}
        else:
            if state.get("weights") == "sharded":
                _restore_shards(model, optimizer, out, state)
            else:
                _restore(model, optimizer, out, state)
            stream.seek(state["stream"])
            initial_kl = state["initial_kl"]
        return cls(
            recipe=recipe,
            student=student,
            teacher=teacher,
            model=model,
            optimizer=optimizer,
            stream=stream,
            eval_tokens=held_out.tokens,
            identity=identity,
            card=_student_card(student_dir),
            student_dir=student_dir,
            out=out,
            device=device,
            precision=precision,
            options=options,
            shadow=shadow,
            initial_kl=initial_kl,
            final_kl=state["final_kl"],
            start_step=state["step"],
            losses=list(state["losses"]),
            train_s_total=state["train_s_total"],
        )

    def train(self, progress: bool) -> DistillResult:
        from tqdm.auto import tqdm

        recipe, tokens_per_step = self.recipe, self.recipe.batch_size * self.recipe.seq_len
        final_kl, session_s = self.final_kl, 0.0
        progress = progress and self.options.rank == 0
        bar = tqdm(total=recipe.steps, initial=self.start_step, desc="distill", unit="step", disable=not progress)
        with bar:
            for step in range(self.start_step, recipe.steps):
                began = time.perf_counter()
                batch = self.stream.take(recipe.batch_size).tokens  # (batch_size, seq_len)
                rows = batch[self.options.rank :: self.options.world_size]  # this process's share
                loss = _train_step(
                    self.model,
                    self.teacher.model,
                    rows.to(self.device),
                    self.optimizer,
                    learning_rate(recipe, step),
                    recipe,
                    self.precision,
                    self.options.kl_chunk,
                )
                loss = _mean_over_processes(loss, self.options.world_size)
                session_s += time.perf_counter() - began
                self.losses.append(loss)
                bar.update(1)
                tokens_per_s = tokens_per_step * (step + 1 - self.start_step) / session_s
                bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tokens_per_s:,.0f}")
                done = step + 1
                if done == recipe.steps:
                    final_kl = held_out_kl(
                        self.model,
                        self.teacher.model,
                        self.eval_tokens,
                        recipe.batch_size,
                        chunk=self.options.kl_chunk,
                        world=self.options.world_size,
                    )
                if done == recipe.steps or done % recipe.save_every == 0:
                    self._save(done, final_kl, self.train_s_total + session_s)
        return self._result(len(self.losses), final_kl, session_s)

    def _record(self, steps_done: int, final_kl: float | None, train_s: float) -> dict[str, Any]:
        """The ``distillation`` entry of the model card."""
        return {
            "teacher": {
                "ref": self.identity["teacher"],
                "source": self.teacher.source,
                "num_params": self.teacher.num_params,
            },
            "student": {"path": self.identity["student"], "num_params": self.student.num_params},
            "recipe": self.recipe.to_dict(),
            "budget_tokens": self.recipe.budget_tokens,
            "steps_done": steps_done,
            "tokens_seen": steps_done * self.recipe.batch_size * self.recipe.seq_len,
            "data_passes": self.stream.passes,
            "stream": self.stream.summary(),
            "complete": steps_done == self.recipe.steps,
            "held_out_kl": {"initial": self.initial_kl, "final": final_kl, "n_rows": self.recipe.n_eval_rows},
            "first_loss": self.losses[0] if self.losses else None,
            "last_loss": self.losses[-1] if self.losses else None,
            "train_s": train_s,
            "device": str(self.device),
            "precision": self.precision,
            "gradient_checkpointing": self.options.gradient_checkpointing,
            "kl_chunk": self.options.kl_chunk,
            "fsdp_processes": self.options.world_size,
            "data": self.identity["data"],
            "eval_data": self.identity["eval_data"],
        } | self._previous()

    def _previous(self) -> dict[str, Any]:
        """The student's own ``distillation`` record, kept when a distilled model is distilled again."""
        earlier = self.card.get("extra", {}).get("distillation")
        return {"previous": earlier} if earlier is not None else {}

    def _save(self, steps_done: int, final_kl: float | None, train_s: float) -> None:
        if self.options.sharded_checkpoints and steps_done < self.recipe.steps:
            self._save_shards(steps_done, final_kl, train_s)
            return
        if self.options.world_size > 1:
            model, moments = self._gathered()
            if model is not None:
                self._write(model, moments, steps_done, final_kl, train_s)
            _barrier(self.options.world_size)
            return
        self._write(self.model, _optimizer_tensors(self.model, self.optimizer), steps_done, final_kl, train_s)

    def _save_shards(self, steps_done: int, final_kl: float | None, train_s: float) -> None:
        """A sharded checkpoint (:mod:`~autocompress_opt.recover.checkpoint`): every process writes its
        shards of the weights and moments into one staging folder (named by rank 0), rank 0 adds
        ``state.json`` and the RNG states and swaps the folder in whole."""
        import torch.distributed.checkpoint as dcp
        from safetensors.torch import save_file
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        world, first = self.options.world_size, self.options.rank == 0
        name = _staging_dir(self.out).name
        staging = self.out.parent / _from_rank0(lambda: name, world)  # rank 0's name, on every process
        try:
            if first:
                (staging / STATE_DIR / SHARDS_DIR).mkdir(parents=True)
            _barrier(world)
            shards = {
                "model": get_model_state_dict(self.model),
                "optim": get_optimizer_state_dict(self.model, self.optimizer),
            }
            dcp.save(shards, checkpoint_id=str(staging / STATE_DIR / SHARDS_DIR))
            if first:
                names = [n for n, _ in self.model.named_parameters()]
                state = self._state(steps_done, final_kl, train_s, names) | {"weights": "sharded"}
                save_file(_rng_tensors(), str(staging / STATE_DIR / _STATE_TENSORS))
                (staging / STATE_DIR / _STATE_JSON).write_text(json.dumps(state, indent=2), encoding="utf-8")
                _replace_dir(staging, self.out)
        except BaseException:
            if first:
                shutil.rmtree(staging, ignore_errors=True)
            raise
        _barrier(world)

    def _state(self, steps_done: int, final_kl: float | None, train_s: float, names: list[str]) -> dict[str, Any]:
        """``state.json`` of a checkpoint after ``steps_done`` steps (module :mod:`.checkpoint`)."""
        return {
            "format": _STATE_FORMAT,
            "identity": self.identity,
            "step": steps_done,
            "tokens_seen": steps_done * self.recipe.batch_size * self.recipe.seq_len,
            "initial_kl": self.initial_kl,
            "final_kl": final_kl,
            "stream": self.stream.position(),
            "losses": self.losses,
            "train_s_total": train_s,
            "param_names": names,
            "scheduler": {
                "kind": "linear-warmup-cosine",
                "min_lr_ratio": MIN_LR_RATIO,
                "next_step": steps_done,
                "last_lr": learning_rate(self.recipe, steps_done - 1),
            },
        }

    def _gathered(self) -> tuple[Any, dict[str, torch.Tensor]]:
        """All processes gather the sharded student's full weights and AdamW state, one tensor at a
        time into rank 0's host memory (``cpu_offload``: no GPU holds the whole); rank 0 gets its
        host copy holding those weights and the moments by name (the others: ``None, {}``)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights = get_model_state_dict(self.model, options=full)
        optim = get_optimizer_state_dict(self.model, self.optimizer, options=full)
        if self.shadow is None:
            return None, {}
        self.shadow.load_state_dict(weights)
        state: dict[str, dict[str, torch.Tensor]] = optim["state"]  # type: ignore[assignment]
        moments = {
            f"optimizer/{name}/{key}": value.detach().to("cpu").contiguous()
            for name, per_param in state.items()
            for key, value in per_param.items()
        }
        return self.shadow, moments

    def _write(
        self, model: Any, moments: dict[str, torch.Tensor], steps_done: int, final_kl: float | None, train_s: float
    ) -> None:
        from autocompress_opt.prune.export import export_model

        tensors = moments | _rng_tensors()
        state = self._state(steps_done, final_kl, train_s, [name for name, _ in model.named_parameters()])
        card = self.card
        extras = {
            **card.get("extra", {}),
            "constraints": card.get("constraints", {}),
            "predicted_costs": card.get("predicted_costs", {}),
            "distillation": self._record(steps_done, final_kl, train_s),
        }
        arch = replace(self.student.architecture, name=self.out.name)
        staging = _staging_dir(self.out)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        try:
            export_model(
                model,
                arch,
                staging,
                parent=card.get("parent") or {"model": str(self.student_dir)},
                card=extras,
                tokenizer=self.student.tokenizer,
            )
            from safetensors.torch import save_file

            (staging / STATE_DIR).mkdir()
            save_file(tensors, str(staging / STATE_DIR / _STATE_TENSORS))
            (staging / STATE_DIR / _STATE_JSON).write_text(json.dumps(state, indent=2), encoding="utf-8")
            _replace_dir(staging, self.out)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise

    def _result(self, steps_done: int, final_kl: float | None, session_s: float) -> DistillResult:
        ran = steps_done - self.start_step
        return DistillResult(
            out_dir=self.out,
            recipe=self.recipe,
            teacher=self.identity["teacher"],
            student=self.identity["student"],
            steps_done=steps_done,
            tokens_seen=steps_done * self.recipe.batch_size * self.recipe.seq_len,
            resumed_from_step=self.start_step,
            initial_kl=self.initial_kl,
            final_kl=final_kl,
            losses=tuple(self.losses),
            train_s=session_s,
            seconds_per_step=session_s / ran if ran else None,
            tokens_per_s=ran * self.recipe.batch_size * self.recipe.seq_len / session_s if ran else None,
            data=self.identity["data"],
            eval_data=self.identity["eval_data"],
            device=str(self.device),
            precision=self.precision,
            gradient_checkpointing=self.options.gradient_checkpointing,
            kl_chunk=self.options.kl_chunk,
            data_passes=self.stream.passes,
            stream=self.stream.summary(),
        )


def _train_step(
    model: Any,
    teacher: Any,
    tokens: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    lr: float,
    recipe: DistillRecipe,
    precision: str,
    kl_chunk: int | None = None,
) -> float:
    """One AdamW update on ``tokens`` (B, L); returns the loss (nats, before the update).

    ``bf16-autocast`` and ``bf16-mixed`` run the forwards under bf16 autocast: over fp32 weights
    that is the bf16 compute; over the bf16 copies FSDP2's mixed-precision policy all-gathers it
    changes nothing but keeps autocast's float32 ops (softmax, norms) in float32."""
    autocast = torch.autocast(
        tokens.device.type, dtype=torch.bfloat16, enabled=precision in ("bf16-autocast", "bf16-mixed")
    )
    for group in optimizer.param_groups:
        group["lr"] = lr
    with torch.no_grad(), autocast:
        teacher_logits = teacher(input_ids=tokens, use_cache=False).logits  # (B, L, V)
    with autocast, router_balance(model, recipe.load_balance) as balance:
        student_logits = model(input_ids=tokens, use_cache=False).logits
    optimizer.zero_grad(set_to_none=True)
    loss = distillation_backward(student_logits, teacher_logits, recipe.temperature, chunk=kl_chunk, extra=balance())
    if recipe.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
    optimizer.step()
    return float(loss.detach())

"""Real timings for the ``torch-eager`` serving engine: transformers' eager forward pass.

The calibration step fits a cost model to what this module measures, so the contract is precise:

* :func:`build_torch_model` turns an :class:`Architecture` into the model export writes for it
  (:mod:`autocompress_opt.hf.build`, the decision :func:`~autocompress_opt.prune.slicing.materialize`
  uses): a plain model of the family when every layer is the same and the family's config can say
  it, else the package's heterogeneous ``AutocompressDeciLMForCausalLM``; random weights, eager
  attention, exactly the architecture's shapes and parameter count.
* :func:`time_prefill` and :func:`time_decode` time forward passes in **milliseconds**, under
  ``torch.inference_mode()``, after warm-up runs, and report the **median** over repeats (wall
  clocks on shared machines are noisy; the median ignores the odd descheduled run, and
  :attr:`Timing.noise` flags slow-downs long enough to hit most repeats).
* :func:`measure` does both for one architecture and returns a :class:`Timing` that records the
  exact setup (device, dtype, threads, batch, lengths).
* :func:`random_architectures` is the deterministic sweep of synthetic heterogeneous architectures
  that calibration times.

``torch`` and ``transformers`` are imported inside the functions that need them, so importing
this module stays cheap.
"""

from __future__ import annotations

import copy
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autocompress_opt.arch.architecture import Architecture, LayerSpec
from autocompress_opt.errors import ConfigError, check_int

if TYPE_CHECKING:
    import torch

__all__ = [
    "ENGINE",
    "Timing",
    "build_torch_model",
    "decode_samples_ms",
    "measure",
    "prefill_samples_ms",
    "random_architectures",
    "time_decode",
    "time_prefill",
]

ENGINE = "torch-eager"

# Token ids are drawn from a fixed generator so that every timing sees the same inputs.
_TOKEN_SEED = 0


# ----------------------------------------------------------------------------------- building
def build_torch_model(arch: Architecture, *, dtype: Any = None, device: Any = "cpu", seed: int = 0) -> Any:
    """The model export writes for ``arch``, with random weights and eager attention (module doc).

    :func:`autocompress_opt.hf.build.build_model` of ``arch.active()``: fully dropped layers are
    left out of the stack, as a pruning plan leaves them out of the exported model (an
    architecture whose every layer is dropped is built as it is: embedding, final norm, LM head).
    A uniform result is a plain model of ``arch.family`` when its config can express it, anything
    else the package's ``AutocompressDeciLMForCausalLM``; ``sum(p.numel() for p in
    model.parameters()) == arch.num_params``, and each layer's ``LayerSpec.window`` is built.

    Args:
        arch: the architecture to build.
        dtype: parameter dtype (a floating ``torch.dtype``); ``None`` means ``torch.float32``.
        device: where the parameters live (``"cpu"``, ``"cuda"``, a ``torch.device``).
        seed: the weights' seed (transformers' own initialisation: ``normal(0, 0.02)`` matrices,
            norms at their identity, zero biases). Same seed and device type → same weights.

    Returns:
        The model in ``eval()`` mode with gradients disabled. Raises :class:`ConfigError` for a
        non-floating ``dtype`` or an architecture export cannot write (attention layers with
        different ``head_dim``; two sliding-window sizes).
    """
    from autocompress_opt.hf.build import build_model

    exported = arch.active() if arch.num_active_layers else arch
    return build_model(exported, dtype=dtype, device=device, seed=seed, attn_implementation="eager")


# ------------------------------------------------------------------------------------ timing
def time_prefill(model: Any, *, batch: int, prompt_len: int, repeats: int = 5, warmup: int = 1) -> float:
    """Median wall time in ms of one prefill: a forward over ``batch × prompt_len`` token ids.

    What is timed: one ``model(input_ids, use_cache=True, logits_to_keep=1)`` call, which builds
    a fresh ``DynamicCache`` as a server does and, like ``transformers``' ``generate``, projects
    only the last position onto the vocabulary. The device is synchronised before and after.
    Not timed: making the inputs and the ``warmup`` runs. Inputs are fixed random token ids.
    """
    samples = prefill_samples_ms(model, batch=batch, prompt_len=prompt_len, repeats=repeats, warmup=warmup)
    return statistics.median(samples)


def prefill_samples_ms(model: Any, *, batch: int, prompt_len: int, repeats: int = 5, warmup: int = 1) -> list[float]:
    """The ``repeats`` individual timings (ms, in run order) behind :func:`time_prefill`."""
    import torch

    _require_positive(batch=batch, prompt_len=prompt_len, repeats=repeats)
    _require_non_negative(warmup=warmup)
    ids = _token_ids(model, batch, prompt_len)  # (batch, time)
    with torch.inference_mode():
        times_ms = [_timed(model, input_ids=ids, use_cache=True, logits_to_keep=1) for _ in range(warmup + repeats)]
    return times_ms[warmup:]


def time_decode(
    model: Any, *, batch: int, context_len: int, steps: int = 8, repeats: int = 3, warmup: int = 1
) -> float:
    """Median wall time in ms of one decode step: one new token per sequence, with a KV cache.

    Setup (not timed): one prefill of ``batch × context_len`` tokens builds a ``DynamicCache``.
    Each of ``warmup + repeats`` rounds starts from a fresh deep copy of that cache and runs
    ``steps`` single-token forwards feeding it, so step ``k`` (from 0) attends to
    ``context_len + k + 1`` positions in every round. Each step is timed alone (device
    synchronised around it); the result is the median over the ``steps × repeats`` timed steps,
    i.e. the cost of a step at about ``context_len + steps / 2`` tokens of context. Warm-up
    rounds are discarded.
    """
    samples = decode_samples_ms(
        model, batch=batch, context_len=context_len, steps=steps, repeats=repeats, warmup=warmup
    )
    return statistics.median(samples)


def decode_samples_ms(
    model: Any, *, batch: int, context_len: int, steps: int = 8, repeats: int = 3, warmup: int = 1
) -> list[float]:
    """The ``steps × repeats`` individual step timings (ms, in run order) behind :func:`time_decode`."""
    import torch

    _require_positive(batch=batch, context_len=context_len, steps=steps, repeats=repeats)
    _require_non_negative(warmup=warmup)
    ids = _token_ids(model, batch, context_len + steps)
    context, new_tokens = ids[:, :context_len], ids[:, context_len:]  # (batch, time)
    step_ms: list[float] = []
    with torch.inference_mode():
        prefilled = model(input_ids=context, use_cache=True, logits_to_keep=1).cache
        for _ in range(warmup + repeats):
            cache = copy.deepcopy(prefilled)
            for k in range(steps):
                token = new_tokens[:, k : k + 1]  # (batch, 1)
                step_ms.append(_timed(model, input_ids=token, cache=cache, use_cache=True))
    return step_ms[warmup * steps :]


def _timed(model: Any, **inputs: Any) -> float:
    """Milliseconds of one ``model(**inputs)`` call, with the device synchronised before and after."""
    device = inputs["input_ids"].device
    _synchronize(device)
    start = time.perf_counter()
    model(**inputs)
    _synchronize(device)
    return (time.perf_counter() - start) * 1e3


def _synchronize(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def _token_ids(model: Any, batch: int, length: int) -> torch.Tensor:
    """Fixed random token ids, shape (batch, length), on the model's device."""
    import torch

    generator = torch.Generator().manual_seed(_TOKEN_SEED)
    ids = torch.randint(0, model.config.vocab_size, (batch, length), generator=generator)
    return ids.to(next(model.parameters()).device)


def _require_positive(**values: int) -> None:
    for name, value in values.items():
        check_int(value, name)


def _require_non_negative(**values: int) -> None:
    for name, value in values.items():
        check_int(value, name, minimum=0)


@dataclass(frozen=True)
class Timing:
    """One measurement of an architecture on the ``torch-eager`` engine, with its exact setup.

    Attributes:
        prefill_ms: median ms of one prefill of ``batch × prompt_len`` tokens (:func:`time_prefill`).
        decode_ms_per_token: median ms of one decode step, which yields one token per sequence
            of the batch, at ``decode_context`` tokens of context (:func:`time_decode`).
        engine: always ``"torch-eager"``.
        device / dtype: where and in what precision it ran (``"cpu"``, ``"float32"``).
        threads: ``torch.get_num_threads()`` during the measurement.
        batch, prompt_len, decode_context, decode_steps: the workload.
        prefill_repeats, decode_repeats, warmup: how many runs were timed and discarded.
        prefill_samples_ms / decode_samples_ms: the individual timings behind the medians.
    """

    prefill_ms: float
    decode_ms_per_token: float
    engine: str
    device: str
    dtype: str
    threads: int
    batch: int
    prompt_len: int
    decode_context: int
    decode_steps: int
    prefill_repeats: int
    decode_repeats: int
    warmup: int
    prefill_samples_ms: tuple[float, ...] = ()
    decode_samples_ms: tuple[float, ...] = ()

    @property
    def noise(self) -> float:
        """Largest max/min ratio of the prefill or decode samples (1.0 = perfectly steady).

        A shared machine can slow everything down for seconds at a time, longer than the
        median can hide; calibration can re-measure points whose noise is high.
        """
        ratios = [max(s) / min(s) for s in (self.prefill_samples_ms, self.decode_samples_ms) if s and min(s) > 0]
        return max(ratios, default=1.0)


def measure(
    arch: Architecture,
    *,
    batch: int = 1,
    prompt_len: int = 128,
    decode_context: int = 128,
    decode_steps: int = 8,
    prefill_repeats: int = 5,
    decode_repeats: int = 3,
    warmup: int = 1,
    dtype: Any = None,
    device: Any = "cpu",
    seed: int = 0,
) -> Timing:
    """Build ``arch`` once (:func:`build_torch_model`) and time its prefill and decode.

    Building is not timed. ``dtype=None`` means ``torch.float32``. The values are wall-clock
    medians, so they vary from run to run; everything else in the :class:`Timing` is exact.
    """
    import torch

    dtype = torch.float32 if dtype is None else dtype
    model = build_torch_model(arch, dtype=dtype, device=device, seed=seed)
    prefill = prefill_samples_ms(model, batch=batch, prompt_len=prompt_len, repeats=prefill_repeats, warmup=warmup)
    decode = decode_samples_ms(
        model, batch=batch, context_len=decode_context, steps=decode_steps, repeats=decode_repeats, warmup=warmup
    )
    return Timing(
        prefill_ms=statistics.median(prefill),
        decode_ms_per_token=statistics.median(decode),
        engine=ENGINE,
        device=str(torch.device(device)),
        dtype=str(dtype).removeprefix("torch."),
        threads=torch.get_num_threads(),
        batch=batch,
        prompt_len=prompt_len,
        decode_context=decode_context,
        decode_steps=decode_steps,
        prefill_repeats=prefill_repeats,
        decode_repeats=decode_repeats,
        warmup=warmup,
        prefill_samples_ms=tuple(prefill),
        decode_samples_ms=tuple(decode),
    )


# ------------------------------------------------------------------------- calibration sweep
def random_architectures(
    n: int,
    *,
    seed: int,
    vocab_size: int = 32000,
    hidden_sizes: Sequence[int] = (256, 384, 512, 768),
    num_layers: tuple[int, int] = (2, 12),
    head_dim: int = 64,
    ffn_ratio: tuple[float, float] = (0.5, 4.0),
    drop_prob: float = 0.1,
    uniform_prob: float = 1 / 3,
) -> list[Architecture]:
    """``n`` synthetic llama architectures for calibrating a cost model; same seed → same list.

    Each architecture draws a depth in ``num_layers`` (inclusive) and a hidden size from
    ``hidden_sizes``. With probability ``uniform_prob`` all its layers share one drawn shape;
    otherwise every layer draws its own: ``1..hidden/head_dim`` query heads of ``head_dim``
    channels, KV heads a random divisor of the heads, an FFN width that is a multiple of 64 in
    ``ffn_ratio × hidden``, and attention and FFN each dropped with probability ``drop_prob``
    (both dropped = a removed layer; at least one layer always computes something).

    The defaults keep one :func:`measure` call (prefill of 128 tokens, decode at context 128)
    within a few seconds on a 2-core CPU.
    """
    _require_non_negative(n=n)
    _require_positive(vocab_size=vocab_size, head_dim=head_dim)
    _check_sweep(hidden_sizes, num_layers, head_dim, ffn_ratio, drop_prob, uniform_prob)
    rng = random.Random(seed)
    archs = []
    for i in range(n):
        hidden = rng.choice(tuple(hidden_sizes))
        depth = rng.randint(*num_layers)
        draw = lambda drops, hidden=hidden: _random_layer(rng, hidden, head_dim, ffn_ratio, drops)
        if rng.random() < uniform_prob:
            layers = (draw(0.0),) * depth
        else:
            layers = tuple(draw(drop_prob) for _ in range(depth))
        if all(layer.is_noop for layer in layers):
            layers = (draw(0.0),) + layers[1:]
        archs.append(Architecture(vocab_size=vocab_size, hidden_size=hidden, layers=layers, name=f"random-{seed}-{i}"))
    return archs


def _random_layer(
    rng: random.Random, hidden: int, head_dim: int, ffn_ratio: tuple[float, float], drop_prob: float
) -> LayerSpec:
    heads = rng.randint(1, hidden // head_dim)
    kv_heads = rng.choice([d for d in range(1, heads + 1) if heads % d == 0])
    lo, hi = max(1, round(ffn_ratio[0] * hidden / 64)), max(1, int(ffn_ratio[1] * hidden / 64))
    ffn_width = 64 * rng.randint(lo, max(lo, hi))
    attention, ffn = rng.random() >= drop_prob, rng.random() >= drop_prob
    return LayerSpec(
        attention=attention,
        num_heads=heads if attention else 0,
        num_kv_heads=kv_heads if attention else 0,
        head_dim=head_dim if attention else 0,
        ffn=ffn,
        ffn_width=ffn_width if ffn else 0,
    )


def _check_sweep(
    hidden_sizes: Sequence[int],
    num_layers: tuple[int, int],
    head_dim: int,
    ffn_ratio: tuple[float, float],
    drop_prob: float,
    uniform_prob: float,
) -> None:
    if not hidden_sizes or any(not isinstance(h, int) or h < head_dim for h in hidden_sizes):
        raise ConfigError(f"hidden_sizes must be ints >= head_dim={head_dim}, got {tuple(hidden_sizes)!r}")
    if not 1 <= num_layers[0] <= num_layers[1]:
        raise ConfigError(f"num_layers must be (min, max) with 1 <= min <= max, got {num_layers!r}")
    if not 0 < ffn_ratio[0] <= ffn_ratio[1]:
        raise ConfigError(f"ffn_ratio must be (low, high) with 0 < low <= high, got {ffn_ratio!r}")
    for name, p in (("drop_prob", drop_prob), ("uniform_prob", uniform_prob)):
        if not 0.0 <= p <= 1.0:
            raise ConfigError(f"{name} must be a probability in [0, 1], got {p!r}")

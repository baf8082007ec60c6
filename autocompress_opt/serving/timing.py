"""Real timings for the ``torch-eager`` serving engine: transformers' eager forward pass.

The calibration step fits a cost model to what this module measures, so the contract is precise:

* :func:`build_torch_model` turns an :class:`Architecture` into a real ``LlamaForCausalLM`` with
  random weights and exactly the architecture's shapes, heterogeneous layers included.
* :func:`time_prefill` and :func:`time_decode` time forward passes in **milliseconds**, under
  ``torch.inference_mode()``, after warm-up runs, and report the **median** over repeats (wall
  clocks on shared machines are noisy; the median ignores the odd descheduled run, and
  :attr:`Timing.noise` flags slow-downs long enough to hit most repeats).
* :func:`measure` does both for one architecture and returns a :class:`Timing` that records the
  exact setup (device, dtype, threads, batch, lengths).
* :func:`random_architectures` is the deterministic sweep of synthetic heterogeneous architectures
  that calibration times.

Every family (llama, mistral, qwen2, qwen3) is timed as a Llama-shaped model: the engine's cost
depends on the shapes of the matrix products and the KV cache, not on which family's code runs
them. Biases are modelled exactly; Qwen3's per-head QK-norm (``2·head_dim`` weights a layer) is
not, so for ``qk_norm`` architectures the built model has that many fewer parameters.

``torch`` and ``transformers`` are imported inside the functions that need them, so importing
this module stays cheap.
"""

from __future__ import annotations

import copy
import functools
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autocompress_opt.arch.architecture import Architecture, LayerSpec
from autocompress_opt.errors import ConfigError

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

# Weight init: normal(0, 0.02), transformers' default ``initializer_range`` for Llama (and GPT-2).
# Values do not change the timing; they only need to keep activations finite.
_INIT_STD = 0.02

# Token ids are drawn from a fixed generator so that every timing sees the same inputs.
_TOKEN_SEED = 0


# ----------------------------------------------------------------------------------- building
def build_torch_model(arch: Architecture, *, dtype: Any = None, device: Any = "cpu", seed: int = 0) -> Any:
    """Build a random-weight ``LlamaForCausalLM`` (eager attention) with exactly ``arch``'s shapes.

    Each layer gets its own heads, KV heads, head size and FFN width. A layer without attention
    (``LayerSpec.attention=False``) has neither attention nor ``input_layernorm``; one without an
    FFN has neither MLP nor ``post_attention_layernorm``; a fully dropped layer (``is_noop``) is
    removed from the stack. KV-cache slots are numbered over the layers that have attention, so
    ``DynamicCache`` and the positions it implies stay correct when layer 0 has no attention.

    For llama, mistral and qwen2 architectures ``sum(p.numel() for p in model.parameters()) ==
    arch.num_params``; qwen3's QK-norm weights are not built (see the module docstring). Every
    layer attends to the whole context: ``LayerSpec.window`` is not built (the calibration sweep,
    :func:`random_architectures`, has no windows).

    Args:
        arch: the architecture to build.
        dtype: parameter dtype (a ``torch.dtype``); ``None`` means ``torch.float32``.
        device: where the parameters live (``"cpu"``, ``"cuda"``, a ``torch.device``).
        seed: weights are ``normal(0, 0.02)`` drawn from a generator seeded with ``seed``; norms
            are ones and biases zeros. Same seed and device type → same weights.

    Returns:
        The model in ``eval()`` mode with gradients disabled.
    """
    import torch
    from transformers import LlamaForCausalLM

    dtype = torch.float32 if dtype is None else dtype
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ConfigError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    device = torch.device(device)
    kept = [layer for layer in arch.layers if not layer.is_noop]
    config = _llama_config(arch, num_layers=len(kept), layer=_reference_layer(arch))

    # Build on the meta device (no memory, no init), then allocate once and fill deterministically.
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
        model.model.layers = torch.nn.ModuleList(_decoder_layers(arch, config, kept))
    model.to(dtype).to_empty(device=device)
    _reset_rotary_embeddings(model, device)
    if arch.tie_embeddings:  # to_empty() allocates each module's tensors separately: re-tie
        model.lm_head.weight = model.model.embed_tokens.weight
    _init_weights(model, seed=seed, device=device)
    return model.eval().requires_grad_(False)


def _reference_layer(arch: Architecture) -> LayerSpec:
    """Shapes for the model-level config: the first layer with attention and the first with an FFN."""
    attn = next((layer for layer in arch.layers if layer.attention), None)
    ffn = next((layer for layer in arch.layers if layer.ffn), None)
    return LayerSpec(
        attention=True,
        num_heads=attn.num_heads if attn else 1,
        num_kv_heads=attn.num_kv_heads if attn else 1,
        head_dim=attn.head_dim if attn else arch.hidden_size,
        ffn=True,
        ffn_width=ffn.ffn_width if ffn else 1,
    )


def _llama_config(arch: Architecture, *, num_layers: int, layer: LayerSpec) -> Any:
    """A ``LlamaConfig`` with the global shapes of ``arch`` and the per-layer shapes of ``layer``."""
    from transformers import LlamaConfig

    kwargs: dict[str, Any] = {}
    if arch.max_context:
        kwargs["max_position_embeddings"] = arch.max_context
    config = LlamaConfig(
        vocab_size=arch.vocab_size,
        hidden_size=arch.hidden_size,
        num_hidden_layers=max(num_layers, 1),
        # LlamaConfig insists that hidden_size % num_attention_heads == 0, which pruned heads
        # break (head_dim is explicit, so the check is moot): validate with 1 head, then set.
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=layer.head_dim,
        intermediate_size=layer.ffn_width,
        tie_word_embeddings=arch.tie_embeddings,
        attention_bias=arch.qkv_bias or arch.o_bias,
        mlp_bias=arch.mlp_bias,
        bos_token_id=None,
        eos_token_id=None,
        attn_implementation="eager",
        **kwargs,
    )
    config.num_attention_heads = layer.num_heads
    config.num_key_value_heads = layer.num_kv_heads
    config.num_hidden_layers = num_layers
    return config


def _layer_config(config: Any, layer: LayerSpec) -> Any:
    layer_config = copy.deepcopy(config)
    if layer.attention:
        layer_config.num_attention_heads = layer.num_heads
        layer_config.num_key_value_heads = layer.num_kv_heads
        layer_config.head_dim = layer.head_dim
    if layer.ffn:
        layer_config.intermediate_size = layer.ffn_width
    return layer_config


def _decoder_layers(arch: Architecture, config: Any, kept: Sequence[LayerSpec]) -> list[Any]:
    """One decoder layer per kept spec; attention layers number their KV-cache slots 0, 1, ..."""
    layers, cache_idx = [], 0
    for layer in kept:
        layers.append(_make_decoder_layer(arch, config, layer, cache_idx))
        cache_idx += layer.attention
    return layers


def _make_decoder_layer(arch: Architecture, config: Any, layer: LayerSpec, cache_idx: int) -> Any:
    layer_config = _layer_config(config, layer)
    module = _pruned_decoder_layer_class()(layer_config, layer_idx=cache_idx)
    if not layer.attention:
        module.self_attn = module.input_layernorm = None
    else:
        _drop_biases(module.self_attn, qkv=not arch.qkv_bias, o=not arch.o_bias)
        if layer.head_dim != config.head_dim:
            from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

            module.rotary_emb = LlamaRotaryEmbedding(layer_config)
    if not layer.ffn:
        module.mlp = module.post_attention_layernorm = None
    return module


@functools.cache
def _pruned_decoder_layer_class() -> type:
    """Defined on first use so that importing this module does not import transformers."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    class PrunedLlamaDecoderLayer(LlamaDecoderLayer):
        """``LlamaDecoderLayer`` whose attention or MLP may be ``None`` (DeciLM ``no_op`` sub-blocks).

        An absent sub-block adds nothing to the residual stream and has no norm. A layer whose
        head size differs from the model's has its own ``rotary_emb`` for its cos/sin.
        """

        def __init__(self, config: Any, layer_idx: int) -> None:
            super().__init__(config, layer_idx)
            self.rotary_emb: torch.nn.Module | None = None

        def forward(  # type: ignore[override]
            self,
            hidden_states: torch.Tensor,  # (batch, time, hidden)
            attention_mask: torch.Tensor | None = None,
            position_ids: torch.Tensor | None = None,
            cache: Any = None,
            use_cache: bool | None = False,
            position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
            **kwargs: Any,
        ) -> torch.Tensor:
            if self.self_attn is not None:
                if self.rotary_emb is not None:
                    position_embeddings = self.rotary_emb(hidden_states, position_ids=position_ids)
                attn_out, _ = self.self_attn(
                    hidden_states=self.input_layernorm(hidden_states),
                    attention_mask=attention_mask,
                    position_ids=position_ids,
                    cache=cache,
                    use_cache=use_cache,
                    position_embeddings=position_embeddings,
                    **kwargs,
                )
                hidden_states = hidden_states + attn_out
            if self.mlp is not None:
                hidden_states = hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))
            return hidden_states

    return PrunedLlamaDecoderLayer


def _drop_biases(attn: Any, *, qkv: bool, o: bool) -> None:
    """Remove the biases the family does not have (qwen2: q, k, v biased, o not)."""
    names = (["q_proj", "k_proj", "v_proj"] if qkv else []) + (["o_proj"] if o else [])
    for name in names:
        getattr(attn, name).bias = None


def _reset_rotary_embeddings(model: Any, device: Any) -> None:
    """Rebuild every rotary embedding: ``to_empty`` left their ``inv_freq`` buffers uninitialised."""
    import torch
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    for name, module in list(model.named_modules()):
        if isinstance(module, LlamaRotaryEmbedding):
            parent_name, _, child = name.rpartition(".")
            with torch.device(device):
                setattr(model.get_submodule(parent_name), child, LlamaRotaryEmbedding(module.config))


def _init_weights(model: Any, *, seed: int, device: Any) -> None:
    """normal(0, 0.02) matrices, unit norms, zero biases; a tied matrix is drawn once."""
    import torch
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    generator = torch.Generator(device=device).manual_seed(seed)
    seen: set[int] = set()
    with torch.no_grad():
        for module in model.modules():
            for name, param in module.named_parameters(recurse=False):
                if id(param) in seen:
                    continue
                seen.add(id(param))
                if isinstance(module, LlamaRMSNorm):
                    param.fill_(1.0)
                elif name == "bias":
                    param.zero_()
                else:
                    param.normal_(0.0, _INIT_STD, generator=generator)


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
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name} must be a positive int, got {value!r}")


def _require_non_negative(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"{name} must be a non-negative int, got {value!r}")


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

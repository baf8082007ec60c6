"""A per-layer block library: every engine-legal variant of each parent layer, scored by how much
replacing that one layer with it moves the model's next-token distribution (issue 49, item 2).

Source: NVIDIA's Puzzle (Bercovich et al., "Puzzle: Distillation-Based NAS for Inference-Optimized
LLMs", arXiv 2411.19146, §3): a library of per-layer block variants, each scored by *replace-one*
KL divergence — the parent with only that layer replaced, every other layer at full size — then an
exact solver picks one variant per layer under the hardware limits
(:mod:`autocompress_opt.search.inner.block_solver`).

Variants of a dense parent layer with ``G`` KV heads of ``R`` query heads and an FFN of ``F``
channels (:func:`layer_variants`): attention kept with ``g ∈ 1..G`` KV groups of ``r ∈ 1..R``
query heads, or dropped; the FFN at every multiple of ``ffn_step`` up to ``F`` (256 by default:
the DeciLM export's multiple, :data:`~autocompress_opt.prune.export.DECILM_FFN_MULTIPLE`), or
dropped; any attention with any FFN, and the layer skipped entirely. Which heads and channels a
width keeps is the importance order's (:func:`~autocompress_opt.prune.plan.plan_pruning`).

What is measured, per layer ``i`` (``scoring="replace-one-kl"``, mean per-position
``KL(parent ‖ variant)`` in nats on the calibration rows): the full layer, every attention variant
with the full FFN, every FFN variant with the full attention, and the layer skipped — ``G·R + W + 2``
passes for ``W`` FFN widths, instead of one per combination. A combination's score
(:meth:`BlockLibrary.score`) is the sum of its two sub-blocks' measured increases over the full
layer (the sub-blocks' effects taken as additive, as Puzzle's decoupled sub-block library does);
the skipped layer's is measured. At a ``hidden_size`` below the parent's, every pass prunes the
hidden channels too (the parent's most important ones kept, in every layer), the reference
distribution stays the parent's, and scores are increases over that hidden-pruned model's own KL.

``scoring="replace-one-kl+refit"`` is recovery-aware for the FFN: a narrowed FFN's down projection is
refit by least squares to reproduce the whole FFN's output on the calibration tokens at that layer
(the kept channels' weights, :func:`_refit_rows`) before its KL is measured — in-sample, on the rows
that score it, so it is optimistic, and refused with fewer than 4 tokens per FFN channel (fewer fit
those rows exactly); every other variant is scored as without it.

Cost: every pass reuses the parent's hidden states at the replaced layer's input (one capture
pass; layers before it return the saved tensor, as :func:`~autocompress_opt.prune.importance`'s
skip loss does), so it runs only the suffix from the replaced layer on, and several variants run
together as one batch (the rows repeated, per-row masks). Built once per (parent, data, hidden
size, scoring, FFN step, importance, weights' dtype) and cached on disk as JSON
(:mod:`autocompress_opt.cache`).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autocompress_opt.arch.architecture import Architecture, LayerSpec
from autocompress_opt.cache import cache_key, fetch
from autocompress_opt.errors import ConfigError, check_choice, check_int
from autocompress_opt.hf.adapters import FamilyAdapter, LayerParts, adapter_for, architecture_mismatch, layer_input
from autocompress_opt.prune.export import DECILM_FFN_MULTIPLE
from autocompress_opt.prune.importance import Importance, tokens_id
from autocompress_opt.prune.plan import plan_pruning

if TYPE_CHECKING:
    import torch

__all__ = [
    "CACHE_VERSION",
    "SCORINGS",
    "BlockLibrary",
    "BlockVariant",
    "LibraryMeta",
    "build_block_library",
    "layer_variants",
    "library_path",
]

# How a variant is scored (module doc); part of the cache key.
SCORINGS: tuple[str, ...] = ("replace-one-kl", "replace-one-kl+refit")
# The version of the scores' computation, part of every cache key: bump it when the numbers change.
CACHE_VERSION = "block-library/1"
_FORMAT = "autocompress-block-library/1"


# ----------------------------------------------------------------------------- variants
@dataclass(frozen=True, order=True)
class BlockVariant:
    """One variant of a parent layer: ``kv_heads`` KV groups of ``q_per_kv`` query heads each (both
    0: attention dropped) and an FFN of ``ffn_width`` channels (0: dropped). All zero: skipped."""

    kv_heads: int
    q_per_kv: int
    ffn_width: int

    def __post_init__(self) -> None:
        for name in ("kv_heads", "q_per_kv", "ffn_width"):
            check_int(getattr(self, name), f"BlockVariant.{name}", minimum=0)
        if (self.kv_heads == 0) != (self.q_per_kv == 0):
            raise ConfigError(
                f"BlockVariant: kv_heads={self.kv_heads} and q_per_kv={self.q_per_kv} must both be 0 "
                "(attention dropped) or both positive"
            )

    @property
    def attention(self) -> bool:
        return self.kv_heads > 0

    @property
    def ffn(self) -> bool:
        return self.ffn_width > 0

    @property
    def num_heads(self) -> int:
        return self.kv_heads * self.q_per_kv

    @property
    def skipped(self) -> bool:
        return not (self.attention or self.ffn)

    def spec(self, parent: LayerSpec) -> LayerSpec:
        """This variant of ``parent`` as a :class:`LayerSpec` (the parent's head size and window)."""
        return LayerSpec(
            attention=self.attention,
            num_heads=self.num_heads,
            num_kv_heads=self.kv_heads,
            head_dim=parent.head_dim,
            ffn=self.ffn,
            ffn_width=self.ffn_width,
            window=parent.window,
        )

    def label(self) -> str:
        """``"3x3/1536"``, ``"-/768"``, ``"2x3/-"``, ``"skip"``."""
        if self.skipped:
            return "skip"
        attn = f"{self.kv_heads}x{self.q_per_kv}" if self.attention else "-"
        return f"{attn}/{self.ffn_width if self.ffn else '-'}"


def _full(parent: LayerSpec) -> BlockVariant:
    r = parent.num_heads // parent.num_kv_heads if parent.attention else 0
    return BlockVariant(parent.num_kv_heads, r, parent.ffn_width)


def _widths(parent: LayerSpec, ffn_step: int) -> list[int]:
    """The kept FFN widths of ``parent``: the multiples of ``ffn_step`` up to its width, and its width."""
    if not parent.ffn:
        return []
    return sorted({*range(ffn_step, parent.ffn_width + 1, ffn_step), parent.ffn_width})


def _attentions(parent: LayerSpec) -> list[tuple[int, int]]:
    if not parent.attention:
        return []
    r_max = parent.num_heads // parent.num_kv_heads
    return [(g, r) for g in range(1, parent.num_kv_heads + 1) for r in range(1, r_max + 1)]


def layer_variants(parent: Architecture, ffn_step: int = DECILM_FFN_MULTIPLE) -> list[list[BlockVariant]]:
    """Every variant of each parent layer (module doc), sorted; the full layer and the skipped one
    included. Raises :class:`ConfigError` for a parent with mixture-of-experts or Mamba-2 layers
    (dense layers only) or a bad ``ffn_step``."""
    check_int(ffn_step, "ffn_step")
    sparse = [i for i, s in enumerate(parent.layers) if s.moe is not None or s.mamba is not None]
    if sparse:
        raise ConfigError(f"the block library takes dense layers only; layers {sparse} are MoE or Mamba-2")
    out = []
    for spec in parent.layers:
        attn = [(0, 0), *_attentions(spec)]
        ffn = [0, *_widths(spec, ffn_step)]
        out.append(sorted(BlockVariant(g, r, w) for g, r in attn for w in ffn))
    return out


def _measured(spec: LayerSpec, ffn_step: int) -> list[BlockVariant]:
    """The variants measured for ``spec`` (module doc): the full layer first, then each attention
    variant with the full FFN, each FFN variant with the full attention, and the layer skipped."""
    full = _full(spec)
    attn = [BlockVariant(g, r, full.ffn_width) for g, r in [(0, 0), *_attentions(spec)]]
    ffn = [BlockVariant(full.kv_heads, full.q_per_kv, w) for w in [0, *_widths(spec, ffn_step)]]
    out = [full]
    for v in [*attn, *ffn, BlockVariant(0, 0, 0)]:
        if v not in out:
            out.append(v)
    return out


# ------------------------------------------------------------------------------ library
@dataclass(frozen=True)
class LibraryMeta:
    """Where a library came from: the parent's and the data's identity, the importance that chose
    the kept channels, the rows (``num_sequences × seq_len``), the weights' dtype, the FFN step,
    ``scoring`` and the build's wall time (``build_seconds``) and forward passes."""

    model_id: str
    data_id: str
    importance_id: str
    scoring: str
    hidden_size: int
    ffn_step: int
    num_sequences: int
    seq_len: int
    dtype: str
    build_seconds: float = float("nan")
    passes: int = 0


@dataclass(frozen=True, eq=False)
class BlockLibrary:
    """The measured replace-one KL (nats) of each parent layer's variants (module doc).

    ``measured[i]`` maps the variants measured for layer ``i`` to their KL; :meth:`score` composes
    every variant of :func:`layer_variants` from them. Pure data; saves as one JSON file.
    """

    parent: Architecture
    measured: tuple[dict[BlockVariant, float], ...]
    meta: LibraryMeta
    _memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def hidden_size(self) -> int:
        return self.meta.hidden_size

    @property
    def num_layers(self) -> int:
        return len(self.measured)

    def variants(self, i: int) -> list[BlockVariant]:
        """Every variant of layer ``i`` the library scores (sorted)."""
        if "variants" not in self._memo:
            self._memo["variants"] = layer_variants(self.parent, self.meta.ffn_step)
        return list(self._memo["variants"][i])

    def base_kl(self, i: int) -> float:
        """Layer ``i``'s full variant's KL: 0 up to rounding at the parent's hidden size, the
        hidden-pruned model's KL below it."""
        return self.measured[i][_full(self.parent.layers[i])]

    def score(self, i: int, variant: BlockVariant) -> float:
        """The increase of KL (nats) when layer ``i`` alone becomes ``variant``: measured where it
        was (the full layer: 0, the skipped layer, one sub-block changed), else the sum of its
        attention's and its FFN's increases. Raises :class:`ConfigError` for a variant the library
        does not hold."""
        if not 0 <= i < self.num_layers:
            raise ConfigError(f"layer {i} is not in the library's {self.num_layers} layers")
        measured, full = self.measured[i], _full(self.parent.layers[i])
        base = measured[full]
        if variant in measured:
            return measured[variant] - base
        attn = BlockVariant(variant.kv_heads, variant.q_per_kv, full.ffn_width)
        ffn = BlockVariant(full.kv_heads, full.q_per_kv, variant.ffn_width)
        if attn not in measured or ffn not in measured:
            raise ConfigError(
                f"layer {i} has no variant {variant.label()} in the library (FFN step {self.meta.ffn_step}); "
                f"its variants: {', '.join(v.label() for v in self.variants(i))}"
            )
        return (measured[attn] - base) + (measured[ffn] - base)

    def table(self, i: int) -> dict[BlockVariant, float]:
        """:meth:`score` of every variant of layer ``i``."""
        return {v: self.score(i, v) for v in self.variants(i)}

    def spread(self, variant: Callable[[LayerSpec], BlockVariant] | None = None) -> dict[str, float]:
        """How much one kind of cut hurts across layers: min, max and max/min of the layers' scores
        for ``variant`` (a function of the parent layer; default the layer skipped)."""
        pick = variant or (lambda spec: BlockVariant(0, 0, 0))
        scores = [self.score(i, pick(spec)) for i, spec in enumerate(self.parent.layers)]
        low, high = min(scores), max(scores)
        return {"min": low, "max": high, "ratio": high / low if low > 0 else float("inf")}

    # ------------------------------------------------------------------- persistence
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": _FORMAT,
            "meta": asdict(self.meta),
            "architecture": self.parent.to_dict(),
            "layers": [
                [[v.kv_heads, v.q_per_kv, v.ffn_width, kl] for v, kl in sorted(m.items())] for m in self.measured
            ],
        }

    @classmethod
    def from_dict(cls, data: Any) -> BlockLibrary:
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            got = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ConfigError(f"not a block library (format {got!r}, expected {_FORMAT!r})")
        measured = tuple({BlockVariant(g, r, w): float(kl) for g, r, w, kl in layer} for layer in data["layers"])
        return cls(Architecture.from_dict(data["architecture"]), measured, LibraryMeta(**data["meta"]))

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=1), encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> BlockLibrary:
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read a block library at {str(path)!r}: {exc}") from None
        return cls.from_dict(data)


def library_path(cache_dir: str | Path, meta: LibraryMeta) -> Path:
    """The cache file of a library of ``meta``'s identity (every field but the build's own numbers)."""
    parts = {k: v for k, v in asdict(meta).items() if k not in ("build_seconds", "passes")}
    return Path(cache_dir) / f"block-library-{cache_key(CACHE_VERSION, parts)}.json"


# -------------------------------------------------------------------------------- build
def build_block_library(
    model: Any,
    importance: Importance,
    tokens: torch.Tensor,
    *,
    hidden_size: int | None = None,
    ffn_step: int = DECILM_FFN_MULTIPLE,
    scoring: str = "replace-one-kl",
    model_id: str | None = None,
    data_id: str | None = None,
    cache_dir: str | Path | None = None,
    batch_tokens: int = 2048,
    adapter: FamilyAdapter | None = None,
    progress: bool = False,
) -> tuple[BlockLibrary, bool]:
    """The block library of ``model`` at ``hidden_size`` (default the parent's) on calibration
    ``tokens`` ``(n, T)``; returns ``(library, was_cached)``.

    ``importance`` (of this parent) decides which heads, channels and hidden channels a variant
    keeps. ``batch_tokens``: most tokens in one forward pass (variants × rows × T; at least one
    variant's rows). With ``cache_dir`` the library is read from, or computed once and published
    to, :func:`library_path` (keyed by ``model_id``, default ``config._name_or_path``, ``data_id``,
    default :func:`~autocompress_opt.prune.importance.tokens_id`, the importance's identity, the
    hidden size, ``scoring``, ``ffn_step`` and the weights' dtype). The model's weights are not
    changed and no hook is left behind. Raises :class:`ConfigError` for an unknown scoring, a bad
    hidden size or step, importance of another architecture, MoE / Mamba-2 layers or bad tokens.
    """
    from autocompress_opt.data.textdata import check_token_ids
    from autocompress_opt.hf.device import dtype_name

    adapter = adapter or adapter_for(model)
    parent = adapter.architecture(model)
    check_choice(scoring, "block library scoring", SCORINGS)
    hidden = parent.hidden_size if hidden_size is None else check_int(hidden_size, "hidden_size")
    if hidden > parent.hidden_size:
        raise ConfigError(f"hidden_size={hidden} exceeds the parent's {parent.hidden_size}")
    check_int(batch_tokens, "batch_tokens")
    layer_variants(parent, ffn_step)  # dense layers, a valid step
    mismatch = architecture_mismatch(importance.architecture, parent)
    if mismatch:
        raise ConfigError(f"the importance scores were computed for another architecture ({mismatch})")
    check_token_ids(tokens, "tokens", parent.vocab_size)
    widest = max((s.ffn_width for s in parent.layers), default=0)
    if scoring == "replace-one-kl+refit" and tokens.numel() < _REFIT_TOKENS_PER_CHANNEL * widest:
        raise ConfigError(
            f"scoring {scoring!r} needs at least {_REFIT_TOKENS_PER_CHANNEL} calibration tokens per FFN channel "
            f"({_REFIT_TOKENS_PER_CHANNEL * widest} for FFN {widest}), got {tokens.numel()}: with fewer, the "
            "least-squares refit of a narrowed FFN fits the rows that score it (nearly) exactly"
        )
    model_id = model_id or str(getattr(model.config, "_name_or_path", "") or "")
    if cache_dir is not None and not model_id:
        raise ConfigError("a block-library cache needs a model_id (the model has no _name_or_path); pass model_id=")
    imp = importance.meta
    meta = LibraryMeta(
        model_id=model_id,
        data_id=data_id or tokens_id(tokens),
        importance_id=f"{imp.model_id}|{imp.data_id}|{imp.method}",
        scoring=scoring,
        hidden_size=hidden,
        ffn_step=ffn_step,
        num_sequences=int(tokens.shape[0]),
        seq_len=int(tokens.shape[1]),
        dtype=dtype_name(next(model.parameters()).dtype),
    )
    compute = lambda: _build(model, adapter, parent, importance, tokens, meta, batch_tokens, progress)
    if cache_dir is None:
        return compute(), False
    return fetch(
        library_path(cache_dir, meta),
        compute,
        lambda lib, tmp: lib.save(tmp),
        lambda path: _load_cached(path, parent),
    )


def _load_cached(path: Path, parent: Architecture) -> BlockLibrary:
    lib = BlockLibrary.load(path)
    mismatch = architecture_mismatch(lib.parent, parent)
    if mismatch:
        raise ConfigError(
            f"cached block library at {str(path)!r} was built for another architecture ({mismatch}); "
            "pass a different model_id or delete that file"
        )
    return lib


@dataclass(frozen=True, eq=False)
class _RowMasks:
    """One variant of one layer as per-row factors: ``heads`` ``(H·d,)`` over ``o_proj``'s input,
    ``ffn`` ``(F,)`` over ``down_proj``'s input, and whether each sub-block's output is kept."""

    heads: torch.Tensor | None
    ffn: torch.Tensor | None
    attention: bool
    mlp: bool
    down: torch.Tensor | None = None  # (F, D): a refit down projection (zero rows where channels are cut)


def _variant_masks(
    parent: Architecture, importance: Importance, hidden: int, ffn_step: int
) -> tuple[list[list[BlockVariant]], list[list[_RowMasks]], Any]:
    """The measured variants of every layer, their row masks and the hidden mask ``(D,)``.

    The kept heads and channels of a width are :func:`plan_pruning`'s: one plan per distinct variant
    kind over every layer it fits (each layer's choice depends on its own scores alone)."""
    measured = [_measured(spec, ffn_step) for spec in parent.layers]
    kinds = sorted({v for vs in measured for v in vs if not v.skipped})
    plans: dict[BlockVariant, Any] = {}
    for kind in kinds:
        layers = tuple(kind.spec(s) if kind in vs else s for s, vs in zip(parent.layers, measured))
        plans[kind] = plan_pruning(parent, importance, replace(parent, layers=layers, hidden_size=hidden)).masks()
    hidden_mask = plan_pruning(parent, importance, replace(parent, hidden_size=hidden)).masks().hidden
    rows = []
    for i, (spec, vs) in enumerate(zip(parent.layers, measured)):
        layer_rows = []
        for v in vs:
            mask = plans[v].layers[i] if not v.skipped else None
            heads = mask.heads.repeat_interleave(spec.head_dim) if mask is not None and mask.heads is not None else None
            ffn = mask.ffn if mask is not None else None
            layer_rows.append(_RowMasks(heads, ffn, v.attention, v.ffn))
        rows.append(layer_rows)
    return measured, rows, hidden_mask


def _build(
    model: Any,
    adapter: FamilyAdapter,
    parent: Architecture,
    importance: Importance,
    tokens: torch.Tensor,
    meta: LibraryMeta,
    batch_tokens: int,
    progress: bool,
) -> BlockLibrary:
    from tqdm.auto import tqdm

    from autocompress_opt.quality.metrics import inference_mode, log_probs

    began = time.perf_counter()
    measured, rows, hidden_mask = _variant_masks(parent, importance, meta.hidden_size, meta.ffn_step)
    device = adapter.embedding(model).weight.device
    ids = tokens.to(device)
    layers, parts = list(adapter.layers(model)), adapter.all_layer_parts(model)
    passes = 0
    with inference_mode(model):
        teacher = log_probs(model(input_ids=ids, use_cache=False).logits)  # (n, T, V) float32
        with _hidden_only(model, parent, hidden_mask, adapter):
            refit = meta.scoring == "replace-one-kl+refit"
            inputs, ffn_inputs = _layer_inputs(model, layers, ids, parts if refit else None)
            total = sum(len(vs) for vs in measured)
            bar = tqdm(total=total, desc="block library", unit="variant", disable=not progress)
            kls: list[dict[BlockVariant, float]] = []
            try:
                for i, (vs, rs) in enumerate(zip(measured, rows)):
                    if refit and ffn_inputs[i] is not None:
                        rs = _refit_rows(parts[i], rs, ffn_inputs[i])
                        ffn_inputs[i] = None  # (n, T, F) each: freed as the layers are done
                    values = _layer_kls(model, layers, parts[i], i, inputs[i], ids, teacher, rs, batch_tokens, bar)
                    kls.append(dict(zip(vs, values)))
                    passes += len(vs)
            finally:
                bar.close()
    del teacher
    meta = replace(meta, build_seconds=time.perf_counter() - began, passes=passes)
    return BlockLibrary(parent, tuple(kls), meta)


@contextlib.contextmanager
def _hidden_only(model: Any, parent: Architecture, hidden_mask: torch.Tensor, adapter: FamilyAdapter) -> Iterator[None]:
    """:func:`apply_masks` of a hidden mask alone (every layer whole; no hook at the full hidden size)."""
    from autocompress_opt.prune.masking import Masks, apply_masks

    if bool(hidden_mask.all()):
        yield
        return
    with apply_masks(model, replace(Masks.ones(parent), hidden=hidden_mask), adapter=adapter):
        yield


def _layer_inputs(
    model: Any, layers: Sequence[Any], ids: torch.Tensor, parts: Sequence[LayerParts] | None = None
) -> tuple[list[Any], list[Any]]:
    """Every decoder layer's input hidden states ``(n, T, D)`` in one pass and, with ``parts``, each
    FFN's ``down_proj`` input ``(n, T, F)`` (else Nones); :class:`ConfigError` where a layer returns a
    tuple (the suffix passes need layers that return their hidden states)."""
    inputs: list[Any] = [None] * len(layers)
    ffn_inputs: list[Any] = [None] * len(layers)
    bare = [True]

    def save(i: int) -> Callable[..., None]:
        def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            inputs[i] = layer_input(args, kwargs).clone()

        return hook

    def save_ffn(i: int) -> Callable[..., None]:
        def hook(module: Any, args: tuple[Any, ...]) -> None:
            ffn_inputs[i] = args[0].detach().clone()

        return hook

    def check(module: Any, args: Any, output: Any) -> None:
        bare[0] = bare[0] and not isinstance(output, tuple)

    handles = [layer.register_forward_pre_hook(save(i), with_kwargs=True) for i, layer in enumerate(layers)]
    handles += [layer.register_forward_hook(check) for layer in layers]
    handles += [
        p.down_proj.register_forward_pre_hook(save_ffn(i)) for i, p in enumerate(parts or []) if p.mlp is not None
    ]
    try:
        model(input_ids=ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    if not bare[0]:
        raise ConfigError("the block library needs decoder layers that return their hidden states (transformers 5)")
    return inputs, ffn_inputs


# Fewest calibration tokens per FFN channel the refit scoring takes: SmolLM2's 256 tokens against
# 768 kept channels fit every row exactly (FFN 768 scored 0 in every layer, benchmarks, 4 x 64 rows).
_REFIT_TOKENS_PER_CHANNEL = 4
_RIDGE = 1e-6  # the refit's ridge, relative to the mean diagonal of the kept channels' Gram matrix


def _refit_rows(parts: LayerParts, rows: Sequence[_RowMasks], h: torch.Tensor) -> list[_RowMasks]:
    """``rows`` with every narrowed FFN's down projection refit by least squares: the kept channels'
    weights ``X`` that best reproduce the whole FFN's output on the calibration tokens,
    ``argmin ‖H·Wᵀ − H_S·X‖²`` (``H`` ``(N, F)`` the ``down_proj`` inputs, ``S`` the kept channels; a
    ridge of :data:`_RIDGE`), in float64. In-sample: the same rows score the refit variant."""
    import torch

    weight = parts.down_proj.weight  # (D, F)
    flat = h.reshape(-1, h.shape[-1]).double()  # (N, F)
    target = flat @ weight.double().T  # (N, D)
    out = []
    for r in rows:
        if r.ffn is None or not r.mlp or bool(r.ffn.all()):
            out.append(r)
            continue
        keep = r.ffn.bool()
        a = flat[:, keep]  # (N, |S|)
        gram = a.T @ a
        ridge = _RIDGE * float(gram.diagonal().mean()) + 1e-12
        solved = torch.linalg.solve(gram + ridge * torch.eye(len(gram), dtype=gram.dtype), a.T @ target)  # (|S|, D)
        down = torch.zeros(h.shape[-1], weight.shape[0], dtype=torch.float64)
        down[keep] = solved
        out.append(replace(r, down=down.to(dtype=weight.dtype, device=weight.device)))
    return out


def _chunks(n: int, size: int) -> Iterator[range]:
    for start in range(0, n, size):
        yield range(start, min(n, start + size))


def _layer_kls(
    model: Any,
    layers: Sequence[Any],
    parts: LayerParts,
    i: int,
    x_in: torch.Tensor,
    ids: torch.Tensor,
    teacher: torch.Tensor,
    variants: Sequence[_RowMasks],
    batch_tokens: int,
    bar: Any,
) -> list[float]:
    """Mean per-position KL(parent ‖ variant) of each of layer ``i``'s ``variants``: the suffix from
    layer ``i`` on, ``k`` variants at a time as ``k·n`` rows (``x_in`` ``(n, T, D)`` repeated), each
    block of ``n`` rows under its variant's masks."""
    from autocompress_opt.quality.metrics import log_probs, token_kl

    n, t = ids.shape
    per_pass = max(1, batch_tokens // (n * t))
    out: list[float] = []
    for chunk in _chunks(len(variants), per_pass):
        group = [variants[j] for j in chunk]
        k = len(group)
        hidden = x_in.repeat(k, 1, 1)  # (k·n, T, D)
        with _prefix_returns(layers[:i], hidden), _row_masks(parts, group, n, hidden):
            logits = model(input_ids=ids.repeat(k, 1), use_cache=False).logits  # (k·n, T, V)
        for j in range(k):
            kl = token_kl(log_probs(logits[j * n : (j + 1) * n]), teacher)  # (n, T)
            out.append(float(kl.double().mean()))
        bar.update(k)
    return out


class _prefix_returns:
    """Layers ``0..i-1`` return ``hidden`` (the saved input of layer ``i``) instead of running."""

    def __init__(self, layers: Sequence[Any], hidden: torch.Tensor) -> None:
        self._layers, self._hidden = list(layers), hidden
        self._saved: list[Any] = []

    def __enter__(self) -> None:
        hidden = self._hidden
        self._saved = [layer.__dict__.get("forward", _NO_FORWARD) for layer in self._layers]
        for layer in self._layers:
            layer.forward = lambda *args, **kwargs: hidden

    def __exit__(self, *exc: object) -> None:
        for layer, forward in zip(self._layers, self._saved):
            if forward is _NO_FORWARD:
                del layer.forward  # the class's forward again
            else:
                layer.forward = forward  # a wrapper someone installed (accelerate's device hooks)


_NO_FORWARD = object()


class _row_masks:
    """Hooks on one layer's modules that apply ``variants[j]`` to rows ``j·n .. j·n+n-1``: head
    factors at ``o_proj``'s input ``(k·n, T, H·d)``, channel factors at ``down_proj``'s input
    ``(k·n, T, F)``, and a dropped sub-block's whole output (bias included) times 0."""

    def __init__(self, parts: LayerParts, variants: Sequence[_RowMasks], n: int, like: torch.Tensor) -> None:
        self._parts, self._variants, self._n, self._like = parts, variants, n, like
        self._handles: list[Any] = []

    def _factors(self, per_variant: Sequence[Any], width: int) -> torch.Tensor:
        """``(k·n, 1, width)`` factors in the activations' dtype (a None entry: all ones)."""
        import torch

        like = self._like
        rows = [torch.ones(width) if m is None else m.to(torch.float32) for m in per_variant]
        factors = torch.stack(rows).to(device=like.device, dtype=like.dtype)  # (k, width)
        return factors.repeat_interleave(self._n, dim=0)[:, None, :]

    def __enter__(self) -> None:
        p, vs = self._parts, self._variants
        if p.attention is not None:
            heads = self._factors([v.heads for v in vs], p.num_heads * p.head_dim)
            self._handles.append(p.o_proj.register_forward_pre_hook(lambda m, args: (args[0] * heads, *args[1:])))
            keep = self._factors([_flag(v.attention) for v in vs], 1)
            self._handles.append(p.attention.register_forward_hook(_scaled_output(keep)))
        if p.mlp is not None:
            channels = self._factors([v.ffn for v in vs], p.ffn_width)
            self._handles.append(p.down_proj.register_forward_pre_hook(lambda m, args: (args[0] * channels, *args[1:])))
            keep = self._factors([_flag(v.mlp) for v in vs], 1)
            self._handles.append(p.mlp.register_forward_hook(_scaled_output(keep)))
            refits = [(j, v.down) for j, v in enumerate(vs) if v.down is not None]
            if refits:  # before any hidden-mask hook on the output (apply_masks'), which then applies to it
                hook = _refit_output(refits, self._n)
                self._handles.append(p.down_proj.register_forward_hook(hook, prepend=True))

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


def _flag(on: bool) -> Any:
    import torch

    return torch.ones(1) if on else torch.zeros(1)


def _refit_output(refits: Sequence[tuple[int, torch.Tensor]], n: int) -> Callable[..., Any]:
    """A ``down_proj`` hook: rows ``j·n .. j·n+n-1`` computed with variant ``j``'s refit weights
    ``(F, D)`` from the (masked) input ``(k·n, T, F)``, the bias kept."""

    def hook(module: Any, args: tuple[Any, ...], output: Any) -> Any:
        x, out = args[0], output.clone()
        for j, down in refits:
            rows = slice(j * n, (j + 1) * n)
            out[rows] = x[rows] @ down + (module.bias if module.bias is not None else 0)
        return out

    return hook


def _scaled_output(factor: torch.Tensor) -> Callable[..., Any]:
    def hook(module: Any, args: Any, output: Any) -> Any:
        if isinstance(output, tuple):
            return (output[0] * factor, *output[1:])
        return output * factor

    return hook

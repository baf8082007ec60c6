"""Minitron-style importance of heads, FFN channels, hidden channels and layers, from forward passes.

Source: Muralidharan et al., "Compact Language Models via Pruning and Knowledge Distillation"
(Minitron, arXiv 2407.14679), §2: activation-based importance from a small calibration set,
no gradients. What is scored (all scores: higher = more important):

* **heads** — per layer, per query head ``h``: mean over calibration tokens of ‖o_h‖₂, where
  ``o_h`` (``head_dim`` values) is the head's attention output, i.e. its slice of ``o_proj``'s
  input. **kv_groups** — per KV head ``g``: the sum of the scores of the query heads that read it
  (heads ``g·r .. g·r+r-1``), so grouped-query attention is pruned in whole groups.
* **ffn** — per layer, per channel ``c``: mean |act(gate(x))·up(x)|_c, the input of ``down_proj``.
* **hidden** — per residual channel: mean |RMSNorm output| over tokens and over every hidden
  RMSNorm (each layer's pre-norms, Gemma 3's post-norms too, and the final norm): Minitron's
  embedding-channel score.
* **block_influence** — per layer: ``1 − mean cos(x_in, x_out)`` over tokens (Men et al.,
  ShortGPT, arXiv 2403.03853; used by Minitron for depth).
* **skip_loss** — per layer: mean next-token cross-entropy with the layer skipped minus the
  unpruned model's (Minitron's LM-loss depth metric). Costs one extra pass over the data per layer.
* Mixture-of-experts layers (``E`` routed experts of ``F`` channels, top-``k``; the experts path's
  adapters, :func:`~autocompress_opt.hf.adapters.moe_adapter`), as the MoE extension of Minitron
  does in NVIDIA ModelOpt (experts ranked by how much the router uses them, expert channels like FFN
  channels): **expert_frequency** ``(E,)`` — the fraction of calibration tokens whose top-``k``
  holds the expert (sums to ``k``; 0 for an expert never routed); **expert_output** ``(E,)`` — mean
  over all tokens of ‖w·y_e‖₂, the expert's routing-weighted output (0 when never routed);
  **expert_ffn** ``(E, F)`` — per expert, mean |act(gate(x))·up(x)|_c over the tokens routed to it
  (the input of its down projection; zeros when never routed); **shared_ffn** ``(S,)`` — where the
  block has a shared expert (Nemotron-H), its channels scored as FFN channels (mean |act(up(x))|_c at
  its ``down_proj``'s input, every token). Ungated experts (Nemotron-H's relu²) score ``act(up(x))``;
  with a latent MoE the experts' output norm is taken in the latent width, before ``fc2_latent_proj``.
  **routing_mass** ``(k,)`` — the mean over tokens of the ``j``-th largest routing weight of each
  token's top-``k`` (as the router hands them to the experts): the mass an experts-per-token cut to
  ``k'`` keeps is ``Σ_{j<k'}`` of it over its sum; **expert_gate_mass** ``(E,)`` — the mean over all
  tokens of the routing weight each token gives the expert (0 outside its top-``k``): how much of the
  layer's output the router hands it, where ``expert_frequency`` counts only how often. Each is absent
  (None) in records written before it existed.
  Dense layers have None there, and a dense model's scores are computed exactly as before.
* Mamba-2 mixers (hybrid parents, Nemotron-H): **mamba_heads** ``(H,)`` — per SSM head, mean over
  calibration tokens of ‖y_h‖₂, the head's ``head_dim`` channels of ``out_proj``'s input (after the
  gated RMSNorm), scored like attention heads.

:func:`estimate_importance` runs under ``torch.inference_mode`` and is deterministic: the same
model, tokens and ``batch_size`` give bit-identical scores. It returns an :class:`Importance`
record that saves as safetensors + a JSON sidecar (never pickle) and is cached on disk
(:mod:`autocompress_opt.cache`) keyed by (model id, data id, method, the weights' dtype) and
:data:`CACHE_VERSION`: computed once per parent, data and dtype, by the first of the processes of a
host that want it (the others wait and read it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.cache import cache_key, fetch
from autocompress_opt.errors import ConfigError, UnknownNameError, check_int
from autocompress_opt.hf.adapters import (
    FamilyAdapter,
    LayerParts,
    adapter_for,
    architecture_mismatch,
    bypass_layer,
    layer_input,
    layer_output,
)
from autocompress_opt.registry import Registry

if TYPE_CHECKING:
    import torch

__all__ = [
    "CACHE_VERSION",
    "ESTIMATORS",
    "LAYER_METRICS",
    "Importance",
    "ImportanceMeta",
    "cache_path",
    "estimate_importance",
    "expert_forward",
    "ranked",
    "tokens_id",
]

_FORMAT = "autocompress-importance/1"
_TENSORS_FILE, _META_FILE = "importance.safetensors", "importance.json"
LAYER_METRICS: tuple[str, ...] = ("skip_loss", "block_influence")
_SPARSE_KINDS = (
    "expert_frequency",
    "expert_output",
    "expert_ffn",
    "shared_ffn",
    "mamba_heads",
    "routing_mass",
    "expert_gate_mass",
)
# The version of the scores' computation, part of every cache key: bump it when an estimator's
# numbers change, and cached scores are recomputed. (1: keys of (model, data, method) alone;
# 2: without the dtype: a bf16 parent read an fp32 parent's scores unless its model id said bf16.)
CACHE_VERSION = "importance/3"


@dataclass(frozen=True)
class ImportanceMeta:
    """Where a set of scores came from.

    Attributes:
        model_id: the parent model's identity (a hub id, a path, a name); part of the cache key.
        data_id: the calibration data's identity (e.g. ``"textdata:n=64:len=256:seed=0"``); part of the cache key.
        method: the estimator's registry name (``"minitron"``); part of the cache key.
        num_sequences / seq_len: shape of the calibration token batch.
        batch_size: sequences per forward pass.
        seed: the calibration data's seed, when the caller knows it (informational).
        base_loss: mean next-token cross-entropy (nats) of the unpruned model on the data.
    """

    model_id: str
    data_id: str
    method: str
    num_sequences: int
    seq_len: int
    batch_size: int
    seed: int | None = None
    base_loss: float = float("nan")


@dataclass(frozen=True, eq=False)
class Importance:
    """Importance scores of one parent model; every score is float64 and higher = more important.

    Per layer ``i`` of ``architecture`` (``None`` where the layer has no such sub-block):
    ``heads[i]`` ``(H_i,)``, ``kv_groups[i]`` ``(G_i,)``, ``ffn[i]`` ``(F_i,)``. Model-wide:
    ``hidden`` ``(D,)``, ``block_influence`` ``(L,)``, ``skip_loss`` ``(L,)`` (nats). Per MoE layer
    (None elsewhere; an empty tuple reads as all None): ``expert_frequency[i]`` ``(E_i,)``,
    ``expert_output[i]`` ``(E_i,)``, ``expert_ffn[i]`` ``(E_i, F_i)``, ``shared_ffn[i]`` ``(S_i,)`` where
    it has a shared expert, ``routing_mass[i]`` ``(k_i,)`` (None in older records); per Mamba-2 layer
    ``mamba_heads[i]`` ``(H_i,)`` (module docstring).
    """

    architecture: Architecture
    heads: tuple[torch.Tensor | None, ...]
    kv_groups: tuple[torch.Tensor | None, ...]
    ffn: tuple[torch.Tensor | None, ...]
    hidden: torch.Tensor
    block_influence: torch.Tensor
    skip_loss: torch.Tensor
    meta: ImportanceMeta
    expert_frequency: tuple[torch.Tensor | None, ...] = ()
    expert_output: tuple[torch.Tensor | None, ...] = ()
    expert_ffn: tuple[torch.Tensor | None, ...] = ()
    shared_ffn: tuple[torch.Tensor | None, ...] = ()
    mamba_heads: tuple[torch.Tensor | None, ...] = ()
    routing_mass: tuple[torch.Tensor | None, ...] = ()
    expert_gate_mass: tuple[torch.Tensor | None, ...] = ()

    def __post_init__(self) -> None:
        for kind in _SPARSE_KINDS:  # a dense record leaves them out
            if not getattr(self, kind):
                object.__setattr__(self, kind, (None,) * self.architecture.num_layers)
        _check_shapes(self)

    def layer_scores(self, metric: str = "skip_loss") -> torch.Tensor:
        """Per-layer importance ``(L,)`` by ``metric`` (``skip_loss`` or ``block_influence``)."""
        if metric not in LAYER_METRICS:
            raise UnknownNameError("layer importance metric", metric, LAYER_METRICS)
        return getattr(self, metric)

    def layer_order(self, metric: str = "skip_loss") -> list[int]:
        """The layers from most to least important by ``metric`` (:meth:`layer_scores`), ties to the
        lower index (:func:`ranked`); layers the architecture drops entirely come last, in index
        order. A permutation of ``range(L)``: every keep-the-top-``n``-layers decision reads it."""
        dropped = [i for i, layer in enumerate(self.architecture.layers) if layer.is_noop]
        return [int(i) for i in ranked(self.layer_scores(metric)) if int(i) not in dropped] + dropped

    def select_layers(self, kept: Sequence[int], architecture: Architecture) -> Importance:
        """The scores of the parent layers ``kept`` (sorted indices), for ``architecture``: the model
        those layers make on their own (:func:`~autocompress_opt.prune.experts.slice_layers`). Scores
        are the parent's, measured with every layer present (as the dense trial reads them)."""
        pick = lambda scores: tuple(scores[i] for i in kept) if scores else scores
        index = [int(i) for i in kept]
        sparse: dict[str, Any] = {kind: pick(getattr(self, kind)) for kind in _SPARSE_KINDS}
        return replace(
            self,
            architecture=architecture,
            heads=pick(self.heads),
            kv_groups=pick(self.kv_groups),
            ffn=pick(self.ffn),
            block_influence=self.block_influence[index],
            skip_loss=self.skip_loss[index],
            **sparse,
        )

    def select_heads(self, heads: Mapping[int, Sequence[int]], architecture: Architecture) -> Importance:
        """The scores of the query heads ``heads[i]`` (and the KV groups they read) of each attention
        layer ``i``, for ``architecture``: the model those heads make
        (:func:`~autocompress_opt.prune.experts.slice_heads`)."""
        new_heads, new_groups = list(self.heads), list(self.kv_groups)
        for i, kept in heads.items():
            layer, scores, groups = self.architecture.layers[i], self.heads[i], self.kv_groups[i]
            if scores is None or groups is None:
                raise ConfigError(f"the importance scores have no head scores for layer {i}")
            r = layer.num_heads // layer.num_kv_heads
            new_heads[i] = scores[[int(h) for h in kept]]
            new_groups[i] = groups[sorted({int(h) // r for h in kept})]
        return replace(self, architecture=architecture, heads=tuple(new_heads), kv_groups=tuple(new_groups))

    def select_hidden(self, channels: Sequence[int], architecture: Architecture) -> Importance:
        """The scores of the residual channels ``channels`` (ascending), for ``architecture``: the model
        they make (:func:`~autocompress_opt.prune.experts.slice_hidden`)."""
        return replace(self, architecture=architecture, hidden=self.hidden[[int(c) for c in channels]])

    # ------------------------------------------------------------------- persistence
    def save(self, directory: str | Path) -> Path:
        """Write ``importance.safetensors`` + ``importance.json`` into ``directory`` (created); returns it."""
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self._tensors().items()}, str(directory / _TENSORS_FILE))
        sidecar = {"format": _FORMAT, "meta": asdict(self.meta), "architecture": self.architecture.to_dict()}
        (directory / _META_FILE).write_text(json.dumps(sidecar, indent=2), encoding="utf-8")
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> Importance:
        """Read what :meth:`save` wrote; raises :class:`ConfigError` for a missing or foreign file."""
        from safetensors.torch import load_file

        directory = Path(directory)
        sidecar = _read_sidecar(directory / _META_FILE)
        tensors = load_file(str(directory / _TENSORS_FILE))
        arch = Architecture.from_dict(sidecar["architecture"])
        per_layer = lambda kind: tuple(tensors.get(f"layers.{i}.{kind}") for i in range(arch.num_layers))
        return cls(
            architecture=arch,
            heads=per_layer("heads"),
            kv_groups=per_layer("kv_groups"),
            ffn=per_layer("ffn"),
            hidden=tensors["hidden"],
            block_influence=tensors["block_influence"],
            skip_loss=tensors["skip_loss"],
            meta=ImportanceMeta(**sidecar["meta"]),
            **{kind: per_layer(kind) for kind in _SPARSE_KINDS},
        )

    def _tensors(self) -> dict[str, torch.Tensor]:
        out = {"hidden": self.hidden, "block_influence": self.block_influence, "skip_loss": self.skip_loss}
        for kind in ("heads", "kv_groups", "ffn", *_SPARSE_KINDS):
            for i, t in enumerate(getattr(self, kind)):
                if t is not None:
                    out[f"layers.{i}.{kind}"] = t
        return out


def _read_sidecar(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"no importance sidecar at {str(path)!r}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != _FORMAT:
        raise ConfigError(f"{path} is not an importance file (format {data.get('format')!r}, expected {_FORMAT!r})")
    return data


def _check_shapes(imp: Importance) -> None:
    """Every tensor matches the architecture; raises :class:`ConfigError` naming the first that does not."""
    arch = imp.architecture
    expect: dict[str, tuple[int, ...] | None] = {
        "hidden": (arch.hidden_size,),
        "block_influence": (arch.num_layers,),
        "skip_loss": (arch.num_layers,),
    }
    for kind in ("heads", "kv_groups", "ffn", *_SPARSE_KINDS):
        if len(getattr(imp, kind)) != arch.num_layers:
            raise ConfigError(f"Importance.{kind} has {len(getattr(imp, kind))} layers, architecture {arch.num_layers}")
    for i, layer in enumerate(arch.layers):
        expect[f"heads[{i}]"] = (layer.num_heads,) if layer.attention else None
        expect[f"kv_groups[{i}]"] = (layer.num_kv_heads,) if layer.attention else None
        expect[f"ffn[{i}]"] = (layer.ffn_width,) if layer.ffn else None
        moe = layer.moe
        expect[f"expert_frequency[{i}]"] = (moe.num_experts,) if moe is not None else None
        expect[f"expert_output[{i}]"] = (moe.num_experts,) if moe is not None else None
        expect[f"expert_ffn[{i}]"] = (moe.num_experts, moe.expert_width) if moe is not None else None
        expect[f"shared_ffn[{i}]"] = (moe.shared_width,) if moe is not None and moe.shared_width else None
        expect[f"mamba_heads[{i}]"] = (layer.mamba.num_heads,) if layer.mamba is not None else None
        if moe is not None and imp.routing_mass[i] is not None:  # absent from records written before it
            expect[f"routing_mass[{i}]"] = (moe.experts_per_token,)
        if moe is not None and imp.expert_gate_mass[i] is not None:  # likewise
            expect[f"expert_gate_mass[{i}]"] = (moe.num_experts,)
    for name, shape in expect.items():
        kind, _, idx = name.partition("[")
        tensor = getattr(imp, kind)[int(idx[:-1])] if idx else getattr(imp, kind)
        got = None if tensor is None else tuple(tensor.shape)
        if got != shape:
            raise ConfigError(f"Importance.{name} has shape {got}, expected {shape} for the architecture")


def ranked(scores: torch.Tensor) -> torch.Tensor:
    """Indices of ``scores`` ``(n,)`` from the highest score to the lowest, ties to the lower index.

    The one tie rule of every keep decision: layers (:meth:`Importance.layer_order`), KV groups,
    query heads, FFN and hidden channels (the top ``k`` of this order are what is kept).
    """
    import torch

    return torch.argsort(scores, descending=True, stable=True)


# ------------------------------------------------------------------------------ estimation
Estimator = Callable[..., Importance]
ESTIMATORS: Registry[Estimator] = Registry("importance method")


def tokens_id(tokens: torch.Tensor) -> str:
    """A content hash of a token batch, usable as ``data_id`` (same tokens → same id)."""
    import numpy as np

    digest = hashlib.sha256(np.ascontiguousarray(tokens.cpu().numpy()).astype("<i8").tobytes()).hexdigest()
    return f"tokens-sha256:{digest[:16]}:{tokens.shape[0]}x{tokens.shape[1]}"


def cache_path(cache_dir: str | Path, model_id: str, data_id: str, method: str, dtype: str = "fp32") -> Path:
    """The folder that caches the scores of (model_id, data_id, method) computed with weights in
    ``dtype`` (``fp32``, ``bf16``, ``fp16``: :func:`~autocompress_opt.hf.device.dtype_name`) under
    ``cache_dir`` (by :data:`CACHE_VERSION` of the code: :func:`~autocompress_opt.cache.cache_key`)."""
    return Path(cache_dir) / f"{method}-{cache_key(CACHE_VERSION, model_id, data_id, method, dtype)}"


def estimate_importance(
    model: Any,
    tokens: torch.Tensor,
    *,
    model_id: str | None = None,
    data_id: str | None = None,
    method: str = "minitron",
    seed: int | None = None,
    adapter: FamilyAdapter | None = None,
    batch_size: int = 4,
    cache_dir: str | Path | None = None,
    progress: bool = True,
) -> Importance:
    """Score ``model``'s heads, FFN channels, hidden channels and layers on calibration ``tokens``.

    Args:
        model: a transformers causal LM of a supported family (see :func:`adapter_for`).
        tokens: LongTensor ``(num_sequences, seq_len)`` of token ids, ``seq_len >= 2``.
        model_id: the model's identity for the cache key; default ``config._name_or_path``.
        data_id: the data's identity for the cache key; default :func:`tokens_id` (a content hash).
        method: registry name of the estimator (:data:`ESTIMATORS`); ``"minitron"``.
        seed: the calibration data's seed, recorded in the metadata only.
        adapter: default :func:`adapter_for` ``(model)``.
        batch_size: sequences per forward pass (peak memory ~ batch·seq_len·vocab float32 logits,
            about three copies during the loss: with Gemma 3's 262k vocabulary, 2 × 64 tokens
            already take ~400 MB).
        cache_dir: when given, reuse ``cache_path(cache_dir, model_id, data_id, method, dtype)``
            (``dtype``: the model's weights') if it exists, else compute and publish it whole
            (:func:`~autocompress_opt.cache.fetch`: the processes of one host that want the same
            entry at once compute it once).
        progress: show a tqdm progress bar.

    Returns an :class:`Importance`; the model's weights are not changed and no hook is left behind.
    Raises :class:`ConfigError` for bad tokens, a cache entry made for another architecture, or a
    cache without a model id; :class:`UnknownNameError` for an unknown method or model family.
    """
    from autocompress_opt.data.textdata import check_token_ids

    estimator = ESTIMATORS.get(method)
    adapter = adapter or adapter_for(model)
    arch = adapter.architecture(model)
    check_token_ids(tokens, "tokens", arch.vocab_size)
    check_int(batch_size, "batch_size")
    model_id = model_id or str(getattr(model.config, "_name_or_path", "") or "")
    data_id = data_id or tokens_id(tokens)
    if cache_dir is not None and not model_id:
        raise ConfigError("an importance cache needs a model_id (the model has no _name_or_path); pass model_id=")
    meta = ImportanceMeta(
        model_id=model_id,
        data_id=data_id,
        method=method,
        num_sequences=int(tokens.shape[0]),
        seq_len=int(tokens.shape[1]),
        batch_size=batch_size,
        seed=seed,
    )
    compute = lambda: estimator(model, tokens, adapter=adapter, meta=meta, progress=progress)
    if cache_dir is None:
        return compute()
    from autocompress_opt.hf.device import dtype_name

    dtype = dtype_name(next(model.parameters()).dtype)  # bf16 scores rank channels unlike fp32 ones
    result, _ = fetch(
        cache_path(cache_dir, model_id, data_id, method, dtype),
        compute,
        lambda imp, tmp: imp.save(tmp),
        lambda path: _load_cached(path, arch),
    )
    return result


def _load_cached(path: Path, arch: Architecture) -> Importance | None:
    """The entry at ``path``; None for a folder without a sidecar (not an entry: recomputed)."""
    if not (path / _META_FILE).is_file():
        return None
    cached = Importance.load(path)
    mismatch = architecture_mismatch(cached.architecture, arch)
    if mismatch:
        raise ConfigError(
            f"cached importance at {str(path)!r} (model_id {cached.meta.model_id!r}) was computed for another "
            f"architecture ({mismatch}); pass a different model_id or delete that folder"
        )
    return cached


# ---------------------------------------------------------------------------- minitron
class _Activations:
    """Forward hooks that sum activation statistics over calibration tokens (float64 sums).

    Per layer: ``heads`` ``(H,)`` Σ‖o_h‖₂, ``ffn`` ``(F,)`` Σ|x_c| at ``down_proj``'s input,
    ``cos`` Σ cos(x_in, x_out); model-wide: ``hidden`` ``(D,)`` Σ|norm output| over all hidden norms.
    Per MoE layer: ``routed`` ``(E,)`` tokens routed to each expert, ``expert_out`` ``(E,)`` Σ‖w·y_e‖₂,
    ``expert_ffn`` ``(E, F)`` Σ|act(gate)·up| over the tokens routed to each expert, ``shared`` ``(S,)``
    Σ|x_c| at the shared expert's ``down_proj`` input. Per Mamba-2 layer: ``mamba`` ``(H,)`` Σ‖y_h‖₂.
    """

    def __init__(self, model: Any, adapter: FamilyAdapter) -> None:
        import torch

        self.parts = adapter.all_layer_parts(model)
        self.norms = adapter.hidden_norms(model)
        device = adapter.embedding(model).weight.device  # sums stay where the activations are
        zeros = lambda n, on=device: torch.zeros(n, dtype=torch.float64, device=on)
        # a layer's sums on its own device (a model spread over GPUs); model-wide ones on the embedding's
        self.heads = [
            zeros(p.num_heads, p.o_proj.weight.device) if p.attention is not None else None for p in self.parts
        ]
        self.ffn = [zeros(p.ffn_width, p.down_proj.weight.device) if p.mlp is not None else None for p in self.parts]
        self.hidden = zeros(adapter.embedding(model).embedding_dim)
        self.cos = zeros(len(self.parts))
        moe = [p if p.moe is not None else None for p in self.parts]
        on = lambda p: p.expert_down.device
        self.routed = [zeros(p.num_experts, on(p)) if p else None for p in moe]
        self.expert_out = [zeros(p.num_experts, on(p)) if p else None for p in moe]
        self.expert_ffn = [zeros((p.num_experts, p.expert_width), on(p)) if p else None for p in moe]
        self.shared = [zeros(p.shared_width, on(p)) if p and p.shared_width else None for p in moe]
        self.rank_mass = [zeros(int(p.router.top_k), on(p)) if p else None for p in moe]
        self.gate_mass = [zeros(p.num_experts, on(p)) if p else None for p in moe]
        self.mamba = [
            zeros(p.mamba.num_heads, p.mamba.out_proj.weight.device) if p.mamba is not None else None
            for p in self.parts
        ]
        # each layer's input of the last pass (kept for the skip passes) and whether every layer returned
        # a bare tensor (transformers v5's decoder layers do)
        self.inputs: list[Any] = [None] * len(self.parts)
        self.bare = True
        self.handles: list[Any] = []

    def __enter__(self) -> _Activations:
        for i, parts in enumerate(self.parts):
            self.handles.append(parts.layer.register_forward_pre_hook(self._save_input(i), with_kwargs=True))
            self.handles.append(parts.layer.register_forward_hook(self._cosine(i), with_kwargs=True))
            if parts.attention is not None:
                self.handles.append(parts.o_proj.register_forward_pre_hook(self._head_norms(i, parts.head_dim)))
            if parts.mlp is not None:
                self.handles.append(parts.down_proj.register_forward_pre_hook(self._ffn_magnitude(i)))
            if parts.moe is not None:
                self.handles.append(parts.experts.register_forward_hook(self._expert_stats(i, parts)))
            if parts.shared_expert is not None:
                down = parts.shared_expert.down_proj
                self.handles.append(down.register_forward_pre_hook(self._ffn_magnitude(i, self.shared)))
            if parts.mamba is not None:
                hook = self._head_norms(i, int(parts.mamba.head_dim), self.mamba)
                self.handles.append(parts.mamba.out_proj.register_forward_pre_hook(hook))
        for norm in self.norms:
            self.handles.append(norm.register_forward_hook(self._norm_magnitude))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    def _save_input(self, i: int) -> Callable[..., None]:
        def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            self.inputs[i] = layer_input(args, kwargs).clone()

        return hook

    def _cosine(self, i: int) -> Callable[..., None]:
        import torch

        def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            x_out = layer_output(output).float()  # (batch, time, D)
            self.bare = self.bare and not isinstance(output, tuple)
            x_in = self.inputs[i].float().to(x_out.device)  # spread over GPUs: may be on the previous layer's
            self.cos[i] += torch.nn.functional.cosine_similarity(x_in, x_out, dim=-1).double().sum().to(self.cos.device)

        return hook

    def _head_norms(self, i: int, head_dim: int, sums: list[Any] | None = None) -> Callable[..., None]:
        into = self.heads if sums is None else sums

        def hook(module: Any, args: tuple[Any, ...]) -> None:
            x = args[0].float()  # (batch, time, H·d)
            into[i] += x.unflatten(-1, (-1, head_dim)).norm(dim=-1).double().sum(dim=(0, 1))  # (H,)

        return hook

    def _ffn_magnitude(self, i: int, sums: list[Any] | None = None) -> Callable[..., None]:
        into = self.ffn if sums is None else sums

        def hook(module: Any, args: tuple[Any, ...]) -> None:
            into[i] += args[0].float().abs().double().sum(dim=(0, 1))  # (F,)

        return hook

    def _expert_stats(self, i: int, parts: LayerParts) -> Callable[..., None]:
        import torch

        def hook(module: Any, args: tuple[Any, ...], output: Any) -> None:
            x, top_k_index, top_k_weights = args[:3]  # (T, D), (T, k), (T, k): the experts module's call
            ordered = top_k_weights.float().sort(dim=-1, descending=True).values  # (T, k)
            mass = self.rank_mass[i]
            assert mass is not None  # a MoE layer's
            mass += ordered.double().sum(dim=0).to(mass.device)
            for e in torch.unique(top_k_index).tolist():
                token, slot = torch.where(top_k_index == e)  # the tokens routed to e, and where in their top-k
                h, y = expert_forward(parts, e, x[token])  # (n, F), (n, D)
                y = y.float() * top_k_weights[token, slot, None].float()
                self.routed[i][e] += token.numel()  # type: ignore[index]
                self.gate_mass[i][e] += top_k_weights[token, slot].double().sum()  # type: ignore[index]
                self.expert_out[i][e] += y.norm(dim=-1).double().sum()  # type: ignore[index]
                self.expert_ffn[i][e] += h.float().abs().double().sum(dim=0)  # type: ignore[index]

        return hook

    def _norm_magnitude(self, module: Any, args: tuple[Any, ...], output: Any) -> None:
        self.hidden += output.float().abs().double().sum(dim=(0, 1)).to(self.hidden.device)  # (D,)


def expert_forward(parts: LayerParts, expert: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Routed expert ``expert`` of a MoE layer on tokens ``x`` ``(n, L)`` (the experts module's input:
    ``L = D``, or the latent width): its intermediate activation ``h = act(gate(x))·up(x)`` (ungated:
    ``act(up(x))``) ``(n, F)`` and its output ``down(h)`` ``(n, L)``, unweighted.

    The arithmetic of transformers 5's stacked-expert modules (``Qwen3MoeExperts``: ``gate_up_proj``
    ``(E, 2F, D)`` chunked gate-then-up, ``down_proj`` ``(E, D, F)``; ``NemotronHExperts``: ``up_proj``
    ``(E, F, L)``); the experts module itself only returns the routing-weighted sum, so the scores
    recompute each expert (tested against it).
    """
    import torch

    projected = torch.nn.functional.linear(x, parts.expert_gate_up[expert])
    if parts.gated:
        gate, up = projected.chunk(2, dim=-1)
        h = parts.experts.act_fn(gate) * up
    else:
        h = parts.experts.act_fn(projected)
    return h, torch.nn.functional.linear(h, parts.expert_down[expert])


def _batches(tokens: torch.Tensor, batch_size: int) -> Iterator[torch.Tensor]:
    for start in range(0, tokens.shape[0], batch_size):
        yield tokens[start : start + batch_size]


def _loss_sum(model: Any, batch: torch.Tensor) -> float:
    """Σ next-token cross-entropy (nats) over ``batch`` ``(B, T)``: B·(T−1) predictions."""
    import torch

    logits = model(input_ids=batch, use_cache=False).logits[:, :-1]  # (B, T-1, V)
    return float(
        torch.nn.functional.cross_entropy(
            logits.flatten(0, 1).float(), batch[:, 1:].flatten(), reduction="sum"
        ).double()
    )


def _minitron(
    model: Any, tokens: torch.Tensor, *, adapter: FamilyAdapter, meta: ImportanceMeta, progress: bool
) -> Importance:
    """Activation scores in one pass, then one pass per layer with that layer skipped."""
    import torch
    from tqdm.auto import tqdm

    from autocompress_opt.quality.metrics import inference_mode

    arch = adapter.architecture(model)
    batch_size = meta.batch_size
    batches = list(_batches(tokens.to(adapter.embedding(model).weight.device), batch_size))
    n_tokens, n_predictions = tokens.numel(), tokens.shape[0] * (tokens.shape[1] - 1)
    bar = tqdm(total=len(batches) * (arch.num_layers + 1), desc="importance", unit="pass", disable=not progress)
    layers = list(adapter.layers(model))
    base_sum, skipped_sums = 0.0, [0.0] * len(layers)
    try:
        with inference_mode(model):
            acts = _Activations(model, adapter)
            for batch in batches:  # each sum accumulates in batch order: the same floats as pass by pass
                with acts:
                    base_sum += _loss_sum(model, batch)
                bar.update(1)
                for i in range(len(layers)):
                    skipped_sums[i] += _skipped_loss_sum(model, layers, i, acts, batch)
                    bar.update(1)
    finally:
        bar.close()
    base = base_sum / n_predictions
    skip = torch.tensor([total / n_predictions - base for total in skipped_sums], dtype=torch.float64)
    heads = tuple(None if h is None else h.cpu() / n_tokens for h in acts.heads)
    return Importance(
        architecture=arch,
        heads=heads,
        kv_groups=tuple(
            None if h is None else h.unflatten(0, (p.num_kv_heads, -1)).sum(-1) for h, p in zip(heads, acts.parts)
        ),
        ffn=tuple(None if f is None else f.cpu() / n_tokens for f in acts.ffn),
        hidden=acts.hidden.cpu() / (n_tokens * len(acts.norms)),
        block_influence=1.0 - acts.cos.cpu() / n_tokens,
        skip_loss=skip,
        meta=replace(meta, base_loss=base),
        expert_frequency=tuple(None if r is None else r.cpu() / n_tokens for r in acts.routed),
        expert_output=tuple(None if o is None else o.cpu() / n_tokens for o in acts.expert_out),
        expert_ffn=tuple(
            None if f is None or r is None else f.cpu() / r.cpu().clamp(min=1).unsqueeze(-1)
            for f, r in zip(acts.expert_ffn, acts.routed)
        ),
        shared_ffn=tuple(None if f is None else f.cpu() / n_tokens for f in acts.shared),
        mamba_heads=tuple(None if h is None else h.cpu() / n_tokens for h in acts.mamba),
        routing_mass=tuple(None if m is None else m.cpu() / n_tokens for m in acts.rank_mass),
        expert_gate_mass=tuple(None if g is None else g.cpu() / n_tokens for g in acts.gate_mass),
    )


def _skipped_loss_sum(model: Any, layers: list[Any], i: int, acts: _Activations, batch: torch.Tensor) -> float:
    """:func:`_loss_sum` of ``batch`` with layer ``i`` skipped. Layers ``0..i`` would recompute what
    the full pass gave layer ``i`` as input, so they return that saved input instead of running
    (about half the layer passes of skipping one layer per full pass; the later layers see the same
    tensor, so the loss is the same float). A layer that returns a tuple is skipped by
    :func:`~autocompress_opt.hf.adapters.bypass_layer` on a full pass instead."""
    if not acts.bare:
        handle = bypass_layer(layers[i])
        try:
            return _loss_sum(model, batch)
        finally:
            handle.remove()
    hidden = acts.inputs[i]
    saved = [layer.__dict__.get("forward", _NO_FORWARD) for layer in layers[: i + 1]]
    for layer in layers[: i + 1]:
        layer.forward = lambda *args, **kwargs: hidden
    try:
        return _loss_sum(model, batch)
    finally:
        for layer, forward in zip(layers[: i + 1], saved):
            if forward is _NO_FORWARD:
                del layer.forward  # the class's forward again
            else:
                layer.forward = forward  # a wrapper someone installed (accelerate's device hooks)


_NO_FORWARD = object()


ESTIMATORS.register("minitron", _minitron)

"""Expert pruning of a mixture-of-experts or hybrid parent: keep the most used routed experts, the most
active channels of each (and of the shared expert), a smaller top-``k``, and the most active Mamba-2
heads; mask the parent, or slice it into the family's plain model.

Three steps, as for dense parents (:mod:`autocompress_opt.prune.slicing`), for the families the experts
path handles (:data:`~autocompress_opt.hf.adapters.MOE_ADAPTERS`: Qwen3-MoE, Nemotron-H):

1. :func:`expert_masks` — parent + :class:`~autocompress_opt.prune.importance.Importance` + a point of
   the sparse axes (``num_experts``, ``experts_per_token``, ``expert_width``, ``shared_width``,
   ``mamba_heads``: the plan-mode search's choices, :data:`~autocompress_opt.arch.hybrid.SPARSE_CHOICES`,
   those the parent has a sub-block for) → :class:`~autocompress_opt.prune.masking.Masks`. Per MoE layer
   the kept experts are the ``num_experts`` with the highest ``expert_frequency`` (ties: higher
   ``expert_gate_mass``, then ``expert_output``, then the lower index), each keeps its ``expert_width``
   channels of highest ``expert_ffn``, the shared expert its ``shared_width`` of highest ``shared_ffn``;
   per Mamba-2 layer the ``mamba_heads`` of highest score, the same number per group
   (:mod:`autocompress_opt.prune.mamba`).
2. :func:`~autocompress_opt.prune.masking.apply_masks` — the parent computing them (dropped experts'
   router logits ``-inf`` before the top-``k``, masked channels and heads zeroed).
3. :func:`slice_experts` / :func:`export_experts` — the model of the family with the stacked expert
   tensors, the router rows, the shared expert and the Mamba-2 mixers cut to what is kept, and the
   config's sizes set (:data:`CONFIG_KEYS`); its logits equal the masked parent's (tested, float32). A
   plain config has one size per layer kind, so that child needs the same number of experts, channels
   per expert, top-``k`` and heads in every layer of a kind. Nemotron-H also has a per-layer form,
   NVIDIA's "Puzzle" (:mod:`autocompress_opt.hf.puzzle`, ``model_type "nemotron_h_puzzle"``, which
   llama.cpp converts): there each MoE layer keeps its own channels per expert and top-``k``, while the
   experts kept, the shared expert's channels and the Mamba-2 heads stay one number for the model.

Whole layers are cut by :func:`slice_layers` (the model of the kept layers, each of its kind), attention
heads by :func:`slice_heads` (:func:`head_choice`: a dense plan's rule) and residual channels by
:func:`slice_hidden` (:func:`hidden_choice`: the highest-scoring channels, as a dense plan keeps them),
after which the three steps run on that model. Dense FFN channels of a MoE / hybrid parent are not
pruned here: :func:`slice_experts` refuses masks that prune them (or heads and hidden channels: cut
them first).
"""

from __future__ import annotations

import copy
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from autocompress_opt.arch.hybrid import SPARSE_CHOICES, sparse_limits
from autocompress_opt.errors import ConfigError, check_int, suggest
from autocompress_opt.hf.adapters import FamilyAdapter, LayerParts, model_type_of, moe_adapter
from autocompress_opt.prune.export import OutputExistsError
from autocompress_opt.prune.importance import Importance, ranked
from autocompress_opt.prune.mamba import mamba_layer_mask, slice_mamba_state, uniform_mamba_heads
from autocompress_opt.prune.masking import LayerMask, Masks
from autocompress_opt.prune.plan import _top, layer_heads

__all__ = [
    "CONFIG_KEYS",
    "EXPERT_CHOICES",
    "expert_masks",
    "export_experts",
    "head_choice",
    "head_masks",
    "hidden_choice",
    "slice_experts",
    "slice_heads",
    "slice_hidden",
    "slice_layers",
]

# The sparse axes this module prunes (named as the plan-mode search's choices, arch/hybrid.py).
EXPERT_CHOICES: tuple[str, ...] = SPARSE_CHOICES
# Per family (model_type), the config key each kept size is written to. Sources: transformers 5.24
# Qwen3MoeConfig and NemotronHConfig (NemotronHMamba2Mixer's inner width is mamba_num_heads * mamba_head_dim).
CONFIG_KEYS: dict[str, dict[str, str]] = {
    "qwen3_moe": {
        "num_experts": "num_experts",
        "experts_per_token": "num_experts_per_tok",
        "expert_width": "moe_intermediate_size",
    },
    "mixtral": {
        "num_experts": "num_local_experts",
        "experts_per_token": "num_experts_per_tok",
        "expert_width": "intermediate_size",
    },
    "nemotron_h": {
        "num_experts": "n_routed_experts",
        "experts_per_token": "num_experts_per_tok",
        "expert_width": "moe_intermediate_size",
        "shared_width": "moe_shared_expert_intermediate_size",
        "mamba_heads": "mamba_num_heads",
    },
}
# Nemotron-H's per-layer form (hf/puzzle.py): the same keys, each MoE layer's width and top-k in its
# block_configs entry. The families whose MoE layers may differ in width and top-k: Nemotron-H's.
_PUZZLE = "nemotron_h_puzzle"
CONFIG_KEYS[_PUZZLE] = CONFIG_KEYS["nemotron_h"]
_PER_LAYER_FORM = ("nemotron_h", _PUZZLE)


def expert_masks(model: Any, importance: Importance, point: Mapping[str, int]) -> Masks:
    """Masks that keep, in every MoE layer of ``model``, the point's experts, channels and top-``k``, and
    in every Mamba-2 layer its heads (module docstring); every attention head, dense FFN channel and
    hidden channel is kept.

    ``point`` maps a subset of :data:`EXPERT_CHOICES` to sizes; an absent one stays the parent's (each
    MoE layer's own in a Puzzle parent, whose layers differ in width and top-``k``; a given one must fit
    every layer). Raises :class:`ConfigError` for an unknown key (with a suggestion), a choice the
    parent has no sub-block for, a size outside ``1..parent size``, ``experts_per_token`` above the experts kept,
    Mamba-2 heads not a multiple of the groups, or scores of another model.
    """
    adapter = moe_adapter(model)
    parts = adapter.all_layer_parts(model)
    arch = adapter.architecture(model)
    if not any(p.moe is not None or p.mamba is not None for p in parts):
        raise ConfigError("the model has no mixture-of-experts or Mamba-2 layer: nothing for expert_masks to prune")
    sizes = _point_sizes(point, _limits(arch))
    if importance.architecture.layers != arch.layers:
        raise ConfigError("the importance scores were computed for another architecture than this model's")
    layers = []
    base = Masks.ones(arch)
    for i, (p, mask) in enumerate(zip(parts, base.layers)):
        if p.moe is not None:  # a MoE choice the point leaves out: the layer's own size
            mask = _layer_mask(importance, i, p, mask, {k: v for k, v in sizes.items() if k in point})
        if p.mamba is not None and "mamba_heads" in sizes:
            mask = mamba_layer_mask(importance, i, p, mask, sizes["mamba_heads"])
        layers.append(mask)
    return replace(base, layers=tuple(layers))


def _limits(arch: Any) -> dict[str, int]:
    """The largest size of each choice the parent has a sub-block for: the smallest MoE layer's for the
    MoE choices (a Puzzle parent's layers differ), :func:`sparse_limits` for the others."""
    limits = {k: v for k, v in sparse_limits(arch).items() if k in EXPERT_CHOICES}
    moe = [layer.moe for layer in arch.layers if layer.moe is not None]
    for key in ("num_experts", "experts_per_token", "expert_width", "shared_width"):
        if key in limits:
            limits[key] = min(getattr(m, key) for m in moe)
    return limits


def _point_sizes(point: Mapping[str, int], limits: dict[str, int]) -> dict[str, int]:
    """The point's sizes, each parent limit for a choice it leaves out."""
    for key in point:
        if key not in EXPERT_CHOICES:
            raise ConfigError(
                f"unknown expert choice {key!r}{suggest(key, EXPERT_CHOICES)}; valid: {', '.join(limits)}"
            )
        if key not in limits:
            raise ConfigError(f"the model has no sub-block for the choice {key!r}; valid: {', '.join(limits)}")
    sizes = {key: check_int(point.get(key, limit), key, 1, maximum=limit) for key, limit in limits.items()}
    if "num_experts" in sizes and sizes["experts_per_token"] > sizes["num_experts"]:
        raise ConfigError(
            f"experts_per_token={sizes['experts_per_token']} exceeds the {sizes['num_experts']} experts kept "
            f"(num_experts={sizes['num_experts']}); valid: 1..{sizes['num_experts']}"
        )
    return sizes


def _layer_mask(imp: Importance, i: int, p: LayerParts, mask: LayerMask, sizes: dict[str, int]) -> LayerMask:
    import torch

    frequency, output, channels = imp.expert_frequency[i], imp.expert_output[i], imp.expert_ffn[i]
    if frequency is None or output is None or channels is None:
        raise ConfigError(f"the importance scores have no expert scores for MoE layer {i}")
    shared, shared_scores = None, imp.shared_ffn[i]
    if p.shared_width:
        if shared_scores is None:
            raise ConfigError(f"the importance scores have no shared-expert scores for MoE layer {i}")
        shared = torch.zeros(p.shared_width, dtype=torch.bool)
        shared[ranked(shared_scores)[: sizes.get("shared_width", p.shared_width)]] = True
    order = ranked(output)  # most used first; ties: more gate mass, then larger output, then the lower index
    gate = imp.expert_gate_mass[i] if i < len(imp.expert_gate_mass) else None
    if gate is not None:
        order = order[torch.argsort(gate[order], descending=True, stable=True)]
    order = order[torch.argsort(frequency[order], descending=True, stable=True)]
    experts = torch.zeros(p.num_experts, dtype=torch.bool)
    experts[order[: sizes.get("num_experts", p.num_experts)]] = True
    expert_ffn = torch.zeros(p.num_experts, p.expert_width, dtype=torch.bool)
    for e in range(p.num_experts):
        expert_ffn[e, ranked(channels[e])[: sizes.get("expert_width", p.expert_width)]] = True
    k = sizes.get("experts_per_token", int(p.router.top_k))
    return replace(mask, experts=experts, expert_ffn=expert_ffn, experts_per_token=k, shared_ffn=shared)


# ------------------------------------------------------------------------------------ slicing
class _MoESize(NamedTuple):
    """What one MoE layer of the child keeps."""

    experts: int
    top_k: int
    width: int  # channels per expert
    shared: int  # shared-expert channels (0: none)


def slice_experts(model: Any, masks: Masks, *, adapter: FamilyAdapter | None = None) -> Any:
    """The family's model holding ``model``'s weights with the experts, expert and shared-expert
    channels, top-``k`` and Mamba-2 heads of ``masks`` (copied, never shared); same dtype and device,
    eval mode. Its logits equal ``apply_masks(model, masks)``'s.

    The child is the family's plain model when every MoE layer keeps one size (experts, top-``k``,
    channels per expert, shared channels); a Nemotron-H child whose MoE layers differ in channels per
    expert and/or top-``k`` is Nemotron-H's per-layer "Puzzle" form
    (:class:`~autocompress_opt.hf.puzzle.NemotronHPuzzleForCausalLM`, each MoE layer's width and top-``k``
    in ``block_configs``), from a plain or a Puzzle parent (a Puzzle parent cut to one size gives the
    plain model).

    Raises :class:`ConfigError` when the masks prune anything else (attention heads, hidden channels and
    whole layers: cut them first with :func:`slice_heads`, :func:`slice_hidden`, :func:`slice_layers`;
    dense FFN channels and single sub-blocks: not for MoE / hybrid parents), keep different
    channel counts in the experts of one layer, or differ between layers where no form holds the
    difference: the experts kept and the shared width in Nemotron-H (global in its Puzzle form too),
    anything in Qwen3-MoE (no per-layer form its engines read), Mamba-2 heads.
    """

    from autocompress_opt.prune.masking import apply_masks

    adapter = adapter or moe_adapter(model)
    parts = adapter.all_layer_parts(model)
    apply_masks(model, masks, adapter=adapter).remove()  # the shape checks, nothing installed
    config = _child_config(model.config, parts, masks)
    return _built(model, config, lambda: _sliced_state(model, parts, masks), "expert slicing")


def _child_config(parent: Any, parts: list[LayerParts], masks: Masks) -> Any:
    """The parent's config with the kept sizes: a copy of its own class when every MoE layer keeps one
    size, else (Nemotron-H) the Puzzle form; a Puzzle parent's child is plain again when uniform."""
    model_type = model_type_of(parent)
    keys = CONFIG_KEYS[model_type]
    layers = _moe_sizes(parts, masks)
    uniform = len(set(layers.values())) <= 1
    config = copy.deepcopy(parent)  # setattr, not a dict: the config class maps its aliases
    for key, value in _global_sizes(parts, masks, layers, model_type).items():
        setattr(config, keys[key], value)
    if uniform and model_type != _PUZZLE:
        return config
    from autocompress_opt.hf.puzzle import plain_config, puzzle_config

    # Each MoE layer's width and top-k, in the keys a Puzzle block_configs entry holds (hf/puzzle.py).
    per_layer = {i: {keys["expert_width"]: s.width, keys["experts_per_token"]: s.top_k} for i, s in layers.items()}
    config = puzzle_config(config, per_layer)
    return plain_config(config) if uniform else config


def _moe_sizes(parts: list[LayerParts], masks: Masks) -> dict[int, _MoESize]:
    """What each MoE layer keeps; raises when masks prune anything but experts, their channels and
    Mamba-2 heads, remove a MoE block, or keep different channel counts in the experts of one layer."""
    if not bool(masks.hidden.all()):
        raise ConfigError(
            "slice_experts prunes experts only: the masks drop hidden channels; cut them first with slice_hidden"
        )
    layers: dict[int, _MoESize] = {}
    for i, (p, m) in enumerate(zip(parts, masks.layers)):
        for name, tensor, present in (("heads", m.heads, p.attention is not None), ("ffn", m.ffn, p.mlp is not None)):
            if present and (tensor is None or not bool(tensor.all())):
                raise ConfigError(
                    f"slice_experts prunes experts only: masks.layers[{i}].{name} prunes the layer's {name} "
                    "(not yet for MoE parents, issue 30)"
                )
        if p.moe is None:
            continue
        if m.experts is None:
            raise ConfigError(f"slice_experts cannot remove the MoE block of layer {i}; keep at least one expert")
        widths = {p.expert_width} if m.expert_ffn is None else set(m.expert_ffn[m.experts.bool()].sum(-1).tolist())
        if len(widths) != 1:
            raise ConfigError(
                f"layer {i} keeps {sorted(widths)} channels in different experts; a config has one width per layer"
            )
        k = int(p.router.top_k) if m.experts_per_token is None else m.experts_per_token
        shared = p.shared_width if m.shared_ffn is None else int(m.shared_ffn.sum())
        layers[i] = _MoESize(int(m.experts.sum()), k, int(widths.pop()), shared)
    return layers


def _global_sizes(
    parts: list[LayerParts], masks: Masks, layers: dict[int, _MoESize], model_type: str
) -> dict[str, int]:
    """The sizes the child's config holds once (:data:`CONFIG_KEYS` names): experts kept, shared width and
    Mamba-2 heads, plus top-``k`` and expert width when every MoE layer keeps the same; raises where the
    layers differ in what no form of the family holds per layer."""
    distinct = set(layers.values())
    if len(distinct) > 1 and model_type not in _PER_LAYER_FORM:
        raise ConfigError(
            f"the MoE layers are pruned to different sizes ({_listing(layers, _MoESize._fields)}); a plain "
            f"{model_type} config has one size and its engines read no per-layer form: keep the same experts, "
            "top-k, width and shared width in every MoE layer"
        )
    if len({(s.experts, s.shared) for s in distinct}) > 1:
        raise ConfigError(
            f"the MoE layers keep different numbers of experts or shared widths "
            f"({_listing(layers, ('experts', 'shared'))}); Nemotron-H's per-layer (Puzzle) form holds one "
            "n_routed_experts and one moe_shared_expert_intermediate_size (llama.cpp reads both as global): "
            "keep the same in every MoE layer (expert width and top-k may differ)"
        )
    sizes: dict[str, int] = {}
    if layers:
        first = next(iter(layers.values()))
        sizes["num_experts"] = first.experts
        if len(distinct) == 1:
            sizes.update(experts_per_token=first.top_k, expert_width=first.width)
        if any(p.shared_expert is not None for p in parts):
            if first.shared == 0:
                raise ConfigError("slice_experts cannot remove the shared expert; keep at least one of its channels")
            sizes["shared_width"] = first.shared
    heads = uniform_mamba_heads(parts, masks.layers)
    if heads is not None:
        sizes["mamba_heads"] = heads
    return sizes


def _listing(layers: dict[int, _MoESize], fields: tuple[str, ...]) -> str:
    """``layers [1, 5]: experts 6, top_k 2; layers [3]: ...``: the MoE layers grouped by ``fields``."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, size in layers.items():
        groups.setdefault(tuple(getattr(size, f) for f in fields), []).append(i)
    return "; ".join(
        f"layers {ls}: " + ", ".join(f"{f} {v}" for f, v in zip(fields, values)) for values, ls in groups.items()
    )


def _sliced_state(model: Any, parts: list[LayerParts], masks: Masks) -> dict[str, Any]:
    """``model``'s state dict with each MoE layer's router rows, stacked expert tensors and shared expert
    cut, and each Mamba-2 mixer's tensors cut to its kept heads."""
    import torch

    names = {id(t): name for name, t in model.named_parameters(remove_duplicate=False)}
    names.update({id(t): name for name, t in model.named_buffers(remove_duplicate=False)})
    state = {name: t.detach().clone() for name, t in model.state_dict().items()}
    for p, m in zip(parts, masks.layers):
        if p.mamba is not None:
            slice_mamba_state(p, m, state, names)
        if p.moe is None or m.experts is None:
            continue
        kept = torch.nonzero(m.experts.bool()).flatten()  # (E',) ascending: the child's expert order
        ffn = m.expert_ffn if m.expert_ffn is not None else torch.ones(p.num_experts, p.expert_width, dtype=torch.bool)
        channels = torch.stack([torch.nonzero(ffn[e].bool()).flatten() for e in kept.tolist()])  # (E', F')
        on = p.expert_down.device
        kept, channels = kept.to(on), channels.to(on)
        f = p.expert_width
        gate_up = p.expert_gate_up[kept]  # (E', 2F, L) gated; (E', F, L) ungated
        rows = torch.cat([channels, channels + f], dim=1) if p.gated else channels  # gate rows, then up rows
        state[names[id(p.expert_gate_up)]] = torch.gather(
            gate_up, 1, rows[..., None].expand(-1, -1, gate_up.shape[-1])
        ).clone()
        down = p.expert_down[kept]  # (E', L, F)
        state[names[id(p.expert_down)]] = torch.gather(
            down, 2, channels[:, None, :].expand(-1, down.shape[1], -1)
        ).clone()
        for per_expert in (p.router.weight, getattr(p.router, "bias", None), _correction(p.router)):
            if per_expert is not None:  # router rows (E', D), its bias and correction bias (E',)
                state[names[id(per_expert)]] = per_expert[kept].detach().clone()
        if p.shared_expert is not None and m.shared_ffn is not None and not bool(m.shared_ffn.all()):
            _slice_mlp(p.shared_expert, m.shared_ffn, state, names)
    return state


def _correction(router: Any) -> Any:
    """The router's per-expert score correction (Nemotron-H / DeepSeek-V3 ``e_score_correction_bias``, a buffer)."""
    return getattr(router, "e_score_correction_bias", None)


def _slice_mlp(mlp: Any, keep: Any, state: dict[str, Any], names: dict[int, str]) -> None:
    """Cut an ungated MLP (``up_proj`` rows, ``down_proj`` columns) to the channels ``keep`` ``(S,)`` marks."""
    import torch

    if hasattr(mlp, "gate_proj"):  # the adapters that reach here have ungated shared experts only
        raise AssertionError("slicing a gated shared expert is not written")
    index = torch.nonzero(keep.bool()).flatten().to(mlp.up_proj.weight.device)
    state[names[id(mlp.up_proj.weight)]] = mlp.up_proj.weight.detach().index_select(0, index).clone()
    if mlp.up_proj.bias is not None:
        state[names[id(mlp.up_proj.bias)]] = mlp.up_proj.bias.detach().index_select(0, index).clone()
    state[names[id(mlp.down_proj.weight)]] = mlp.down_proj.weight.detach().index_select(1, index).clone()


def _built(model: Any, config: Any, state: Callable[[], dict[str, Any]], what: str) -> Any:
    """The family's model of ``config``, built without initialising and loaded with ``state()`` (every
    weight it has), on ``model``'s device and dtype, tied where the config ties, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    weight = next(model.parameters())
    with no_init_weights():
        child = AutoModelForCausalLM.from_config(config, dtype=weight.dtype)
    child.to(weight.device)
    with torch.no_grad():
        weights = state()
    missing, unexpected = child.load_state_dict(weights, strict=False)
    if missing or unexpected:  # an internal error: a weight the cut did not produce
        raise AssertionError(f"{what} left {missing} unset and produced unused {unexpected}")
    if child.config.tie_word_embeddings:
        child.tie_weights()
    return child.eval()


# ------------------------------------------------------------------------------------ depth
def slice_layers(model: Any, keep: Sequence[int], *, adapter: FamilyAdapter | None = None) -> Any:
    """The family's model holding ``model``'s layers ``keep`` (parent indices, any order; each once) and
    nothing else: same embeddings, final norm and head, each kept layer's weights copied (never shared),
    renumbered in parent order; same dtype and device, eval mode. Its logits equal the parent's with
    the other layers skipped (every sub-block's mask None, :func:`~autocompress_opt.prune.masking.apply_masks`).

    The config keeps each layer's kind: Qwen3-MoE's dense layers become ``mlp_only_layers`` (with
    ``decoder_sparse_step`` 1), Nemotron-H's ``layers_block_type`` and a Puzzle parent's
    ``block_configs`` keep the kept layers' entries. This is how a MoE or hybrid parent is cut in depth
    before its experts are: :func:`expert_masks` and :func:`slice_experts` then work on the cut model."""

    adapter = adapter or moe_adapter(model)
    layers = adapter.layers(model)
    kept = sorted({check_int(i, "kept layer", 0, maximum=len(layers) - 1) for i in keep})
    if len(kept) != len(keep) or not kept:
        raise ConfigError(f"kept layers {list(keep)}: give each layer once, at least one of 0..{len(layers) - 1}")
    prefix = next(name for name, module in model.named_modules() if module is layers) + "."
    config = _layers_config(model.config, kept, len(layers))
    renumber = {old: new for new, old in enumerate(kept)}

    def state() -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, tensor in model.state_dict().items():
            if name.startswith(prefix):
                index, _, rest = name[len(prefix) :].partition(".")
                if int(index) not in renumber:
                    continue
                name = f"{prefix}{renumber[int(index)]}.{rest}"
            out[name] = tensor.detach().clone()
        return out

    return _built(model, config, state, "layer slicing")


def _layers_config(config: Any, kept: list[int], num_layers: int) -> Any:
    """``config`` with only the layers ``kept`` (sorted parent indices), each of its kind."""
    data = config.to_dict()
    model_type = model_type_of(config)
    if model_type == "qwen3_moe":  # which layers are sparse, from its rule (modeling_qwen3_moe's decoder layer)
        step, dense = int(config.decoder_sparse_step), set(config.mlp_only_layers or ())
        sparse = [i not in dense and config.num_experts > 0 and (i + 1) % step == 0 for i in range(num_layers)]
        data.update(decoder_sparse_step=1, mlp_only_layers=[j for j, i in enumerate(kept) if not sparse[i]])
    for key in ("layer_types", "layers_block_type", "block_configs"):  # per-layer lists: the kept entries
        if isinstance(data.get(key), list) and len(data[key]) == num_layers:
            data[key] = [data[key][i] for i in kept]
    data["num_hidden_layers"] = len(kept)
    return type(config).from_dict(data)


# ------------------------------------------------------------------------------------ heads
def head_choice(importance: Importance, arch: Any, num_kv_heads: int, q_per_kv: int) -> dict[int, list[int]]:
    """The query heads each attention layer of ``arch`` keeps for ``num_kv_heads`` KV groups of ``q_per_kv``
    query heads: the highest-scoring KV groups (``importance.kv_groups``), and within each the
    highest-scoring query heads (``importance.heads``), the rule of a dense parent's plan
    (:func:`~autocompress_opt.prune.plan.plan_pruning`); ascending head indices per layer."""
    out: dict[int, list[int]] = {}
    for i, layer in enumerate(arch.layers):
        if not layer.attention:
            continue
        kv_scores, head_scores = importance.kv_groups[i], importance.heads[i]
        if kv_scores is None or head_scores is None:
            raise ConfigError(f"the importance scores have no head scores for attention layer {i}")
        check_int(num_kv_heads, "num_kv_heads", 1, maximum=layer.num_kv_heads)
        check_int(q_per_kv, "q_per_kv", 1, maximum=layer.num_heads // layer.num_kv_heads)
        out[i] = list(layer_heads(kv_scores, head_scores, num_kv_heads, q_per_kv)[0])
    return out


def slice_heads(model: Any, heads: Mapping[int, Sequence[int]], *, adapter: FamilyAdapter | None = None) -> Any:
    """The family's model holding ``model``'s weights with each attention layer ``i`` keeping only the
    query heads ``heads[i]`` (every attention layer listed) and the KV groups they read; the same number
    of KV groups and of query heads per group in every layer (a plain config holds one of each) and
    ``head_dim`` unchanged. Copied, never shared; same dtype and device, eval mode. Its logits equal
    ``model``'s with the other query heads' outputs masked
    (:func:`~autocompress_opt.prune.masking.apply_masks`)."""
    from autocompress_opt.prune.slicing import head_rows  # materialize's row rule (slicing imports torch)

    adapter = adapter or moe_adapter(model)
    parts = adapter.all_layer_parts(model)
    attention = [i for i, p in enumerate(parts) if p.attention is not None]
    if sorted(heads) != attention:
        raise ConfigError(
            f"heads lists layers {sorted(heads)}; give the kept heads of every attention layer {attention}"
        )
    shapes = set()
    kept: dict[int, tuple[list[int], list[int]]] = {}
    for i in attention:
        p = parts[i]
        r = p.num_heads // p.num_kv_heads
        q = sorted({check_int(h, f"layer {i} head", 0, maximum=p.num_heads - 1) for h in heads[i]})
        groups = sorted({h // r for h in q})
        per_group = {g: sum(1 for h in q if h // r == g) for g in groups}
        if not q or len(set(per_group.values())) != 1:
            raise ConfigError(
                f"layer {i} keeps heads {q}: every kept KV group must keep the same number of query heads"
            )
        shapes.add((len(groups), len(q) // len(groups)))
        kept[i] = (q, groups)
    if len(shapes) != 1:
        raise ConfigError(
            f"the attention layers keep different (KV groups, heads per group) {sorted(shapes)}; a config holds one"
        )
    num_kv, per = shapes.pop()
    config = copy.deepcopy(model.config)
    config.head_dim = parts[attention[0]].head_dim  # explicit: a derived head_dim would follow the head count
    config.num_attention_heads, config.num_key_value_heads = num_kv * per, num_kv
    names = {id(t): name for name, t in model.named_parameters(remove_duplicate=False)}

    def state() -> dict[str, Any]:
        out = {name: t.detach().clone() for name, t in model.state_dict().items()}
        for i, (q, groups) in kept.items():
            p = parts[i]
            on = p.q_proj.weight.device
            rows = {"q": head_rows(q, p.head_dim, on), "kv": head_rows(groups, p.head_dim, on)}
            for proj, which in (("q_proj", "q"), ("k_proj", "kv"), ("v_proj", "kv")):
                module = getattr(p, proj)
                out[names[id(module.weight)]] = module.weight.detach()[rows[which]].clone()
                if module.bias is not None:
                    out[names[id(module.bias)]] = module.bias.detach()[rows[which]].clone()
            o = p.o_proj.weight
            out[names[id(o)]] = o.detach()[:, rows["q"]].clone()
        return out

    return _built(model, config, state, "head slicing")


def head_masks(masks: Masks, arch: Any, heads: Mapping[int, Sequence[int]]) -> Masks:
    """``masks`` with each attention layer ``i`` of ``heads`` keeping only the query heads ``heads[i]``
    (what :func:`slice_heads` of the same ``heads`` computes)."""
    import torch

    def kept(i: int) -> Any:
        return torch.isin(torch.arange(arch.layers[i].num_heads), torch.tensor(list(heads[i])))

    return replace(
        masks, layers=tuple(replace(m, heads=kept(i)) if i in heads else m for i, m in enumerate(masks.layers))
    )


def export_experts(model: Any, masks: Masks, out_dir: str | Path, *, force: bool = False) -> Path:
    """:func:`slice_experts`, saved in ``out_dir`` (created): a plain checkpoint of the family, or a
    ``nemotron_h_puzzle`` one when the child is the Puzzle form (transformers loads it once
    :mod:`autocompress_opt.hf.puzzle` is imported, as :func:`~autocompress_opt.hf.loading.load_model`
    does); ``AutoModelForCausalLM.from_pretrained(out_dir)`` gives the masked parent's logits. Raises
    :class:`OutputExistsError` for a non-empty ``out_dir`` without ``force``."""
    out = Path(out_dir).expanduser()
    if out.exists() and any(out.iterdir()):
        if not force:
            raise OutputExistsError(f"{str(out)!r} is not empty; pass force=True to replace it")
        shutil.rmtree(out)
    child = slice_experts(model, masks)
    child.save_pretrained(out)
    return out


# ------------------------------------------------------------------------------ hidden size
def hidden_choice(importance: Importance, hidden_size: int) -> list[int]:
    """The ``hidden_size`` residual channels of highest ``importance.hidden`` (ties: the lower index), in
    channel order: the channels a dense plan keeps (:func:`~autocompress_opt.prune.plan.plan_pruning`'s rule)."""
    check_int(hidden_size, "hidden_size", 1, maximum=int(importance.hidden.shape[0]))
    return list(_top(importance.hidden, hidden_size))


def slice_hidden(model: Any, channels: Sequence[int], *, adapter: FamilyAdapter | None = None) -> Any:
    """The family's model holding ``model``'s weights with only the residual channels ``channels`` (any
    order; each once): the embedding and head columns, every hidden norm, and each tensor that reads or
    writes the residual stream, in every layer kind (attention projections, dense FFN, router, stacked
    experts or the latent projections around them, shared expert, Mamba-2 ``in_proj`` / ``out_proj``).
    ``head_dim`` is written explicitly (a derived one would follow the hidden size). Copied, never
    shared; same dtype and device, eval mode. Its logits equal ``model``'s with the other channels masked
    (:class:`~autocompress_opt.prune.masking.Masks` ``hidden``: zeroed in the residual stream, every
    hidden RMSNorm over the kept channels)."""
    import torch

    adapter = adapter or moe_adapter(model)
    parts = adapter.all_layer_parts(model)
    d = adapter.embedding(model).embedding_dim
    keep = sorted({check_int(c, "hidden channel", 0, maximum=d - 1) for c in channels})
    if len(keep) != len(channels) or not keep:
        raise ConfigError(f"{len(channels)} hidden channels given: give each of 0..{d - 1} at most once, at least one")
    config = copy.deepcopy(model.config)
    config.hidden_size = len(keep)
    head_dims = {p.head_dim for p in parts if p.attention is not None}
    if head_dims:
        config.head_dim = head_dims.pop()
    names: dict[int, list[str]] = {}
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        names.setdefault(id(t), []).append(name)
    cuts: list[tuple[Any, int]] = [(adapter.embedding(model).weight, 1)]
    head = model.get_output_embeddings()
    if head is not None and head.weight is not adapter.embedding(model).weight:
        cuts.append((head.weight, 1))
    cuts += [(t, 0) for norm in adapter.hidden_norms(model) for t in (norm.weight, getattr(norm, "bias", None))]
    for p in parts:
        reads = [p.q_proj, p.k_proj, p.v_proj, p.gate_proj, p.up_proj]
        writes = [p.o_proj, p.down_proj]
        if p.moe is not None:
            reads.append(p.router)
            latent = isinstance(p.latent_in, torch.nn.Linear)
            if latent:
                reads.append(p.latent_in)
                writes.append(p.latent_out)
            else:  # the stacked experts read and write the residual width: (E, 2F, D) and (E, D, F)
                cuts += [(p.expert_gate_up, 2), (p.expert_down, 1)]
            if p.shared_expert is not None:
                reads += [getattr(p.shared_expert, "gate_proj", None), p.shared_expert.up_proj]
                writes.append(p.shared_expert.down_proj)
        if p.mamba is not None:
            reads.append(p.mamba.in_proj)
            writes.append(p.mamba.out_proj)
        cuts += [(m.weight, 1) for m in reads if m is not None]
        cuts += [(t, 0) for m in writes if m is not None for t in (m.weight, getattr(m, "bias", None))]

    def state() -> dict[str, Any]:
        out = {name: t.detach().clone() for name, t in model.state_dict().items()}
        for tensor, axis in cuts:
            if tensor is None:
                continue
            if tensor.shape[axis] != d:  # an internal error: a tensor taken for a residual one
                raise AssertionError(f"{names[id(tensor)][0]} has {tensor.shape[axis]} on axis {axis}, not {d}")
            cut = tensor.detach().index_select(axis, torch.tensor(keep, device=tensor.device)).clone()
            for name in names[id(tensor)]:
                if name in out:
                    out[name] = cut
        return out

    return _built(model, config, state, "hidden slicing")

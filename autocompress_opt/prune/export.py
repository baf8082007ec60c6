"""Write a pruned model as a checkpoint that reloads and serves, with a model card.

:func:`export_model` writes ``config.json`` + ``model.safetensors`` (+ the tokenizer when given)
+ ``README.md`` + ``autocompress_card.json``:

* a **uniform** architecture as a plain checkpoint of the parent's family (``LlamaForCausalLM``,
  ``Qwen3ForCausalLM``, ``Gemma3ForCausalLM``...) that ``AutoModelForCausalLM.from_pretrained(dir)``
  loads with identical logits, no package needed (a Gemma 3 with a pruned hidden size carries the
  parent's embedding scale in its weights: see :mod:`autocompress_opt.prune.slicing`);
* a **heterogeneous** one as the package's DeciLM-style ``autocompress_decilm`` config (per-layer
  ``block_configs``, see :mod:`autocompress_opt.hf.hetero_model`), which loads through the same call
  once ``autocompress_opt.hf.hetero_model`` is imported (:func:`load_exported` does it), without
  ``trust_remote_code``;
* with ``decilm=True``, a heterogeneous Llama-family model as the **DeciLM** checkpoint that the
  serving engines read (:func:`decilm_config`): ``model_type "nemotron-nas"``,
  ``architectures ["DeciLMForCausalLM"]``, the keys vLLM's ``nemotron_nas`` and llama.cpp's ``deci``
  converter read (``attention.no_op``, ``n_heads_in_group``, ``ffn.ffn_mult``), and the small
  ``configuration_decilm.py`` that vLLM loads through ``auto_map`` with ``trust_remote_code`` (as
  NVIDIA's Nemotron-NAS checkpoints ship it). :func:`to_decilm` converts an existing export.
  :func:`load_exported` reads both heterogeneous forms.

Weights are written and read as safetensors only; nothing is pickled or unpickled. An existing
non-empty output directory is never touched without ``force=True``; with it, the new checkpoint is
written beside the old one first and swapped in only when complete.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.families import family
from autocompress_opt.errors import AutocompressError, ConfigError
from autocompress_opt.hf.adapters import MOE_ADAPTERS, adapter_for, architecture_mismatch, model_type_of, moe_adapter
from autocompress_opt.hf.hub import hub_kernel_kwargs
from autocompress_opt.prune.mtp import check_mtp, settle_mtp

__all__ = [
    "CARD_FILE",
    "DECILM_ARCHITECTURE",
    "DECILM_MODEL_TYPE",
    "OutputExistsError",
    "decilm_config",
    "decilm_ffn_mult",
    "decilm_ffn_width",
    "decilm_problems",
    "export_model",
    "load_exported",
    "model_card",
    "to_decilm",
    "write_card",
]

CARD_FILE = "autocompress_card.json"
_CARD_FORMAT = "autocompress-model-card/1"
# What vLLM's model registry and llama.cpp's converter dispatch on (vllm/model_executor/models/registry.py
# maps "DeciLMForCausalLM" to nemotron_nas; convert_hf_to_gguf registers DeciModel under it).
DECILM_MODEL_TYPE = "nemotron-nas"
DECILM_ARCHITECTURE = "DeciLMForCausalLM"
DECILM_CONFIG_CODE = "configuration_decilm.py"
# DeciLM rounds every FFN width up to a multiple of this (_ffn_mult_to_intermediate_size / _find_multiple
# in vLLM's nemotron_nas.py and llama.cpp's conversion/deci.py).
DECILM_FFN_MULTIPLE = 256


class OutputExistsError(AutocompressError, FileExistsError):
    """The output directory exists and is not empty, and ``force`` was not given."""


def export_model(
    model: Any,
    arch: Architecture,
    out_dir: str | Path,
    *,
    parent: str | Mapping[str, Any] | None = None,
    card: Mapping[str, Any] | None = None,
    tokenizer: Any = None,
    force: bool = False,
    decilm: bool = False,
    mtp: str = "drop",
    parent_dir: str | Path | None = None,
) -> Path:
    """Save ``model`` (whose structure is ``arch``) to ``out_dir``; returns the directory.

    Args:
        model: a transformers causal LM of a supported family or an ``AutocompressDeciLMForCausalLM``
            (e.g. from :func:`~autocompress_opt.prune.slicing.materialize`).
        arch: the model's architecture (fully dropped layers may be listed; they are not built).
        out_dir: the checkpoint directory; created with its parents.
        parent: what the model was pruned from (an id/path, or a mapping of details), for the card.
        card: JSON-safe extras for the model card; ``constraints`` and ``predicted_costs``
            (mappings) get their own README tables, every other key is listed as-is.
        tokenizer: saved beside the weights when given (``save_pretrained``).
        force: replace an existing non-empty ``out_dir``.
        decilm: write a heterogeneous ``arch`` as the engines' DeciLM checkpoint (:func:`decilm_config`)
            instead of the package's ``autocompress_decilm`` one; a uniform ``arch`` stays a plain
            family checkpoint either way. Raises :class:`ConfigError` naming what DeciLM cannot
            express (:func:`decilm_problems`) before anything is written.
        mtp / parent_dir: the parent's multi-token-prediction layers, ``drop`` (default) or ``keep``
            (copied from its checkpoint folder ``parent_dir``; :func:`~autocompress_opt.prune.mtp.settle_mtp`),
            recorded on the card as ``mtp``; nothing to do when the parent has none.

    A heterogeneous-class model whose ``arch`` is uniform is converted to the plain family class
    first. Raises :class:`OutputExistsError` for a non-empty ``out_dir`` without ``force``,
    :class:`ConfigError` when ``model`` does not have structure ``arch`` or ``card`` is not JSON-safe.
    """
    out = Path(out_dir).expanduser()
    check_mtp(mtp)
    # A MoE / hybrid model (e.g. a distilled expert child) is saved as it is: its family's own class.
    adapter = moe_adapter(model) if model_type_of(model) in MOE_ADAPTERS else adapter_for(model)
    mismatch = architecture_mismatch(arch.active(), adapter.architecture(model))
    if mismatch:
        raise ConfigError(f"the model does not have the given architecture ({mismatch})")
    card_data = model_card(arch, parent=parent, card=card, model_type=None)
    _check_out_dir(out, force)
    as_decilm = decilm and not arch.active().is_uniform
    if as_decilm:
        _raise_decilm_problems(arch.active())
    if adapter.heterogeneous and arch.active().is_uniform:
        model = _as_plain(model)
    card_data["model_type"] = DECILM_MODEL_TYPE if as_decilm else model.config.model_type
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; a checkpoint is meant to be shared
    try:
        model.save_pretrained(staging)
        if as_decilm:
            _write_decilm_config(staging, json.loads((staging / "config.json").read_text(encoding="utf-8")))
        mtp_record = settle_mtp(staging, choice=mtp, parent_dir=parent_dir)
        if mtp_record is not None:
            card_data["mtp"] = mtp_record
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        write_card(staging, card_data)
        for path in staging.iterdir():  # safetensors files are written owner-only
            path.chmod(0o644)
        _swap_in(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def _check_out_dir(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise OutputExistsError(f"output path {str(out)!r} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise OutputExistsError(f"output directory {str(out)!r} is not empty; pass force=True (--force) to replace it")


def _swap_in(staging: Path, out: Path) -> None:
    """Replace ``out`` with the complete ``staging`` directory."""
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)


def _as_plain(model: Any) -> Any:
    """The same weights in the parent family's plain class (heterogeneous class, uniform layers)."""
    from autocompress_opt.prune.plan import identity_plan
    from autocompress_opt.prune.slicing import materialize

    adapter = adapter_for(model)
    return materialize(model, identity_plan(adapter.architecture(model)), adapter=adapter)


def load_exported(directory: str | Path, **kwargs: Any) -> Any:
    """Load a checkpoint written by :func:`export_model` (safetensors only), in eval mode.

    Registers the heterogeneous model class first, so both kinds load through
    ``AutoModelForCausalLM.from_pretrained``; ``kwargs`` go to it (``dtype=``, ``device_map=``...).
    A DeciLM checkpoint (``model_type "nemotron-nas"``, :func:`to_decilm`) loads into the package's
    class, never through its ``auto_map`` code.
    """
    from transformers import AutoModelForCausalLM

    from autocompress_opt.hf.hetero_model import AutocompressDeciLMConfig, AutocompressDeciLMForCausalLM

    kwargs = {**hub_kernel_kwargs(), **kwargs}  # Hub kernels off unless asked for (here or by USE_HUB_KERNELS)
    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise ConfigError(f"{str(directory)!r} is not a checkpoint directory (no config.json)")
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    if config.get("model_type") == "nemotron_h_puzzle":  # the per-layer Nemotron-H: register its class
        from autocompress_opt.hf import puzzle  # noqa: F401
    if config.get("model_type") == DECILM_MODEL_TYPE:
        ours = AutocompressDeciLMConfig.from_decilm(config)
        return AutocompressDeciLMForCausalLM.from_pretrained(
            directory, config=ours, use_safetensors=True, **kwargs
        ).eval()
    return AutoModelForCausalLM.from_pretrained(directory, use_safetensors=True, **kwargs).eval()


# ---------------------------------------------------------------------------------- DeciLM
def decilm_ffn_width(ffn_mult: float, hidden_size: int) -> int:
    """The FFN width a DeciLM reader builds from ``ffn_mult``: ``ceil256(int(2·ffn_mult·hidden/3))``
    (``_ffn_mult_to_intermediate_size`` in vLLM's ``nemotron_nas.py`` and llama.cpp's ``deci.py``)."""
    width = int(2 * ffn_mult * hidden_size / 3)
    return -(-width // DECILM_FFN_MULTIPLE) * DECILM_FFN_MULTIPLE


def decilm_ffn_mult(width: int, hidden_size: int) -> float:
    """The ``ffn_mult`` that DeciLM readers turn back into ``width``; raises :class:`ConfigError` when
    none does (``width`` not a positive multiple of 256). The round trip is asserted."""
    if width <= 0 or width % DECILM_FFN_MULTIPLE:
        raise ConfigError(
            f"FFN width {width} is not a positive multiple of {DECILM_FFN_MULTIPLE}; "
            f"DeciLM readers round ffn_mult up to one"
        )
    mult = round(3 * width / (2 * hidden_size), 6)
    if decilm_ffn_width(mult, hidden_size) != width:  # 6 digits always suffice for widths < 1e6
        raise ConfigError(f"no 6-digit ffn_mult gives FFN width {width} at hidden size {hidden_size}")
    return mult


def decilm_problems(arch: Architecture) -> list[str]:
    """Why ``arch`` (its active layers) cannot be a DeciLM checkpoint; empty when it can.

    DeciLM is a Llama-family format read by vLLM's ``nemotron_nas`` and llama.cpp's ``deci``: every
    attention layer has the model's ``num_attention_heads`` query heads (KV heads =
    ``num_attention_heads / n_heads_in_group``), every FFN width is a multiple of 256, and there are
    no biases, QK-norm, sliding windows or Gemma norms.
    """
    arch = arch.active()
    problems = []
    if not family(arch.family).decilm:  # the family entry's: Llama's layers (Llama, Mistral)
        problems.append(f"family {arch.family!r} is not Llama-like (DeciLM is a Llama-family format)")
    for flag, what in (
        (arch.qkv_bias or arch.o_bias, "attention biases"),
        (arch.mlp_bias, "MLP biases"),
        (arch.qk_norm, "QK-norm"),
    ):
        if flag:
            problems.append(f"{what} (DeciLM has none)")
    attn = [(i, layer) for i, layer in enumerate(arch.layers) if layer.attention]
    if any(layer.window is not None for _, layer in attn):
        problems.append("sliding-window layers (DeciLM attends fully)")
    heads = sorted({layer.num_heads for _, layer in attn})
    if len(heads) > 1:
        problems.append(
            f"query heads differ between layers ({', '.join(map(str, heads))}); DeciLM keeps "
            "num_attention_heads query heads in every attention layer and varies only the KV heads"
        )
    for i, layer in attn:
        if layer.num_heads % layer.num_kv_heads:
            problems.append(f"layer {i}: {layer.num_kv_heads} KV heads do not divide {layer.num_heads} query heads")
    for i, layer in enumerate(arch.layers):
        if layer.ffn and layer.ffn_width % DECILM_FFN_MULTIPLE:
            problems.append(f"layer {i}: FFN width {layer.ffn_width} is not a multiple of {DECILM_FFN_MULTIPLE}")
    return problems


def _raise_decilm_problems(arch: Architecture) -> None:
    problems = decilm_problems(arch)
    if problems:
        raise ConfigError(
            "this architecture cannot be written as a DeciLM checkpoint for the serving engines: "
            + "; ".join(problems)
            + ". Export it without decilm (the package's autocompress_decilm class), or prune to a "
            "uniform architecture (a plain family checkpoint every engine loads)"
        )


# Keys of the package's config that DeciLM readers do not know (all neutral after decilm_problems).
_PACKAGE_ONLY_KEYS = (
    "base_family",
    "layer_types",
    "qk_norm",
    "o_proj_bias",
    "sliding_window",
    "query_pre_attn_scalar",
    "final_logit_softcapping",
    "auto_map",
)


def decilm_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The engines' DeciLM ``config.json`` for a package ``autocompress_decilm`` config dict.

    Global keys are kept (``num_attention_heads`` becomes the query heads of every attention
    layer); each block gets DeciLM's keys, which vLLM and llama.cpp read::

        {"attention": {"no_op": false, "replace_with_linear": false, "n_heads_in_group": 3, ...},
         "ffn": {"no_op": false, "replace_with_linear": false, "ffn_mult": 2.666667, ...}}

    plus this package's exact ``num_heads`` / ``num_key_value_heads`` / ``intermediate_size``
    (readers that do not know them ignore them). A removed FFN has ``ffn_mult: null`` (llama.cpp's
    converter reads that, not ``no_op``). ``auto_map`` names the shipped ``configuration_decilm.py``.
    Raises :class:`ConfigError` listing what DeciLM cannot express.
    """
    from autocompress_opt.arch.block_configs import architecture_from_block_configs

    arch = architecture_from_block_configs(config)
    _raise_decilm_problems(arch)
    hidden = arch.hidden_size
    heads = next((layer.num_heads for layer in arch.layers if layer.attention), int(config["num_attention_heads"]))
    blocks = []
    for layer in arch.layers:
        group = layer.num_heads // layer.num_kv_heads if layer.attention else None
        mult = decilm_ffn_mult(layer.ffn_width, hidden) if layer.ffn else None
        blocks.append(
            {
                "attention": {
                    "no_op": not layer.attention,
                    "replace_with_linear": False,
                    "sparsify": None,
                    "n_heads_in_group": group,
                    "num_heads": layer.num_heads if layer.attention else None,
                    "num_key_value_heads": layer.num_kv_heads if layer.attention else None,
                    "window_length": None,
                },
                "ffn": {
                    "no_op": not layer.ffn,
                    "replace_with_linear": False,
                    "sparsify": None,
                    "ffn_mult": mult,
                    "intermediate_size": layer.ffn_width if layer.ffn else None,
                },
            }
        )
    out = {key: value for key, value in config.items() if key not in _PACKAGE_ONLY_KEYS}
    rope = out.get("rope_parameters") or {}
    if "rope_theta" in rope:  # older readers (and llama.cpp's) also look for the flat key
        out["rope_theta"] = rope["rope_theta"]
    out.update(
        model_type=DECILM_MODEL_TYPE,
        architectures=[DECILM_ARCHITECTURE],
        auto_map={"AutoConfig": f"{DECILM_CONFIG_CODE[:-3]}.DeciLMConfig"},
        num_attention_heads=heads,
        block_configs=blocks,
    )
    return out


def _write_decilm_config(directory: Path, config: Mapping[str, Any]) -> None:
    """Rewrite ``directory``'s config.json in DeciLM form and ship ``configuration_decilm.py``."""
    (directory / "config.json").write_text(json.dumps(decilm_config(config), indent=2) + "\n", encoding="utf-8")
    (directory / DECILM_CONFIG_CODE).write_text(_DECILM_CONFIG_SOURCE, encoding="utf-8")


def to_decilm(src_dir: str | Path, out_dir: str | Path, *, force: bool = False) -> Path:
    """Write the engines' DeciLM form of the package export ``src_dir`` to ``out_dir``; returns it.

    Weights, tokenizer and card are copied as they are (the state-dict keys are the same); only
    ``config.json`` changes (:func:`decilm_config`) and ``configuration_decilm.py`` is added. A
    ``src_dir`` that is already DeciLM is copied. Raises :class:`ConfigError` when ``src_dir`` is not
    a heterogeneous export or DeciLM cannot express it, :class:`OutputExistsError` as
    :func:`export_model`.
    """
    src, out = Path(src_dir), Path(out_dir).expanduser()
    config_path = src / "config.json"
    if not config_path.is_file():
        raise ConfigError(f"{str(src)!r} is not a checkpoint directory (no config.json)")
    config = json.loads(config_path.read_text(encoding="utf-8"))
    if config.get("model_type") not in (DECILM_MODEL_TYPE, "autocompress_decilm"):
        raise ConfigError(
            f"{str(src)!r} is a plain {config.get('model_type')!r} checkpoint, not a heterogeneous export; "
            "the engines load it as it is"
        )
    _check_out_dir(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    staging.chmod(0o755)
    try:
        for path in src.iterdir():
            if path.is_file():
                shutil.copy2(path, staging / path.name)
        if config.get("model_type") != DECILM_MODEL_TYPE:
            _write_decilm_config(staging, config)
            card_path = staging / CARD_FILE
            if card_path.is_file():
                card = json.loads(card_path.read_text(encoding="utf-8"))
                card["model_type"] = DECILM_MODEL_TYPE
                card_path.write_text(json.dumps(card, indent=2), encoding="utf-8")
        _swap_in(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


# The configuration code a DeciLM checkpoint ships for auto_map: vLLM reads block_configs[i].attention.no_op,
# .n_heads_in_group and .ffn.ffn_mult as attributes (nemotron_nas.DeciLMDecoderLayer), so each block's
# sections are dicts whose keys also read as attributes (and that still serialise as plain JSON).
_DECILM_CONFIG_SOURCE = '''"""DeciLM (nemotron-nas) configuration, written by autocompress_opt (heterogeneous exports).

Loaded through ``auto_map`` by readers that use ``trust_remote_code`` (vLLM). Only standard
transformers is imported.
"""

from transformers import LlamaConfig


class _Section(dict):
    """A block section whose keys also read as attributes (``block.attention.n_heads_in_group``)."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _block(block):
    return _Section({name: _Section(section) for name, section in dict(block).items()})


class DeciLMConfig(LlamaConfig):
    model_type = "nemotron-nas"

    def __init__(self, block_configs=None, **kwargs):
        super().__init__(**kwargs)
        self.block_configs = [_block(block) for block in block_configs or []]
'''


# ---------------------------------------------------------------------------------- card
def model_card(
    arch: Architecture,
    *,
    parent: str | Mapping[str, Any] | None = None,
    card: Mapping[str, Any] | None = None,
    model_type: str | None = None,
) -> dict[str, Any]:
    """The JSON model card: parent, architecture, parameter count, constraints, predicted costs, extras.

    Raises :class:`ConfigError` naming the first key of ``card`` that is not JSON-serialisable.
    """
    extras = dict(card or {})
    for key, value in extras.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"model card entry {key!r} is not JSON-serialisable: {exc}") from None
    return {
        "format": _CARD_FORMAT,
        "parent": parent if not isinstance(parent, Mapping) else dict(parent),
        "kind": "uniform" if arch.active().is_uniform else "heterogeneous",
        "model_type": model_type,
        "summary": arch.summary(),
        "num_params": arch.num_params,
        "architecture": arch.to_dict(),
        "constraints": extras.pop("constraints", {}),
        "predicted_costs": extras.pop("predicted_costs", {}),
        "extra": extras,
    }


def write_card(directory: str | Path, card_data: Mapping[str, Any]) -> None:
    """Write :func:`model_card`'s ``card_data`` into a checkpoint ``directory``: the JSON record
    (:data:`CARD_FILE`) and the human-readable ``README.md`` (front matter, summary, constraints,
    predicted costs, a table of the layers)."""
    folder = Path(directory)
    (folder / CARD_FILE).write_text(json.dumps(card_data, indent=2), encoding="utf-8")
    (folder / "README.md").write_text(_readme(card_data), encoding="utf-8")


def _readme(data: Mapping[str, Any]) -> str:
    parent = data["parent"]
    parent_text = json.dumps(parent) if isinstance(parent, Mapping) else str(parent or "unknown")
    lines = [
        "---",
        "library_name: transformers",
        "tags: [autocompress, pruned]",
        "---",
        "",
        f"# {data['architecture'].get('name') or 'Pruned model'}",
        "",
        f"Pruned by autocompress_opt from **{parent_text}**.",
        "",
        f"- kind: {data['kind']} (`model_type`: `{data['model_type']}`)",
        f"- {data['summary']}",
        f"- parameters: {data['num_params']:,}",
        "",
    ]
    if data["kind"] == "heterogeneous":
        lines += [
            "Loading needs `import autocompress_opt.hf.hetero_model` (registers the model class; no remote code).",
            "",
        ]
    lines += _table("Constraints", data["constraints"]) + _table("Predicted costs", data["predicted_costs"])
    lines += _layer_table(data["architecture"]["layers"])
    if data["extra"]:
        lines += ["## Details", "", "```json", json.dumps(data["extra"], indent=2), "```", ""]
    lines += [f"The full record is in `{CARD_FILE}`.", ""]
    return "\n".join(lines)


def _table(title: str, values: Any) -> list[str]:
    if not values:
        return []
    if not isinstance(values, Mapping):
        return [f"## {title}", "", f"{values}", ""]
    rows = [
        f"| {key} | {json.dumps(value) if not isinstance(value, str) else value} |" for key, value in values.items()
    ]
    return [f"## {title}", "", "| name | value |", "|---|---|", *rows, ""]


def _layer_table(layers: list[Mapping[str, Any]]) -> list[str]:
    """One row per run of identical consecutive layers (``0–22`` for a uniform model); a Mamba-2 mixer
    and a mixture-of-experts FFN are named with their sizes."""
    cells = []
    for layer in layers:
        attn = f"{layer['num_heads']}q/{layer['num_kv_heads']}kv × {layer['head_dim']}" if layer["attention"] else "—"
        if layer.get("mamba"):
            attn = f"Mamba-2 {layer['mamba']['num_heads']} heads × {layer['mamba']['head_dim']}"
        ffn = str(layer["ffn_width"]) if layer["ffn"] else "—"
        if layer.get("moe"):
            moe = layer["moe"]
            ffn = f"{moe['num_experts']} experts × {moe['expert_width']}, top-{moe['experts_per_token']}"
            ffn += f", shared {moe['shared_width']}" if moe.get("shared_width") else ""
        cells.append((attn, ffn))
    rows, start = [], 0
    for i in range(1, len(cells) + 1):
        if i == len(cells) or cells[i] != cells[start]:
            span = str(start) if i - 1 == start else f"{start}–{i - 1}"
            rows.append(f"| {span} | {cells[start][0]} | {cells[start][1]} |")
            start = i
    return ["## Layers", "", "| layers | mixer | FFN |", "|---|---|---|", *rows, ""]

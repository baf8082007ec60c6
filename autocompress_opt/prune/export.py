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
  ``trust_remote_code``.

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
from autocompress_opt.errors import AutocompressError, ConfigError
from autocompress_opt.hf.adapters import adapter_for, architecture_mismatch

__all__ = ["CARD_FILE", "OutputExistsError", "export_model", "load_exported", "model_card"]

CARD_FILE = "autocompress_card.json"
_CARD_FORMAT = "autocompress-model-card/1"


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

    A heterogeneous-class model whose ``arch`` is uniform is converted to the plain family class
    first. Raises :class:`OutputExistsError` for a non-empty ``out_dir`` without ``force``,
    :class:`ConfigError` when ``model`` does not have structure ``arch`` or ``card`` is not JSON-safe.
    """
    out = Path(out_dir).expanduser()
    adapter = adapter_for(model)
    mismatch = architecture_mismatch(arch.active(), adapter.architecture(model))
    if mismatch:
        raise ConfigError(f"the model does not have the given architecture ({mismatch})")
    card_data = model_card(arch, parent=parent, card=card, model_type=None)
    _check_out_dir(out, force)
    if adapter.heterogeneous and arch.active().is_uniform:
        model = _as_plain(model)
    card_data["model_type"] = model.config.model_type
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; a checkpoint is meant to be shared
    try:
        model.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        (staging / CARD_FILE).write_text(json.dumps(card_data, indent=2), encoding="utf-8")
        (staging / "README.md").write_text(_readme(card_data), encoding="utf-8")
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
    """
    from transformers import AutoModelForCausalLM

    import autocompress_opt.hf.hetero_model  # noqa: F401  (registers autocompress_decilm)

    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise ConfigError(f"{str(directory)!r} is not a checkpoint directory (no config.json)")
    return AutoModelForCausalLM.from_pretrained(directory, use_safetensors=True, **kwargs).eval()


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
    """One row per run of identical consecutive layers (``0–22`` for a uniform model)."""
    cells = []
    for layer in layers:
        attn = f"{layer['num_heads']}q/{layer['num_kv_heads']}kv × {layer['head_dim']}" if layer["attention"] else "—"
        cells.append((attn, str(layer["ffn_width"]) if layer["ffn"] else "—"))
    rows, start = [], 0
    for i in range(1, len(cells) + 1):
        if i == len(cells) or cells[i] != cells[start]:
            span = str(start) if i - 1 == start else f"{start}–{i - 1}"
            rows.append(f"| {span} | {cells[start][0]} | {cells[start][1]} |")
            start = i
    return ["## Layers", "", "| layers | attention | FFN width |", "|---|---|---|", *rows, ""]

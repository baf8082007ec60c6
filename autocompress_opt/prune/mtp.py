"""The parent's multi-token-prediction (MTP) layers in an export: dropped, or kept, never half of each.

Nemotron 3 Super (and DeepSeek-V3-style checkpoints) carry ``num_nextn_predict_layers`` MTP layers
under ``mtp.*`` in their weights, which engines use for speculative decoding. transformers builds no
MTP layer for them: it loads the parent without those weights and saves a pruned child's config with
the parent's ``num_nextn_predict_layers`` but no ``mtp.*`` tensor, a checkpoint that promises a layer
it does not hold. :func:`settle_mtp` makes every export say one thing:

- ``drop`` (the default): ``num_nextn_predict_layers`` set to 0 in the export's ``config.json``;
- ``keep``: the parent's ``mtp.*`` tensors copied unchanged from its checkpoint folder into the
  export (beside the model's own, in its index when it has one). The MTP layer reads the last
  hidden state and the embeddings, so it is kept only when the child keeps the parent's hidden size
  and vocabulary; otherwise a :class:`~autocompress_opt.errors.ConfigError` says so before anything
  is written there.

Either way the model card records it (``mtp``: ``{"kept": bool, "parent_layers": N, ...}``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autocompress_opt.errors import ConfigError

__all__ = ["MTP_CHOICES", "MTP_FILE", "check_mtp", "check_mtp_keep", "mtp_layers", "parent_mtp_tensors", "settle_mtp"]

MTP_CHOICES = ("drop", "keep")
MTP_PREFIX = "mtp."
MTP_FILE = "model-mtp.safetensors"  # where kept MTP tensors go when the export is sharded


def check_mtp(choice: str) -> str:
    if choice not in MTP_CHOICES:
        raise ConfigError(f"--mtp must be one of {', '.join(MTP_CHOICES)}, got {choice!r}")
    return choice


def mtp_layers(config: dict[str, Any]) -> int:
    """The MTP layers a ``config.json`` mapping declares (0 when it declares none)."""
    return int(config.get("num_nextn_predict_layers") or 0)


def check_mtp_keep(parent_dir: str | Path | None) -> None:
    """Before any work: ``--mtp keep`` needs a parent folder that declares MTP layers and holds
    ``mtp.*`` tensors (names read, no tensor loaded); raises :class:`ConfigError` saying what is missing."""
    from safetensors import safe_open

    files = _safetensors(parent_dir)
    config = json.loads((files[0].parent / "config.json").read_text(encoding="utf-8"))
    if mtp_layers(config) == 0:
        raise ConfigError(
            f"--mtp keep: the parent {str(parent_dir)!r} declares no MTP layer (num_nextn_predict_layers is 0)"
        )
    for path in files:
        with safe_open(str(path), "pt") as f:
            if any(name.startswith(MTP_PREFIX) for name in f.keys()):  # noqa: SIM118
                return
    raise ConfigError(f"--mtp keep: the parent {str(parent_dir)!r} declares MTP layers but holds no mtp.* tensor")


def _safetensors(parent_dir: str | Path | None) -> list[Path]:
    folder = Path(parent_dir).expanduser() if parent_dir is not None else None
    files = sorted(folder.glob("*.safetensors")) if folder is not None and folder.is_dir() else []
    if not files or not (files[0].parent / "config.json").is_file():
        raise ConfigError(
            f"--mtp keep copies the parent's mtp.* weights from its checkpoint folder; {str(parent_dir)!r} is not "
            "a local checkpoint folder (config.json and .safetensors files): give the parent's folder as --model, "
            "or use --mtp drop"
        )
    return files


def parent_mtp_tensors(parent_dir: str | Path | None) -> dict[str, Any]:
    """Every ``mtp.*`` tensor of the checkpoint folder ``parent_dir`` (its ``*.safetensors`` files),
    by name; empty when there are none. Raises :class:`ConfigError` when ``parent_dir`` is not a
    folder of safetensors files."""
    from safetensors import safe_open

    files = _safetensors(parent_dir)
    out: dict[str, Any] = {}
    for path in files:
        with safe_open(str(path), "pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if name.startswith(MTP_PREFIX):
                    out[name] = f.get_tensor(name)
    return out


def settle_mtp(
    folder: str | Path, *, choice: str = "drop", parent_dir: str | Path | None = None
) -> dict[str, Any] | None:
    """Make the export in ``folder`` (written by ``save_pretrained``) hold the parent's MTP layers
    whole or not at all (module doc); returns the card's record, None when the parent has none.

    ``parent_dir``: the parent's checkpoint folder (read for ``keep`` only). Raises
    :class:`ConfigError` for ``keep`` when the parent declares no MTP layer, its folder holds no
    ``mtp.*`` tensor, or the child changed the hidden size or vocabulary the layer reads."""
    check_mtp(choice)
    folder = Path(folder)
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    n = mtp_layers(config)
    if n == 0:
        if choice == "keep":
            raise ConfigError("--mtp keep: the parent declares no MTP layer (num_nextn_predict_layers is 0)")
        return None
    if choice == "drop":
        config["num_nextn_predict_layers"] = 0
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return {
            "kept": False,
            "parent_layers": n,
            "note": "the parent's multi-token-prediction layers are not in this checkpoint "
            "(num_nextn_predict_layers set to 0): no MTP speculative decoding",
        }
    # the cheap check first: the MTP tensors of a large parent are gigabytes
    parent_config = json.loads((_safetensors(parent_dir)[0].parent / "config.json").read_text(encoding="utf-8"))
    changed = [k for k in ("hidden_size", "vocab_size") if parent_config.get(k) != config.get(k)]
    if changed:
        detail = ", ".join(f"{k} {parent_config.get(k)} -> {config.get(k)}" for k in changed)
        raise ConfigError(
            f"--mtp keep: the MTP layer reads the parent's hidden state and vocabulary, and this child changes "
            f"them ({detail}); keep the parent's hidden size or use --mtp drop"
        )
    tensors = parent_mtp_tensors(parent_dir)
    if not tensors:
        raise ConfigError(
            f"--mtp keep: the parent declares {n} MTP layer(s) but {str(parent_dir)!r} holds no mtp.* tensor"
        )
    _add_tensors(folder, tensors)
    return {"kept": True, "parent_layers": n, "tensors": len(tensors), "note": "copied unchanged from the parent"}


def _add_tensors(folder: Path, tensors: dict[str, Any]) -> None:
    """Write ``tensors`` into the export: into its one ``model.safetensors`` (rewritten), or as
    :data:`MTP_FILE` added to its ``model.safetensors.index.json``."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    index_path = folder / "model.safetensors.index.json"
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    if index_path.is_file():
        save_file(tensors, str(folder / MTP_FILE), metadata={"format": "pt"})
        index = json.loads(index_path.read_text(encoding="utf-8"))
        index.setdefault("weight_map", {}).update(dict.fromkeys(tensors, MTP_FILE))
        index_path.write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
        return
    single = folder / "model.safetensors"
    with safe_open(str(single), "pt") as f:
        own = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
    save_file({**own, **tensors}, str(single), metadata={"format": "pt"})

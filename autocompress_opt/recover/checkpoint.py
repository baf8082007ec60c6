"""Distillation checkpoints: the resumable state a :func:`~autocompress_opt.recover.distill.distill`
run writes beside its student weights, and the checks that a resumed run is the same run.

``<out>/distill_state/`` holds ``state.json`` (format, steps done, the run's identity: recipe,
teacher, student, data) and ``state.safetensors`` (AdamW moments by parameter name, RNG states).
A checkpoint is written to a staging folder and swapped in whole (:func:`_replace_dir`), so an
interrupted save leaves the previous one intact.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from autocompress_opt.errors import ConfigError

__all__ = ["STATE_DIR", "RecipeMismatchError"]

STATE_DIR = "distill_state"
_STATE_JSON = "state.json"
_STATE_TENSORS = "state.safetensors"
_STATE_FORMAT = "autocompress-distill-state/1"


class RecipeMismatchError(ConfigError):
    """The output directory holds a checkpoint of another run (recipe, teacher, student or data)."""


def _check_same(saved: Mapping[str, Any], current: Mapping[str, Any], out: Path) -> None:
    """Raise :class:`RecipeMismatchError` for the first entry of ``current`` that differs from ``saved``."""
    hint = "pass restart=True (--restart) to start over, or choose another output directory"
    for key, value in current.items():
        if key == "recipe":
            for name, mine in value.items():
                theirs = saved["recipe"].get(name)
                if name != "save_every" and theirs != mine:
                    raise RecipeMismatchError(
                        f"the checkpoint in {str(out)!r} was made with {name}={theirs!r}; "
                        f"this run asks for {name}={mine!r}: {hint}"
                    )
        elif saved.get(key) != value:
            raise RecipeMismatchError(
                f"the checkpoint in {str(out)!r} was made with another {key} "
                f"({_short(saved.get(key))} vs now {_short(value)}): {hint}"
            )


def _short(value: Any) -> str:
    if isinstance(value, Mapping):  # a data record: its fingerprint says enough
        return f"documents_sha256={str(value.get('documents_sha256'))[:12]}, tokenizer={value.get('tokenizer')!r}"
    return repr(value)


def _read_state(out: Path) -> dict[str, Any] | None:
    """The ``state.json`` of a distillation checkpoint in ``out``, or None when there is none."""
    path = out / STATE_DIR / _STATE_JSON
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{str(path)!r} is not valid JSON ({exc}); pass restart=True (--restart)") from None
    if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT:
        raise ConfigError(f"{str(path)!r} is not a {_STATE_FORMAT} checkpoint; pass restart=True (--restart)")
    return state


def _student_card(student_dir: Path) -> dict[str, Any]:
    from autocompress_opt.prune.export import CARD_FILE

    path = student_dir / CARD_FILE
    if not path.is_file():
        return {}
    try:
        card = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"the student's model card {str(path)!r} is not valid JSON: {exc}") from None
    return card if isinstance(card, dict) else {}


def _optimizer_tensors(model: Any, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """AdamW moments and step counts by parameter name: ``optimizer/<name>/<exp_avg|exp_avg_sq|step>``."""
    tensors = {}
    for name, param in model.named_parameters():
        for key, value in optimizer.state.get(param, {}).items():
            tensors[f"optimizer/{name}/{key}"] = value.detach().to("cpu").contiguous()
    return tensors


def _rng_tensors() -> dict[str, torch.Tensor]:
    tensors = {"rng/cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors |= {f"rng/cuda/{i}": state for i, state in enumerate(torch.cuda.get_rng_state_all())}
    return tensors


def _restore(model: Any, optimizer: torch.optim.Optimizer, out: Path, state: Mapping[str, Any]) -> None:
    """Load the AdamW state and RNG states of the checkpoint in ``out`` (weights are already loaded)."""
    from safetensors.torch import load_file

    names = [name for name, _ in model.named_parameters()]
    if names != state["param_names"]:
        raise ConfigError(
            f"the checkpoint in {str(out)!r} does not match its own model's parameters; "
            "pass restart=True (--restart) to start over"
        )
    tensors = load_file(str(out / STATE_DIR / _STATE_TENSORS))
    per_param = {
        i: {key: tensors[f"optimizer/{name}/{key}"] for key in ("step", "exp_avg", "exp_avg_sq")}
        for i, name in enumerate(names)
        if f"optimizer/{name}/step" in tensors
    }
    if hasattr(model, "reshard"):  # FSDP2: every process hands in the full moments and keeps its shard
        _restore_sharded(model, optimizer, {names[i]: moments for i, moments in per_param.items()})
    else:
        optimizer.load_state_dict({"state": per_param, "param_groups": optimizer.state_dict()["param_groups"]})
    torch.set_rng_state(tensors["rng/cpu"])
    if torch.cuda.is_available():
        cuda = [tensors[f"rng/cuda/{i}"] for i in range(torch.cuda.device_count()) if f"rng/cuda/{i}" in tensors]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)


def _restore_sharded(model: Any, optimizer: torch.optim.Optimizer, by_name: dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    full = StateDictOptions(full_state_dict=True)
    groups = get_optimizer_state_dict(model, optimizer, options=full)["param_groups"]
    set_optimizer_state_dict(model, optimizer, {"state": by_name, "param_groups": groups}, options=full)


def _replace_dir(staging: Path, out: Path) -> None:
    """Put the complete ``staging`` directory at ``out``: the old one is renamed aside, then deleted."""
    if not out.exists():
        staging.rename(out)
        return
    aside = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
    out.rename(aside)
    staging.rename(out)
    shutil.rmtree(aside, ignore_errors=True)

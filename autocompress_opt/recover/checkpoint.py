"""Distillation checkpoints: the resumable state a :func:`~autocompress_opt.recover.distill.distill`
run writes beside its student weights, and the checks that a resumed run is the same run.

``<out>/distill_state/`` holds ``state.json`` (format, steps done, the run's identity: recipe,
teacher, student, data; the position of the calibration stream after those steps,
:meth:`~autocompress_opt.data.stream.TokenStream.position`) and ``state.safetensors`` (AdamW moments
by parameter name, RNG states).
A checkpoint is written to a staging folder and swapped in whole (:func:`_replace_dir`), so an
interrupted save leaves the previous one intact.

A sharded run (FSDP) with ``sharded_checkpoints`` writes its intermediate checkpoints as a
distributed checkpoint instead (``torch.distributed.checkpoint``): every process writes its own
shards of the weights and AdamW moments under ``distill_state/shards/`` (no process gathers the
whole model, so the save scales with the number of processes, not rank 0's host memory), and
``state.json`` says ``"weights": "sharded"``; the student's files beside it are not written until
the last step, which is saved whole as always. Such a checkpoint resumes under any number of
processes, one included: the distributed checkpoint reshards on load (:func:`_restore_shards`).
Every process must see the output directory.
"""

from __future__ import annotations

import json
import shutil
import uuid
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from autocompress_opt.errors import ConfigError

__all__ = ["SHARDS_DIR", "STATE_DIR", "RecipeMismatchError"]

STATE_DIR = "distill_state"
SHARDS_DIR = "shards"  # a sharded checkpoint's torch.distributed.checkpoint folder, under STATE_DIR
_STATE_JSON = "state.json"
_STATE_TENSORS = "state.safetensors"
# /2: the rows come from a token stream whose position is saved (/1 cycled a fixed pool of rows).
_STATE_FORMAT = "autocompress-distill-state/2"


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
    if isinstance(state, dict) and state.get("format") == "autocompress-distill-state/1":
        raise ConfigError(
            f"{str(path)!r} was written by an earlier version that read its text in another order, so it "
            "cannot be resumed to the same weights; pass restart=True (--restart) to start over"
        )
    if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT or "stream" not in state:
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
    """Load the AdamW state and RNG states of the checkpoint in ``out`` (weights are already loaded).

    A sharded (FSDP2) model: rank 0 alone reads the files (the other processes may not see ``out``)
    and broadcasts the moments, each process keeping its shard, and the RNG states."""
    from safetensors import safe_open

    names = [name for name, _ in model.named_parameters()]
    if names != state["param_names"]:
        raise ConfigError(
            f"the checkpoint in {str(out)!r} does not match its own model's parameters; "
            "pass restart=True (--restart) to start over"
        )
    sharded = hasattr(model, "reshard")
    path = str(out / STATE_DIR / _STATE_TENSORS)
    per_param: dict[str, dict[str, torch.Tensor]] = {}
    if not sharded or torch.distributed.get_rank() == 0:
        with safe_open(path, framework="pt") as handle:
            stored = set(handle.keys())
            for name in names:
                if f"optimizer/{name}/step" in stored:
                    per_param[name] = {
                        key: handle.get_tensor(f"optimizer/{name}/{key}") for key in ("step", "exp_avg", "exp_avg_sq")
                    }
    if sharded:
        _restore_sharded(model, optimizer, per_param)
    else:
        by_index = {names.index(name): moments for name, moments in per_param.items()}
        optimizer.load_state_dict({"state": by_index, "param_groups": optimizer.state_dict()["param_groups"]})
    _set_rng(model, path)


def _restore_shards(model: Any, optimizer: torch.optim.Optimizer, out: Path, state: Mapping[str, Any]) -> None:
    """Load the weights, AdamW moments and RNG states of the sharded checkpoint in ``out`` into
    ``model`` (sharded over this run's processes, or whole in one) and ``optimizer``: the distributed
    checkpoint reshards onto whatever layout this run has (module doc)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    if [name for name, _ in model.named_parameters()] != state["param_names"]:
        raise ConfigError(
            f"the checkpoint in {str(out)!r} does not match its own model's parameters; "
            "pass restart=True (--restart) to start over"
        )
    weights, moments = get_model_state_dict(model), get_optimizer_state_dict(model, optimizer)
    with warnings.catch_warnings():  # one process reading a sharded checkpoint is intended here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.load({"model": weights, "optim": moments}, checkpoint_id=str(out / STATE_DIR / SHARDS_DIR))
    set_model_state_dict(model, weights)
    set_optimizer_state_dict(model, optimizer, moments)
    _set_rng(model, str(out / STATE_DIR / _STATE_TENSORS))


def _set_rng(model: Any, path: str) -> None:
    """Every process takes rank 0's RNG states from the checkpoint file at ``path``."""
    from autocompress_opt.recover.fsdp import _from_rank0

    world = torch.distributed.get_world_size() if hasattr(model, "reshard") else 1
    rng = _from_rank0(lambda: _read_rng(path), world)
    torch.set_rng_state(rng["rng/cpu"])
    if torch.cuda.is_available():
        cuda = [rng[f"rng/cuda/{i}"] for i in range(torch.cuda.device_count()) if f"rng/cuda/{i}" in rng]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)


def _read_rng(path: str) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    with safe_open(path, framework="pt") as handle:
        keys = handle.keys()  # a safe_open handle is not iterable
        return {key: handle.get_tensor(key) for key in keys if key.startswith("rng/")}


def _restore_sharded(model: Any, optimizer: torch.optim.Optimizer, by_name: dict[str, Any]) -> None:
    """Rank 0's full moments ``by_name`` (empty on the other ranks) broadcast, each process keeping its shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    # The groups in the full-state-dict form (parameters by name), without gathering any moment.
    fqn = {id(param): name for name, param in model.named_parameters()}
    groups = [
        {**{k: v for k, v in group.items() if k != "params"}, "params": [fqn[id(p)] for p in group["params"]]}
        for group in optimizer.param_groups
    ]
    broadcast = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_optimizer_state_dict(model, optimizer, {"state": by_name, "param_groups": groups}, options=broadcast)


def _staging_dir(out: Path) -> Path:
    """A fresh hidden folder beside ``out`` that a checkpoint is written into before :func:`_replace_dir`."""
    return out.parent / f".{out.name}.distill-{uuid.uuid4().hex[:8]}"


def _replace_dir(staging: Path, out: Path) -> None:
    """Put the complete ``staging`` directory at ``out``: the old one is renamed aside, then deleted."""
    if not out.exists():
        staging.rename(out)
        return
    aside = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
    out.rename(aside)
    staging.rename(out)
    shutil.rmtree(aside, ignore_errors=True)

"""Sharded distillation (FSDP2): how many processes a run spans, building the student sharded,
and the collectives the run makes. Private helpers of :mod:`autocompress_opt.recover.distill`.

The recipe follows torchtune's full-finetune distributed recipe (``recipes/full_finetune_distributed.py``):

* **Meta-device init, sharded load.** Every process builds the student's modules on the ``meta``
  device from its ``config.json`` (no memory), wraps each decoder layer and then the whole model
  with ``fully_shard``, allocates only its own shard on its device (``to_empty``), and rank 0,
  the one process that reads the weights (into host memory), broadcasts them tensor by tensor
  (``set_model_state_dict(..., broadcast_from_rank0=True)``); each process keeps its shard. No
  process ever holds the full student on its GPU.
* **fp32 master weights, bf16 compute.** The sharded parameters, their gradients and the AdamW
  moments stay float32; with a bf16 precision FSDP2 all-gathers them as bf16 for the forward and
  backward and reduce-scatters the gradients in float32 (``MixedPrecisionPolicy(param_dtype=bf16,
  reduce_dtype=fp32)``).
* **Collectives on the backend's device.** NCCL only moves CUDA tensors (a CPU tensor fails with
  "No backend type associated with device type cpu"), gloo moves CPU ones: every collective here
  goes through :func:`_collective_device`.
* **The teacher sharded too.** The frozen teacher is wrapped the same way (each decoder layer a
  unit, all-gathered for its forward only, no gradients, no optimiser state), so each GPU holds
  ``1/W`` of it rather than a whole replica (:func:`shard_frozen`). Every process reads it into host
  memory (the teacher can be any reference ``load_model`` resolves, a GGUF file or a known name);
  rank 0's weights are broadcast so every shard is of the same copy.
* **Rank 0 decides.** With node-local disks the processes can see different output directories,
  so only rank 0 looks at it (checkpoint or not, which step) and broadcasts what it found
  (:func:`_from_rank0`); rank 0 alone reads the checkpoint's weights and moments and broadcasts them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch

from autocompress_opt.errors import ConfigError
from autocompress_opt.recover.recipe import DistillRecipe

_T = TypeVar("_T")

# Backends whose collectives take CUDA tensors only (torch.distributed's Backend names).
_CUDA_ONLY_BACKENDS = frozenset({"nccl", "xccl"})
# torch.distributed's default timeout of a collective (NCCL and gloo): 10 minutes.
DEFAULT_TIMEOUT_S = 600.0
# The slowest write a checkpoint is allowed for (a busy shared file system), and what rank 0 writes
# per parameter while the others wait at the barrier: fp32 weights and AdamW's two fp32 moments.
SAVE_BYTES_PER_S = 50e6
_CHECKPOINT_BYTES_PER_PARAM = 12


def collective_timeout(student_dir: str | Path) -> float:
    """Seconds a collective may wait in a sharded run of this student: torch's 10 minutes, or twice
    the time rank 0 takes to write the student's checkpoint at :data:`SAVE_BYTES_PER_S` while the
    other processes wait at the barrier after it, whichever is longer. A 1B student: 10 minutes; an
    8B one: 64 minutes. The parameters are counted from the safetensors headers (no weights read)."""
    params = sum(_stored_parameters(file) for file in sorted(Path(student_dir).glob("*.safetensors")))
    return max(DEFAULT_TIMEOUT_S, 2 * params * _CHECKPOINT_BYTES_PER_PARAM / SAVE_BYTES_PER_S)


def _stored_parameters(file: Path) -> int:
    """The number of values of every tensor a safetensors file holds, from its header alone."""
    import json
    import math
    import struct

    with file.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    return sum(math.prod(entry["shape"]) for name, entry in header.items() if name != "__metadata__")


def _world_size(fsdp: bool, recipe: DistillRecipe) -> int:
    """Processes the student is sharded over: 1 without ``fsdp``, else the process group's size."""
    if not fsdp:
        return 1
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise ConfigError(
            "fsdp=True needs an initialised torch.distributed process group: launch under torchrun and call "
            "torch.distributed.init_process_group() first (backend nccl on GPUs, gloo on the CPU)"
        )
    world = dist.get_world_size()
    if recipe.batch_size % world:
        raise ConfigError(f"batch_size {recipe.batch_size} must be a multiple of the {world} FSDP processes")
    return world


def _collective_device() -> torch.device:
    """Where the default process group's collectives take their tensors: this process's current
    CUDA device under NCCL, the CPU under gloo (or a ``cpu:gloo,cuda:nccl`` group's CPU part)."""
    import torch.distributed as dist

    backend = str(dist.get_backend()).lower()
    if backend in _CUDA_ONLY_BACKENDS:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _mean_over_processes(value: float, world: int) -> float:
    """The mean of ``value`` over the ``world`` processes (``value`` itself when there is one)."""
    if world == 1:
        return value
    total = torch.tensor(value, dtype=torch.float64, device=_collective_device())
    torch.distributed.all_reduce(total)
    return float(total) / world


def _barrier(world: int) -> None:
    """Wait for every process; under NCCL on this process's GPU (else NCCL guesses one and warns)."""
    if world == 1:
        return
    device = _collective_device()
    if device.type == "cuda":
        torch.distributed.barrier(device_ids=[device.index or 0])
    else:
        torch.distributed.barrier()


def _from_rank0(decide: Callable[[], _T], world: int) -> _T:
    """``decide()`` run on rank 0 alone, its result (a picklable object) handed to every process.

    An exception raised by ``decide`` is raised on every process, so no process goes on to wait in
    a collective the others never reach."""
    if world == 1:
        return decide()
    import torch.distributed as dist

    box: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = ("ok", decide())
        except Exception as exc:  # handed to the others, then raised here too
            box[0] = ("error", exc)
    dist.broadcast_object_list(box, src=0, device=_collective_device())
    kind, value = box[0]
    if kind == "error":
        raise value
    return value


def _mixed_precision(precision: str) -> Any:
    """FSDP2's policy for a run's precision label: bf16 compute over fp32 master weights for
    ``bf16-mixed`` and ``bf16-autocast``; None (the parameters' own dtype) otherwise."""
    if precision not in ("bf16-mixed", "bf16-autocast"):
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    # Gradients reduce-scattered in fp32: averaging W bf16 gradients would round each partial sum.
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def _skeleton(student_dir: Path, dtype: torch.dtype) -> Any:
    """The student's modules on the ``meta`` device (shapes, no storage), from its ``config.json``."""
    from transformers import AutoConfig

    return _on_meta(AutoConfig.from_pretrained(student_dir, local_files_only=True), dtype)


def _on_meta(config: Any, dtype: torch.dtype) -> Any:
    """The causal LM of ``config`` on the ``meta`` device (shapes, no storage)."""
    from transformers import AutoModelForCausalLM

    import autocompress_opt.hf.hetero_model  # noqa: F401  (registers the heterogeneous student's class)

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def _shard(model: Any, device: torch.device, world: int, precision: str = "fp32") -> None:
    """FSDP2: each decoder layer is its own unit (all-gathered for its forward and backward), then the rest."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from autocompress_opt.hf.adapters import adapter_for

    mesh = init_device_mesh(device.type, (world,))
    policy = _mixed_precision(precision)
    kwargs = {"mesh": mesh} | ({"mp_policy": policy} if policy is not None else {})
    for part in adapter_for(model).all_layer_parts(model):
        fully_shard(part.layer, **kwargs)
    fully_shard(model, **kwargs)


def shard_frozen(model: Any, device: torch.device, world: int) -> Any:
    """``model`` (a frozen network in host memory, on every process) as FSDP2 units over the run's
    ``world`` processes, each keeping its ``1/world`` on ``device`` (module doc): a new model built on
    the ``meta`` device from ``model.config``, sharded, given rank 0's weights; in eval mode, no
    gradients. It computes in its parameters' dtype (no mixed-precision policy)."""
    import torch.distributed as dist

    skeleton = _on_meta(model.config, next(model.parameters()).dtype)
    _shard(skeleton, device, world)
    _load_sharded(skeleton, model if dist.get_rank() == 0 else None, device)
    # FSDP2 keeps the root unit (embeddings, head, final norm) gathered after its forward, expecting a
    # backward; a frozen model has none, so it gives them back at once (its layers reshard themselves)
    skeleton.register_forward_hook(lambda module, args, output: module.reshard())
    return skeleton.requires_grad_(False).eval()


def _load_sharded(model: Any, full: Any | None, device: torch.device) -> None:
    """Give the sharded meta-device ``model`` its storage on ``device`` and the weights of ``full``
    (rank 0's host copy of the whole student; None on the other ranks), each rank keeping its shard.

    Buffers are not sharded: rank 0's are broadcast whole, non-persistent ones (rotary
    frequencies) included, which no state dict carries."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    model.to_empty(device=device)
    weights = full.state_dict() if full is not None else {}
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, weights, options=options)
    theirs: Mapping[str, torch.Tensor] = dict(full.named_buffers()) if full is not None else {}
    for name, buffer in model.named_buffers():
        staged = buffer.to(_collective_device())
        if full is not None:
            staged.copy_(theirs[name])
        dist.broadcast(staged, src=0)
        buffer.copy_(staged)

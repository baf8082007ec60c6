"""Sharded distillation (FSDP2): how many processes a run spans, sharding the student over them,
and averaging a number across them. Private helpers of :mod:`autocompress_opt.recover.distill`."""

from __future__ import annotations

from typing import Any

import torch

from autocompress_opt.errors import ConfigError
from autocompress_opt.recover.recipe import DistillRecipe


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


def _shard(model: Any, device: torch.device, world: int) -> None:
    """FSDP2: each decoder layer is its own unit (all-gathered for its forward and backward), then the rest."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from autocompress_opt.hf.adapters import adapter_for

    mesh = init_device_mesh(device.type, (world,))
    for part in adapter_for(model).all_layer_parts(model):
        fully_shard(part.layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def _mean_over_processes(value: float, world: int) -> float:
    if world == 1:
        return value
    total = torch.tensor(value, dtype=torch.float64)
    torch.distributed.all_reduce(total)
    return float(total) / world

"""One process of a 2-process FSDP distillation (run by ``torchrun`` from ``test_distill_fsdp.py``).

Usage: ``torchrun --standalone --nproc_per_node 2 fsdp_worker.py STUDENT TEACHER OUT RESULT_JSON [MODE]``;
rank 0 writes the result record to RESULT_JSON, with each process's observations under
``"ranks"``: whether the student was still on the meta device when it was sharded, which
models that process loaded, the token rows it trained on in each update, and how many of the
teacher's values it holds against the teacher's total (``teacher_values``: its shard, when sharded). MODE: ``crash``
interrupts every process in its third update (after the step-2 checkpoint) and makes the same call
again, which resumes; ``stop`` interrupts it the same way and ends there (the checkpoint of step 2
is left for another layout to resume); ``bf16`` trains with
``compute_dtype="bf16"`` (fp32 master weights, bf16 compute); ``bf16-crash`` both; ``mismatch``
calls it with another learning rate on OUT's checkpoint and records each process's error;
``sharded-crash`` and ``sharded-stop`` are ``crash`` and ``stop`` with ``sharded_checkpoints`` (each
process writes its own shards of the step-2 checkpoint).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch.distributed as dist

import autocompress_opt.hf.loading as loading_module
import autocompress_opt.recover.distill as distill_module
from autocompress_opt.recover.distill import RecipeMismatchError, distill

# The recipe of test_distill_fsdp.RECIPE (kept here so the worker needs no test imports).
RECIPE = {"steps": 4, "batch_size": 4, "seq_len": 16, "lr": 3e-3, "save_every": 2, "n_eval_rows": 2}
# The memory options of an 8B run, on top of the sharding.
OPTIONS = {"gradient_checkpointing": True, "kl_chunk": 5}


def crashing(real_step: Any, at: int = 3) -> Any:
    """``real_step`` (distill's ``_train_step``) that raises KeyboardInterrupt in its ``at``-th call
    (after the step-2 checkpoint of the test recipe), as a killed run stops."""
    calls = []

    def crashing_step(*args: Any) -> float:
        calls.append(1)
        if len(calls) == at:
            raise KeyboardInterrupt
        return real_step(*args)

    return crashing_step


def _interrupted_then_resumed(run: Any, resume: bool = True) -> Any:
    real_step = distill_module._train_step
    distill_module._train_step = crashing(real_step)
    try:
        run()
    except KeyboardInterrupt:
        pass
    finally:
        distill_module._train_step = real_step
    return run() if resume else None


def _observe(seen: dict[str, list[Any]]) -> None:
    """Record, in ``seen``, the student's devices when it is sharded, the refs this process loads and
    the rows it trains on."""
    real_shard, real_load, real_step = distill_module._shard, loading_module.load_model, distill_module._train_step

    def shard(model: Any, *args: Any) -> None:
        seen["devices_at_shard"].append(sorted({p.device.type for p in model.parameters()}))
        real_shard(model, *args)

    def load(ref: Any, **kwargs: Any) -> Any:
        seen["loaded"].append(str(ref))
        return real_load(ref, **kwargs)

    def train_step(model: Any, teacher: Any, tokens: Any, *args: Any) -> float:
        seen["trained"].append(tokens.tolist())
        if not seen["teacher_values"]:  # what this process holds of the teacher: its shard, of the whole
            local = sum(getattr(p, "to_local", lambda p=p: p)().numel() for p in teacher.parameters())
            seen["teacher_values"] = [local, sum(p.numel() for p in teacher.parameters())]
        return real_step(model, teacher, tokens, *args)

    distill_module._shard = shard
    distill_module._train_step = train_step
    loading_module.load_model = load  # type: ignore[assignment]


def main(student: str, teacher: str, out: str, result_json: str, mode: str = "") -> None:
    from autocompress_opt.recover.recipe import DistillRecipe

    dist.init_process_group("gloo")
    seen: dict[str, list[Any]] = {"devices_at_shard": [], "loaded": [], "trained": [], "teacher_values": []}
    _observe(seen)
    options = OPTIONS | ({"compute_dtype": "bf16"} if mode.startswith("bf16") else {})
    if mode.startswith("sharded-"):
        options, mode = options | {"sharded_checkpoints": True}, mode.removeprefix("sharded-")
    recipe = DistillRecipe(**RECIPE | ({"lr": 2 * RECIPE["lr"]} if mode == "mismatch" else {}))
    try:
        run = lambda: distill(student, teacher, out, recipe, progress=False, fsdp=True, **options)
        record: dict[str, Any] = {}
        if mode == "mismatch":
            try:
                run()
            except RecipeMismatchError as exc:  # rank 0 found it; every process must raise it
                seen["error"] = [str(exc)]
        else:
            if mode == "stop":
                _interrupted_then_resumed(run, resume=False)
            else:
                result = _interrupted_then_resumed(run) if mode.endswith("crash") else run()
                record = result.to_dict()
        ranks: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, seen)
        if dist.get_rank() == 0:
            with open(result_json, "w", encoding="utf-8") as handle:
                json.dump(record | {"ranks": ranks}, handle, default=str)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:6])

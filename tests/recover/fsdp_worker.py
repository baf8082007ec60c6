"""One process of a 2-process FSDP distillation (run by ``torchrun`` from ``test_distill_fsdp.py``).

Usage: ``torchrun --standalone --nproc_per_node 2 fsdp_worker.py STUDENT TEACHER OUT RESULT_JSON [crash]``;
rank 0 writes the result record to RESULT_JSON. With ``crash``, every process is interrupted in
its third update (after the step-2 checkpoint) and the same call is made again, which resumes.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch.distributed as dist

import autocompress_opt.recover.distill as distill_module
from autocompress_opt.recover.distill import distill

# The recipe of test_distill_fsdp.RECIPE (kept here so the worker needs no test imports).
RECIPE = {"steps": 4, "batch_size": 4, "seq_len": 16, "lr": 3e-3, "save_every": 2, "n_eval_rows": 2}
# The memory options of an 8B run, on top of the sharding.
OPTIONS = {"gradient_checkpointing": True, "kl_chunk": 5}


def _interrupted_then_resumed(run: Any) -> Any:
    real_step, calls = distill_module._train_step, []

    def crashing_step(*args: Any) -> float:
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_step(*args)

    distill_module._train_step = crashing_step
    try:
        run()
    except KeyboardInterrupt:
        pass
    finally:
        distill_module._train_step = real_step
    return run()


def main(student: str, teacher: str, out: str, result_json: str, mode: str = "") -> None:
    from autocompress_opt.recover.recipe import DistillRecipe

    dist.init_process_group("gloo")
    try:
        run = lambda: distill(student, teacher, out, DistillRecipe(**RECIPE), progress=False, fsdp=True, **OPTIONS)
        result = _interrupted_then_resumed(run) if mode == "crash" else run()
        if dist.get_rank() == 0:
            with open(result_json, "w", encoding="utf-8") as handle:
                json.dump(result.to_dict(), handle, default=str)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:6])

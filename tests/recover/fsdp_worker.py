"""One process of a 2-process FSDP distillation (run by ``torchrun`` from ``test_distill_fsdp.py``).

Usage: ``torchrun --standalone --nproc_per_node 2 fsdp_worker.py STUDENT TEACHER OUT RESULT_JSON``;
rank 0 writes the result record to RESULT_JSON.
"""

from __future__ import annotations

import json
import sys

import torch.distributed as dist

from autocompress_opt.recover.distill import distill

# The recipe of test_distill_fsdp.RECIPE (kept here so the worker needs no test imports).
RECIPE = {"steps": 4, "batch_size": 4, "seq_len": 16, "lr": 3e-3, "save_every": 2, "n_eval_rows": 2}
# The memory options of an 8B run, on top of the sharding.
OPTIONS = {"gradient_checkpointing": True, "kl_chunk": 5}


def main(student: str, teacher: str, out: str, result_json: str) -> None:
    from autocompress_opt.recover.recipe import DistillRecipe

    dist.init_process_group("gloo")
    try:
        result = distill(student, teacher, out, DistillRecipe(**RECIPE), progress=False, fsdp=True, **OPTIONS)
        if dist.get_rank() == 0:
            with open(result_json, "w", encoding="utf-8") as handle:
                json.dump(result.to_dict(), handle, default=str)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:5])

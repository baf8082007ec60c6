"""Score a built task through lm-evaluation-harness itself (optional: ``pip install 'lm-eval>=0.4.13'``).

The built-in scorer (:mod:`autocompress_opt.tasks.scoring`) reproduces lm-eval's arithmetic; this
evaluator runs lm-eval's own code on the same items, as a cross-check and for anyone who trusts
only the harness. A task's items become a local lm-eval task:

- ``items.jsonl``: one item per line (``id``, ``context``, ``choices``, ``gold``, ``continuation``);
- ``<task>.yaml``: ``dataset_path: json`` over that file, ``target_delimiter: ""`` (our
  continuations carry their own leading space), and for multiple-choice items
  ``output_type: multiple_choice`` with metrics ``acc``, ``acc_norm`` and ``acc_bytes``; for cloze
  items ``output_type: loglikelihood`` with metric ``acc``, which lm-eval defines as ``is_greedy``.

loaded with ``TaskManager(include_path=...)`` and run with ``simple_evaluate(HFLM(model))``, zero-shot.

Our ``acc_norm`` divides log-likelihood by a choice's UTF-8 bytes: that is lm-eval's ``acc_bytes``,
which is what this evaluator reports as ``acc_norm``. lm-eval's own ``acc_norm`` divides by
characters; the two differ only on choices with non-ASCII characters, and the per-item
character-normalised prediction is not kept. lm-eval computes log-softmax in the model's dtype
(ours: float32), so bf16 models can differ in the last digits.

lm-eval is imported inside :func:`score_task_lmeval` only; without it the call raises a
:class:`ConfigError` saying how to install it.
"""

from __future__ import annotations

import copy
import json
import logging
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from autocompress_opt.errors import ConfigError
from autocompress_opt.tasks.items import TaskSpec
from autocompress_opt.tasks.scoring import DEFAULT_BATCH_SIZE, ItemResult, TaskResult

__all__ = ["LMEVAL_INSTALL_HINT", "import_lmeval", "lmeval_model", "score_task_lmeval", "write_lmeval_task"]

LMEVAL_INSTALL_HINT = "the lm-eval evaluator needs lm-evaluation-harness: pip install 'lm-eval>=0.4.13'"
_TASK_PREFIX = "autocompress_"  # our local tasks never shadow one of lm-eval's bundled tasks


def write_lmeval_task(spec: TaskSpec, directory: Path) -> str:
    """Write ``spec``'s items and an lm-eval task YAML into ``directory``; returns the lm-eval task name.

    A task mixes no item kinds: every item is multiple-choice, or every item is cloze.
    """
    kinds = {item.kind for item in spec.items}
    if len(kinds) != 1:
        raise ConfigError(f"task {spec.name!r}: lm-eval needs one item kind per task, got {sorted(kinds)}")
    name = _TASK_PREFIX + spec.name.replace("-", "_")
    data = directory / f"{name}.jsonl"
    with data.open("w", encoding="utf-8") as out:
        for item in spec.items:
            row = {
                "id": item.id,
                "context": item.context,
                "choices": list(item.choices),
                "gold": item.gold,
                "continuation": item.choices[item.gold],
            }
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    if kinds == {"cloze"}:
        body = {
            "output_type": "loglikelihood",
            "doc_to_target": "continuation",
            "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
        }
    else:
        body = {
            "output_type": "multiple_choice",
            "doc_to_choice": "choices",
            "doc_to_target": "gold",
            "metric_list": [
                {"metric": m, "aggregation": "mean", "higher_is_better": True} for m in ("acc", "acc_norm", "acc_bytes")
            ],
        }
    config = {
        "task": name,
        "dataset_path": "json",
        # cache_dir: the datasets cache of these throwaway files stays in the same folder
        "dataset_kwargs": {"data_files": {"test": str(data)}, "cache_dir": str(directory / "hf-cache")},
        "test_split": "test",
        "doc_to_text": "context",
        "target_delimiter": "",
        **body,
    }
    (directory / f"{name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return name


def import_lmeval() -> Any:
    """The ``lm_eval`` module, or a :class:`ConfigError` saying how to install it."""
    try:
        import lm_eval
        import lm_eval.models.huggingface  # HFLM: a missing extra fails here, not mid-run
        import lm_eval.tasks
    except ImportError:
        raise ConfigError(LMEVAL_INSTALL_HINT) from None
    return lm_eval


@contextmanager
def lmeval_model(model: Any, tokenizer: Any, batch_size: int) -> Iterator[Any]:
    """lm-eval's ``HFLM`` over an already loaded ``model``, for ``simple_evaluate(model=...)``.

    The tokenizer is copied (HFLM may add a pad token to it); the model's training flag and the
    ``lm_eval`` logger's level are put back on exit. HFLM's warning that ``pretrained`` is a model
    object, not a name, is silenced: that is the point here.
    """
    from lm_eval.models.huggingface import HFLM

    was_training = model.training
    logger = logging.getLogger("lm_eval")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield HFLM(pretrained=model, tokenizer=copy.deepcopy(tokenizer), batch_size=batch_size)
    finally:
        model.train(was_training)
        logger.setLevel(level)


def score_task_lmeval(
    model: Any, tokenizer: Any, spec: TaskSpec, *, batch_size: int = DEFAULT_BATCH_SIZE, progress: bool = True
) -> TaskResult:
    """Score ``spec`` with lm-evaluation-harness (``HFLM`` over ``model``), zero-shot.

    Per-item log-likelihoods and ``is_greedy`` come from lm-eval's logged samples, correctness from
    its per-sample ``acc`` / ``acc_bytes`` (our ``acc_norm``). The tokenizer is copied (HFLM may add
    a pad token to it); the global random seeds and the model's training flag are left as they were.
    lm-eval draws its own progress bars whatever ``progress`` says.
    """
    lm_eval = import_lmeval()
    from lm_eval.tasks import TaskManager

    del progress
    start = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="autocompress-lmeval-") as tmp,
        lmeval_model(model, tokenizer, batch_size) as lm,
    ):
        name = write_lmeval_task(spec, Path(tmp))
        # include_defaults=False: index only our task, not the ~10k YAMLs lm-eval ships (seconds)
        tasks = TaskManager(include_path=tmp, include_defaults=False)
        output = lm_eval.simple_evaluate(
            model=lm,
            tasks=[name],
            task_manager=tasks,
            log_samples=True,
            bootstrap_iters=0,
            random_seed=None,
            numpy_random_seed=None,
            torch_random_seed=None,
        )
    samples = sorted(output["samples"][name], key=lambda s: s["doc_id"])
    if len(samples) != len(spec.items):
        raise ConfigError(f"lm-eval scored {len(samples)} of task {spec.name!r}'s {len(spec.items)} items")
    results = [_item_result(item, sample) for item, sample in zip(spec.items, samples)]
    return TaskResult.from_items(spec, results, seconds=time.perf_counter() - start, evaluator="lm-eval")


def _item_result(item: Any, sample: dict[str, Any]) -> ItemResult:
    """Our :class:`ItemResult` from one lm-eval logged sample, with lm-eval's own verdicts."""
    if sample["doc"]["id"] != item.id:
        raise ConfigError(f"lm-eval returned item {sample['doc']['id']!r} where {item.id!r} was expected")
    scores = [(float(ll), bool(greedy)) for ll, greedy in sample["filtered_resps"]]
    mine = ItemResult.from_scores(item, [ll for ll, _ in scores], [g for _, g in scores])
    if item.kind == "cloze":
        return replace(mine, is_greedy=bool(sample["acc"]))
    return replace(mine, acc=bool(sample["acc"]), acc_norm=bool(sample["acc_bytes"]))

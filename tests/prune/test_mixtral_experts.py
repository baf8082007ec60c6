"""Mixtral through the experts path (issue 43 item 5): a tiny Mixtral's experts, channels and top-k are
scored, masked (its router renormalises the top-k: no norm_topk_prob switch), sliced into a plain Mixtral
whose logits equal the masked parent's, searched by the expert inner search, and recovered by distill."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_families import tiny_model, tokens
from tiny_lm import byte_tokenizer, save_hf_dir

from autocompress_opt.hf.adapters import moe_adapter
from autocompress_opt.hf.loading import load_model
from autocompress_opt.prune.experts import expert_masks, export_experts, slice_experts
from autocompress_opt.prune.importance import Importance, estimate_importance
from autocompress_opt.prune.masking import apply_masks
from autocompress_opt.quality.metrics import log_probs
from autocompress_opt.recover.distill import DistillRecipe, distill
from autocompress_opt.search.inner.experts import search_experts
from autocompress_opt.search.inner.inner_search import InnerConfig

POINT = {"num_experts": 6, "experts_per_token": 1, "expert_width": 8}


@pytest.fixture(scope="module")
def model() -> Any:
    torch.set_num_threads(1)
    return tiny_model("mixtral", vocab_size=260, num_local_experts=8, num_experts_per_tok=2, intermediate_size=16)


@pytest.fixture(scope="module")
def importance(model: Any) -> Importance:
    return estimate_importance(model, tokens(4, 12), adapter=moe_adapter(model), progress=False)


def test_a_mixtral_child_is_the_masked_parent_and_full_masks_change_nothing(model: Any, importance: Importance) -> None:
    ids, adapter = tokens(2, 12, seed=3), moe_adapter(model)
    with torch.no_grad():
        plain = model(ids).logits
        with apply_masks(model, expert_masks(model, importance, {}), adapter=adapter):
            torch.testing.assert_close(model(ids).logits, plain, rtol=0, atol=0)
        masks = expert_masks(model, importance, POINT)
        with apply_masks(model, masks, adapter=adapter):
            masked = model(ids).logits
        child = slice_experts(model, masks)
        c = child.config
        assert (c.num_local_experts, c.num_experts_per_tok, c.intermediate_size) == (6, 1, 8)
        torch.testing.assert_close(child(ids).logits, masked)


def test_the_expert_search_and_recovery_run_on_mixtral(model: Any, importance: Importance, tmp_path: Path) -> None:
    rows = tokens(8, 16, seed=3)
    with torch.no_grad():
        teacher = log_probs(model(rows).logits)
    parent = moe_adapter(model).architecture(model)
    config = InnerConfig(steps=4, batch_size=2, seq_len=16, n_samples=8, val_samples=2, gate_lr=1.0)
    result = search_experts(model, parent, importance, rows, teacher, params=POINT, goal=None, config=config)
    assert result.feasible and result.selection["chosen"] in ("trained", "start")
    student = export_experts(model, result.masks, tmp_path / "student")
    byte_tokenizer().save_pretrained(student)
    teacher_dir = save_hf_dir(model, tmp_path / "teacher")
    recipe = DistillRecipe(steps=2, batch_size=2, seq_len=16, lr=1e-3, save_every=2, n_eval_rows=2)
    done = distill(student, teacher_dir, tmp_path / "recovered", recipe, progress=False)
    assert done.steps_done == 2
    assert type(load_model(tmp_path / "recovered").model).__name__ == "MixtralForCausalLM"

"""Recovery of pruned mixture-of-experts and hybrid students (issue 43): `distill` trains an expert child
of a tiny Qwen3-MoE and of a tiny Nemotron-H (router included), writes checkpoints in the family's own
class, and a run interrupted after its first checkpoint resumes to the weights of an uninterrupted one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from fsdp_worker import crashing
from tiny_families import TINY_MOE, hybrid_model, tiny_model, tokens
from tiny_lm import byte_tokenizer, save_hf_dir

import autocompress_opt.recover.distill as distill_module
from autocompress_opt.hf.adapters import moe_adapter
from autocompress_opt.hf.loading import load_model
from autocompress_opt.prune.experts import expert_masks, export_experts
from autocompress_opt.prune.importance import estimate_importance
from autocompress_opt.recover.distill import DistillRecipe, distill

RECIPE = DistillRecipe(steps=4, batch_size=2, seq_len=16, lr=1e-3, save_every=2, n_eval_rows=2)
POINT = {"num_experts": 6, "experts_per_token": 1, "expert_width": 8}


def _parent(kind: str) -> Any:
    if kind == "qwen3_moe":
        return tiny_model("qwen3_moe", vocab_size=260, **TINY_MOE)
    return hybrid_model(vocab_size=260)


@pytest.fixture(scope="module", params=["qwen3_moe", "nemotron_h"])
def dirs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    torch.set_num_threads(1)
    parent = _parent(request.param)
    root = tmp_path_factory.mktemp(request.param)
    teacher = save_hf_dir(parent, root / "teacher")
    importance = estimate_importance(parent, tokens(4, 12), adapter=moe_adapter(parent), progress=False)
    student = export_experts(parent, expert_masks(parent, importance, POINT), root / "student")
    byte_tokenizer().save_pretrained(student)
    return student, teacher


def test_a_pruned_moe_student_distils_its_router_and_resumes_to_identical_weights(
    dirs: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    student, teacher = dirs
    before = load_model(student, cache=False).model.state_dict()
    straight = distill(student, teacher, tmp_path / "straight", RECIPE, progress=False)
    after = load_model(tmp_path / "straight", cache=False).model
    assert type(after).__name__ == type(load_model(teacher, cache=False).model).__name__  # the family's own class
    state = after.state_dict()
    routers = [name for name in state if name.endswith(("gate.weight", "mlp.gate.weight")) and "proj" not in name]
    assert routers and all(not torch.equal(state[n], before[n]) for n in routers)  # the routers were trained

    real_step = distill_module._train_step
    monkeypatch.setattr(distill_module, "_train_step", crashing(real_step))
    with pytest.raises(KeyboardInterrupt):
        distill(student, teacher, tmp_path / "resumed", RECIPE, progress=False)
    monkeypatch.setattr(distill_module, "_train_step", real_step)
    resumed = distill(student, teacher, tmp_path / "resumed", RECIPE, progress=False)
    assert resumed.resumed_from_step == 2 and resumed.losses == straight.losses
    got = load_model(tmp_path / "resumed", cache=False).model.state_dict()
    assert got.keys() == state.keys()
    for name in state:
        torch.testing.assert_close(got[name], state[name], rtol=0, atol=0, msg=name)


def test_the_load_balance_loss_is_transformers_own_and_changes_the_routers(
    dirs: tuple[Path, Path], tmp_path: Path
) -> None:
    """The hooks' loss equals transformers' ``load_balancing_loss_func`` on Mixtral (which computes it
    itself); with a weight it changes what the routers learn while the reported loss stays the
    distillation KL; a recipe without it keeps its old identity (old checkpoints resume); a dense
    student is refused before training."""
    from autocompress_opt.errors import ConfigError
    from autocompress_opt.recover.balance import router_balance

    mixtral = tiny_model("mixtral", vocab_size=260).eval()
    ids = tokens(2, 12, seed=2)
    with torch.no_grad(), router_balance(mixtral, 1.0) as balance:
        aux = mixtral(input_ids=ids, output_router_logits=True).aux_loss
        ours = balance()
    assert ours is not None
    torch.testing.assert_close(ours, aux.float())

    student, teacher = dirs
    plain = distill(student, teacher, tmp_path / "plain", RECIPE, progress=False)
    balanced_recipe = DistillRecipe(**{**RECIPE.to_dict(), "load_balance": 0.5})
    balanced = distill(student, teacher, tmp_path / "balanced", balanced_recipe, progress=False)
    a = load_model(tmp_path / "plain", cache=False).model.state_dict()
    b = load_model(tmp_path / "balanced", cache=False).model.state_dict()
    routers = [n for n in a if n.endswith("gate.weight") and "proj" not in n]
    assert routers and any(not torch.equal(a[n], b[n]) for n in routers)
    assert balanced.losses[0] == pytest.approx(plain.losses[0])  # the reported loss is the distillation KL
    assert "load_balance" not in RECIPE.to_dict() and balanced_recipe.to_dict()["load_balance"] == 0.5

    dense_dir = save_hf_dir(tiny_model("llama", vocab_size=260), tmp_path / "dense")
    with pytest.raises(ConfigError, match=r"load_balance=0\.5: the student has no mixture-of-experts router"):
        distill(dense_dir, dense_dir, tmp_path / "dense-out", balanced_recipe, progress=False)

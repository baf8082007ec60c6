"""The inner search's memory options on a tiny random Llama: top-k teacher targets chosen by a
budget (cache keys, disk round trip, the search on either form) and activation checkpointing (the
same mask gradients and the same search result, layers restored afterwards)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from inner_helpers import FAST, TIGHT, TinyParent
from tiny_families import VOCAB, tokens

from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import adapter_for
from autocompress_opt.hf.memory import teacher_target_bytes, teacher_top_k
from autocompress_opt.quality.metrics import TeacherTargets
from autocompress_opt.search.inner.budget import CostGoal
from autocompress_opt.search.inner.inner_search import InnerConfig, objective, search
from autocompress_opt.search.inner.relaxation import ParentMasks
from autocompress_opt.search.inner.teacher import clear_teacher_memory, teacher_form, teacher_log_probs
from autocompress_opt.serving.targets import Target


class Parent(TinyParent):
    """The tiny parent under a TPOT cap, searched with :data:`TIGHT` budgets."""

    def __init__(self) -> None:
        super().__init__()
        self.goal = CostGoal.for_target(Target("h100-sxm", "datacenter", constraints={"tpot_ms": "0.9x"}), self.arch)

    def search(self, teacher: Any = None, **config: Any) -> Any:  # type: ignore[override]
        return super().search(TIGHT, self.goal, teacher=teacher, **config)


@pytest.fixture(scope="module")
def parent() -> Parent:
    return Parent()


# ----------------------------------------------------------------------------- teacher form
def test_the_budget_keeps_the_full_form_when_it_fits_and_the_largest_k_otherwise() -> None:
    # SmolLM2's default calibration set (20 x 128 tokens, V = 49,152): 0.23 GiB in full, under 2 GiB.
    assert teacher_top_k(20 * 128, 49152, 2.0) is None
    # A million Llama-3 tokens in 2 GiB: (2**31 / 1e6 - 4) // 6 = 357 tokens a position.
    assert teacher_top_k(10**6, 128256, 2.0) == 357
    k = teacher_top_k(4096, 49152, 0.05)
    assert k is not None and teacher_target_bytes(4096, 49152, k) <= 0.05 * 2**30
    assert teacher_target_bytes(4096, 49152, k + 1) > 0.05 * 2**30
    with pytest.raises(ConfigError, match=r"teacher_budget_gib=0.001 .* top 64 tokens .* raise it to at least"):
        teacher_top_k(10**5, 49152, 0.001)
    with pytest.raises(ConfigError, match="teacher_budget_gib must be a finite number > 0"):
        teacher_top_k(10, 49152, 0)


def test_top_k_targets_are_cached_apart_from_the_full_ones(parent: Parent, tmp_path: Any) -> None:
    clear_teacher_memory()  # another module's test may have left these rows in the in-process cache
    ids = tokens(3, 8, seed=9)
    kwargs: dict[str, Any] = dict(parent_id="tiny", data_id="d", cache_dir=tmp_path)
    full = teacher_log_probs(parent.model, ids, **kwargs)
    top = teacher_log_probs(parent.model, ids, top_k=16, **kwargs)
    other = teacher_log_probs(parent.model, ids, top_k=8, **kwargs)
    assert isinstance(full, torch.Tensor) and isinstance(top, TeacherTargets) and other.shape == (3, 8, 8)
    assert len(list(tmp_path.glob("*.safetensors"))) == 3  # the form and k are in the key
    clear_teacher_memory()
    again = teacher_log_probs(parent.model, ids, top_k=16, **kwargs)
    assert isinstance(again, TeacherTargets) and again is not top
    for name in ("ids", "log_probs", "tail_log_mass"):
        assert torch.equal(getattr(again, name), getattr(top, name))
    assert teacher_form(top) == {"form": "top-k", "k": 16, "bytes": top.nbytes, "bytes_per_token": 16 * 6 + 4}
    assert teacher_form(full) == {"form": "full", "k": None, "bytes": 3 * 8 * VOCAB * 2, "bytes_per_token": VOCAB * 2}
    # A budget that holds the full form (3 x 8 x 97 x 2 bytes) keeps it; below it, a vocabulary of 97
    # tokens has no top-k of at least 64 that is smaller (6 x 64 + 4 > 2 x 97 bytes a token).
    kept = teacher_log_probs(parent.model, ids, budget_gib=24 * VOCAB * 2 / 2**30, **kwargs)
    assert isinstance(kept, torch.Tensor) and torch.equal(kept, full)
    with pytest.raises(ConfigError, match="top 64 tokens"):
        teacher_log_probs(parent.model, ids, budget_gib=24 * VOCAB / 2**30, **kwargs)
    with pytest.raises(ConfigError, match="either top_k or budget_gib"):
        teacher_log_probs(parent.model, ids, top_k=8, budget_gib=1.0, **kwargs)


def test_the_search_runs_on_top_k_targets_and_matches_the_full_form_at_k_equal_to_v(parent: Parent) -> None:
    clear_teacher_memory()
    whole = teacher_log_probs(parent.model, parent.tokens, parent_id="tiny-memory", top_k=VOCAB)
    full, sparse = parent.search(), parent.search(whole)
    assert sparse.architecture == full.architecture
    for a, b in zip(full.history, sparse.history):
        assert a["kl"] == pytest.approx(b["kl"], rel=1e-4, abs=1e-6)
    few = parent.search(teacher_log_probs(parent.model, parent.tokens, parent_id="tiny-memory", top_k=8))
    assert len(few.history) == FAST.steps
    # The first step sees the same batch and masks: the lumped KL is a lower bound of the full one.
    assert 0 < few.history[0]["kl"] <= full.history[0]["kl"] + 1e-3


# ----------------------------------------------------------------------------- checkpointing
def _mask_gradients(parent: Parent, checkpointing: bool) -> tuple[float, dict[str, torch.Tensor]]:
    masks = ParentMasks(parent.arch, parent.importance, hidden_size=TIGHT.hidden_size)
    gen = torch.Generator().manual_seed(0)
    layers = [p.layer for p in adapter_for(parent.model).all_layer_parts(parent.model)]
    with masks.install(parent.model), masks.checkpoint_layers(parent.model) if checkpointing else _nothing():
        assert all(("forward" in vars(layer)) == checkpointing for layer in layers)
        loss, kl, _ = objective(
            parent.model,
            masks,
            parent.tokens[:2],
            parent.teacher[:2],
            budget=TIGHT,
            goal=parent.goal,
            tau=0.5,
            duals={"tpot_ms <= 0.9x": 1.0},
            config=FAST,
            generator=gen,
        )
        loss.backward()  # rebuilds the checkpointed layers, outside masks.use(...)
    assert not any("forward" in vars(layer) for layer in layers)  # restored
    return kl, {name: p.grad.clone() for name, p in masks.named_parameters() if p.grad is not None}


def _nothing() -> Any:
    import contextlib

    return contextlib.nullcontext()


def test_checkpointing_gives_the_same_mask_gradients(parent: Parent) -> None:
    kl_plain, plain = _mask_gradients(parent, False)
    kl_ckpt, ckpt = _mask_gradients(parent, True)
    assert kl_plain == kl_ckpt
    assert set(plain) == set(ckpt) == {name for name, _ in _masks(parent).named_parameters()}
    for name in plain:
        assert (plain[name] != 0).any(), name
        torch.testing.assert_close(ckpt[name], plain[name], rtol=1e-6, atol=1e-8)


def _masks(parent: Parent) -> ParentMasks:
    return ParentMasks(parent.arch, parent.importance, hidden_size=TIGHT.hidden_size)


def test_checkpointing_gives_the_same_search_result(parent: Parent) -> None:
    plain = parent.search()
    ckpt = parent.search(checkpoint_activations=True)
    assert ckpt.architecture == plain.architecture and ckpt.selection == plain.selection
    for a, b in zip(plain.history, ckpt.history):
        assert a["kl"] == pytest.approx(b["kl"], rel=1e-6) and a["max_violation"] == b["max_violation"]
    layers = [p.layer for p in adapter_for(parent.model).all_layer_parts(parent.model)]
    assert not any("forward" in vars(layer) for layer in layers)


def test_checkpointing_leaves_the_measured_progress_unchanged(parent: Parent) -> None:
    """The held-out measurements during training (no gradients: layers run unwrapped) report the same
    KL and violation with and without checkpointing."""
    heard: dict[bool, list[tuple[int, float | None, float | None]]] = {False: [], True: []}
    for ckpt in (False, True):
        search(
            parent.model,
            parent.arch,
            parent.importance,
            parent.tokens,
            parent.teacher,
            budget=TIGHT,
            goal=parent.goal,
            config=InnerConfig(**{**FAST.to_dict(), "report_every": 2, "checkpoint_activations": ckpt}),
            on_step=lambda step, kl, violation, ckpt=ckpt: heard[ckpt].append((step, kl, violation)),
        )
    assert [kl for _, kl, _ in heard[True] if kl is not None]  # measured at steps 2 and 4
    assert heard[True] == heard[False]


def test_checkpoint_activations_is_a_validated_inner_key() -> None:
    assert InnerConfig.from_dict({"checkpoint_activations": True}).checkpoint_activations
    assert InnerConfig().checkpoint_activations is False
    with pytest.raises(ConfigError, match="checkpoint_activations must be true or false, got 'yes'"):
        InnerConfig(checkpoint_activations="yes")  # type: ignore[arg-type]

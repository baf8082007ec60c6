"""Nemotron-H's per-layer ("Puzzle") form: masks whose MoE layers keep different expert widths and top-k
slice a tiny Nemotron-H (Mamba-2, latent MoE, attention, relu² MLP) into a ``nemotron_h_puzzle`` child
with the masked parent's logits, which saves, reloads without remote code, reads back as an
Architecture with the per-layer sizes, and slices again; what no form holds is refused by name."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from golden_cost import GOLD_ENGINE, GOLD_HW, GOLD_PROFILE, GOLD_SCENARIO
from puzzle_helpers import per_layer_masks
from safetensors import safe_open
from tiny_families import TINY_MOE, hybrid_model, num_params, tiny_model, tokens
from tiny_lm import byte_tokenizer
from transformers import AutoModelForCausalLM, NemotronHForCausalLM

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.catalog import load_architecture
from autocompress_opt.cli import main
from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import architecture_mismatch, moe_adapter
from autocompress_opt.hf.puzzle import NemotronHPuzzleConfig, NemotronHPuzzleForCausalLM
from autocompress_opt.prune.experts import expert_masks, export_experts, slice_experts
from autocompress_opt.prune.importance import Importance, estimate_importance
from autocompress_opt.prune.masking import Masks, apply_masks
from autocompress_opt.serving.costmodel import estimate_cost

# The hybrid "ME*M-E" (tiny_families.HYBRID): MoE layers 1 and 5, 8 experts of 16 channels, top-2, a shared
# expert of 32, Mamba-2 layers of 8 heads. Every MoE layer keeps 6 experts and 24 shared channels, every
# Mamba-2 layer 6 heads; layer 1 keeps 8 channels per expert and top-1, layer 5 12 channels and top-2.
BASE = {"num_experts": 6, "shared_width": 24, "mamba_heads": 6}
PER_LAYER = {1: {"expert_width": 8, "experts_per_token": 1}, 5: {"expert_width": 12, "experts_per_token": 2}}
BLOCKS = [
    {"block_type": "mamba"},
    {"block_type": "moe", "moe_intermediate_size": 8, "num_experts_per_tok": 1},
    {"block_type": "attention"},
    {"block_type": "mamba"},
    {"block_type": "mlp"},
    {"block_type": "moe", "moe_intermediate_size": 12, "num_experts_per_tok": 2},
]


@pytest.fixture(scope="module")
def model() -> Any:
    torch.set_num_threads(2)
    return hybrid_model()


@pytest.fixture(scope="module")
def importance(model: Any) -> Importance:
    return estimate_importance(model, tokens(4, 12), adapter=moe_adapter(model), progress=False)


@pytest.fixture(scope="module")
def masks(model: Any, importance: Importance) -> Masks:
    return per_layer_masks(model, importance, BASE, PER_LAYER)


@pytest.fixture(scope="module")
def exported(model: Any, masks: Masks, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_experts(model, masks, tmp_path_factory.mktemp("puzzle") / "child")


def logits(model: Any) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens(3, 14, seed=1)).logits


def masked_logits(model: Any, masks: Masks) -> torch.Tensor:
    with apply_masks(model, masks, adapter=moe_adapter(model)):
        return logits(model)


def moe_sizes(model: Any) -> list[tuple[int, int, int, int]]:
    """(experts, channels per expert, top-k, shared channels) of each MoE layer, read from the modules."""
    parts = moe_adapter(model).all_layer_parts(model)
    return [(p.num_experts, p.expert_width, int(p.router.top_k), p.shared_width) for p in parts if p.moe is not None]


def test_per_layer_masks_slice_to_a_puzzle_child_with_the_masked_logits(model: Any, masks: Masks) -> None:
    child = slice_experts(model, masks)
    assert type(child) is NemotronHPuzzleForCausalLM and child.config.model_type == "nemotron_h_puzzle"
    assert moe_sizes(child) == [(6, 8, 1, 24), (6, 12, 2, 24)]
    assert child.config.block_configs == BLOCKS and child.config.mamba_num_heads == 6
    torch.testing.assert_close(logits(child), masked_logits(model, masks))


def test_a_width_off_the_grouped_kernels_rows_runs_its_experts_one_at_a_time(
    model: Any, importance: Importance
) -> None:
    """transformers' grouped expert kernel takes rows of whole 16 bytes only: widths the per-layer search
    may leave (10 and 6 channels, 40 and 24 bytes in float32) failed in its forward ("strides should be
    multiple of 16 bytes"); such a layer runs its experts one at a time and computes the masked logits."""
    odd = per_layer_masks(
        model,
        importance,
        BASE,
        {1: {"expert_width": 10, "experts_per_token": 2}, 5: {"expert_width": 6, "experts_per_token": 1}},
    )
    child = slice_experts(model, odd)
    assert moe_sizes(child) == [(6, 10, 2, 24), (6, 6, 1, 24)]
    assert [child.config.layer_config(i)._experts_implementation for i in (1, 5)] == ["eager", "eager"]
    torch.testing.assert_close(logits(child), masked_logits(model, odd))


def test_the_export_holds_block_configs_and_reloads_without_remote_code(
    model: Any, masks: Masks, exported: Path
) -> None:
    config = json.loads((exported / "config.json").read_text())
    assert config["model_type"] == "nemotron_h_puzzle" and config["architectures"] == ["NemotronHPuzzleForCausalLM"]
    assert config["block_configs"] == BLOCKS and "auto_map" not in config
    assert (config["n_routed_experts"], config["moe_shared_expert_intermediate_size"], config["mamba_num_heads"]) == (
        6,
        24,
        6,
    )
    assert (config["moe_intermediate_size"], config["num_experts_per_tok"]) == (12, 2)  # the largest per-layer
    with safe_open(str(exported / "model.safetensors"), "pt") as f:  # Nemotron-H's stored form: what llama.cpp reads
        assert f.get_slice("backbone.layers.1.mixer.experts.5.up_proj.weight").get_shape() == [8, 16]
        assert f.get_slice("backbone.layers.5.mixer.experts.0.down_proj.weight").get_shape() == [16, 12]
    child = AutoModelForCausalLM.from_pretrained(exported)
    assert type(child) is NemotronHPuzzleForCausalLM and moe_sizes(child) == [(6, 8, 1, 24), (6, 12, 2, 24)]
    torch.testing.assert_close(logits(child), masked_logits(model, masks))


def test_the_architecture_read_from_the_folder_has_the_per_layer_sizes(
    exported: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    arch = load_architecture(exported)
    moe = [
        (s.moe.num_experts, s.moe.expert_width, s.moe.experts_per_token, s.moe.shared_width)
        for s in arch.layers
        if s.moe
    ]
    assert arch.family == "nemotron_h" and moe == [(6, 8, 1, 24), (6, 12, 2, 24)]
    child = AutoModelForCausalLM.from_pretrained(exported)
    assert architecture_mismatch(arch, moe_adapter(child).architecture(child)) is None
    assert arch.num_params == num_params(child)
    # Active parameters follow each layer's own top-k and width: layer 1's MoE runs one 8-channel expert.
    top2 = tuple(replace(s, moe=replace(s.moe, experts_per_token=2)) if s.moe else s for s in arch.layers)
    uniform = replace(arch, layers=top2)
    one_expert = 2 * 8 * 16  # up (8, 16) and down (16, 8) of one expert over the latent width 16
    assert uniform.active_params() - arch.active_params() == one_expert
    cost = lambda a: estimate_cost(a, GOLD_HW, GOLD_ENGINE, GOLD_SCENARIO, GOLD_PROFILE)
    assert cost(uniform).active_params - cost(arch).active_params == one_expert
    assert main(["arch", "--model", str(exported), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["params"]["active"] == arch.active_params()


def test_load_model_registers_the_puzzle_class(exported: Path, tmp_path: Path) -> None:
    """In a fresh interpreter that never imported hf.puzzle, load_model reads the folder (the per-layer
    Architecture it checks against the loaded model counts exactly its parameters)."""
    folder = shutil.copytree(exported, tmp_path / "child")
    byte_tokenizer().save_pretrained(folder)
    code = (
        "import sys; from autocompress_opt.hf.loading import load_model; m = load_model(sys.argv[1]); "
        "print(type(m.model).__name__, [(s.moe.expert_width, s.moe.experts_per_token) for s in m.architecture.layers "
        "if s.moe])"
    )
    run = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "NemotronHPuzzleForCausalLM [(8, 1), (12, 2)]"


def test_a_puzzle_parent_slices_again(exported: Path) -> None:
    """A loaded Puzzle model is a parent like any other: all-ones masks give its logits, a point's absent
    choice keeps each layer's own size, per-layer masks slice to a Puzzle child, uniform ones to a plain one."""
    parent = AutoModelForCausalLM.from_pretrained(exported)
    adapter = moe_adapter(parent)
    assert torch.equal(masked_logits(parent, Masks.ones(adapter.architecture(parent))), logits(parent))
    imp = estimate_importance(parent, tokens(4, 12), adapter=adapter, progress=False)
    fewer = expert_masks(parent, imp, {"num_experts": 4})
    assert moe_sizes(slice_experts(parent, fewer)) == [(4, 8, 1, 24), (4, 12, 2, 24)]
    again = per_layer_masks(parent, imp, {"num_experts": 4}, {5: {"expert_width": 4, "experts_per_token": 1}})
    child = slice_experts(parent, again)
    assert type(child) is NemotronHPuzzleForCausalLM and moe_sizes(child) == [(4, 8, 1, 24), (4, 4, 1, 24)]
    torch.testing.assert_close(logits(child), masked_logits(parent, again))
    uniform = expert_masks(parent, imp, {"expert_width": 8, "experts_per_token": 1})
    plain = slice_experts(parent, uniform)
    assert type(plain) is NemotronHForCausalLM and plain.config.model_type == "nemotron_h"
    assert (plain.config.moe_intermediate_size, plain.config.num_experts_per_tok) == (8, 1)
    torch.testing.assert_close(logits(plain), masked_logits(parent, uniform))


def test_the_released_spelling_loads(model: Any, masks: Masks, tmp_path: Path) -> None:
    """The released checkpoints: block_type as Megatron spells it or as transformers does, a MoE entry
    without sizes (the global ones), a layers pattern that block_configs overrides, and a ``model.*`` trunk
    with stacked experts (the BF16 release; ours writes ``backbone.*`` and one tensor per expert)."""
    from safetensors.torch import save_file

    child = slice_experts(model, masks)
    data = child.config.to_dict()
    data["block_configs"][0]["block_type"] = "linear_attention"
    data["block_configs"][5] = {"block_type": "moe"}  # the global sizes: 12 channels, top-2
    data.update(hybrid_override_pattern="M" * 6)
    config = NemotronHPuzzleConfig(**{k: v for k, v in data.items() if k != "model_type"})
    assert config.block_configs == BLOCKS and config.layers_block_type == list(child.config.layers_block_type)
    (tmp_path / "config.json").write_text(json.dumps(data))
    save_file({k: v.contiguous() for k, v in child.state_dict().items()}, tmp_path / "model.safetensors")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert next(iter(child.state_dict())).startswith("model.")
    torch.testing.assert_close(logits(loaded), logits(child), rtol=0, atol=0)


def test_bad_block_configs_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"block_configs\[1\].block_type 'expert' is not a Nemotron-H layer kind"):
        NemotronHPuzzleConfig(block_configs=[{"block_type": "mamba"}, {"block_type": "expert"}])
    with pytest.raises(ConfigError, match=r"block_configs\[0\].num_experts_per_tok=9 exceeds n_routed_experts=8"):
        NemotronHPuzzleConfig(n_routed_experts=8, block_configs=[{"block_type": "moe", "num_experts_per_tok": 9}])
    with pytest.raises(
        ConfigError, match=r"block_configs\[0\].moe_intermediate_size must be a positive int, got .wide."
    ):
        NemotronHPuzzleConfig(block_configs=[{"block_type": "moe", "moe_intermediate_size": "wide"}])


def test_what_no_form_holds_is_refused(model: Any, importance: Importance) -> None:
    """Nemotron-H: the experts kept and the shared width are global in the Puzzle form too (llama.cpp);
    Qwen3-MoE: no per-layer form its engines read."""
    experts = per_layer_masks(model, importance, BASE, {5: {"num_experts": 5}})
    with pytest.raises(
        ConfigError,
        match=r"different numbers of experts or shared widths \(layers \[1\]: experts 6, shared 24; "
        r"layers \[5\]: experts 5, shared 24\).*one n_routed_experts",
    ):
        slice_experts(model, experts)
    shared = per_layer_masks(model, importance, BASE, {1: {"shared_width": 16}})
    with pytest.raises(ConfigError, match=r"layers \[1\]: experts 6, shared 16; layers \[5\]: experts 6, shared 24"):
        slice_experts(model, shared)
    qwen = tiny_model("qwen3_moe", **TINY_MOE)  # MoE layers 0 and 2
    imp = estimate_importance(qwen, tokens(4, 16), adapter=moe_adapter(qwen), progress=False)
    uneven = per_layer_masks(qwen, imp, {}, {2: {"expert_width": 8}})
    with pytest.raises(ConfigError, match=r"pruned to different sizes .*engines read no per-layer form"):
        slice_experts(qwen, uneven)


def test_uniform_masks_keep_the_plain_family_model(model: Any, importance: Importance) -> None:
    masks = expert_masks(model, importance, {**BASE, "expert_width": 8, "experts_per_token": 1})
    child = slice_experts(model, masks)
    assert type(child) is NemotronHForCausalLM and not hasattr(child.config, "block_configs")
    assert Architecture.from_hf_config(child.config).num_params == num_params(child)

"""A device, engine, profile and architecture with round numbers, shared by the cost-model tests so
golden values can be worked by hand (tests/serving/test_costmodel.py, tests/arch/test_sliding_window.py)."""

from __future__ import annotations

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.serving.costmodel import Scenario
from autocompress_opt.serving.engine_models import Engine
from autocompress_opt.serving.hardware import Hardware
from autocompress_opt.serving.profiles import CostProfile

# A device, engine and profile with round numbers, so golden values can be worked by hand.
GOLD_HW = Hardware(name="gold", memory_gib=10, bandwidth_gb_s=100, peak_tflops={"bf16": 10})
GOLD_ENGINE = Engine(
    name="gold",
    description="hand-checkable",
    kernels_per_attention=1,
    kernels_per_ffn=1,
    kernels_per_step=0,
    chunk_tokens=0,
    kv_block_tokens=1,
    memory_policy="dynamic",
    max_seqs=1 << 20,
    framework_gib=0.0,
)
GOLD_PROFILE = CostProfile("gold", mfu=0.5, mbu=0.5, kernel_launch_us=1.0, step_overhead_ms=0.01)
GOLD_ARCH = Architecture.uniform(
    num_layers=2,
    hidden_size=64,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    ffn_width=128,
    vocab_size=1000,
    tie_embeddings=False,
)
GOLD_SCENARIO = Scenario(dtype="bf16", input_len=100, output_len=21, concurrency=1)

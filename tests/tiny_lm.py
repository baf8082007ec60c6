"""Tiny real language-model artefacts built in milliseconds, for tests of loading, text and quality.

- :func:`byte_tokenizer`: a byte-level ``PreTrainedTokenizerFast`` (token id = byte value, 256 ids).
- :func:`tiny_model`: a random 2-layer, hidden-32 causal LM of a family, vocabulary :data:`VOCAB`.
- :func:`save_hf_dir`: model + tokenizer as a Hugging Face directory (safetensors).
- :func:`text_folder`: a folder of small distinct text files, a ``--data`` corpus of a chosen size.
- :func:`write_qwen2_gguf`: a Qwen2 model as an F32 GGUF, written with ``gguf.GGUFWriter`` the way
  llama.cpp names tensors, with a byte-level BPE tokenizer in its metadata.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

# 256 byte tokens + 2 merged tokens + 2 control tokens (the GGUF tokenizer below uses all 260).
VOCAB = 260
_MERGES = ("h e", "Ġ t")


def byte_tokenizer(bos: bool = False) -> Any:
    """Token id = UTF-8 byte value; with ``bos=True`` it prepends ``<s>`` (id 256) like Llama-2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {char: byte for byte, char in bytes_to_unicode().items()}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    if not bos:
        return PreTrainedTokenizerFast(tokenizer_object=backend)
    backend.add_special_tokens(["<s>"])
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 256)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>")


def tiny_model(family: str = "qwen2", seed: int = 0, **overrides: Any) -> Any:
    """A random causal LM (2 layers, hidden 32, 4 query / 2 KV heads, FFN 48) in eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        family,
        **{
            "vocab_size": VOCAB,
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 48,
            "max_position_embeddings": 128,
            "tie_word_embeddings": False,
            "rms_norm_eps": 1e-6,
            **overrides,
        },
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()


def save_hf_dir(model: Any, path: Path, tokenizer: Any | None = None) -> Path:
    """Write ``model`` (safetensors) and a tokenizer into ``path``; returns ``path``."""
    model.save_pretrained(path)
    (tokenizer or byte_tokenizer()).save_pretrained(path)
    return path


def text_folder(root: Path, n_files: int, size: int, name: str = "corpus") -> Path:
    """``root/name`` holding ``n_files`` documents of ``size`` ASCII bytes (no newline), each text distinct.

    The split hashes each file's text, so the same arguments give the same calibration / selection /
    test documents wherever ``root`` is."""
    folder = root / name
    folder.mkdir()
    for i in range(n_files):
        line = f"document {i} says {'abcdefghij'[i % 10] * (i % 7 + 1)}. "
        (folder / f"doc{i:03d}.txt").write_text((line * (size // len(line) + 1))[:size], encoding="utf-8")
    return folder


# transformers parameter name → llama.cpp GGUF tensor name (gguf-py MODEL_TENSOR for qwen2).
_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_PER_LAYER = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def write_qwen2_gguf(model: Any, path: Path, *, architecture: str = "qwen2") -> Path:
    """Write a Qwen2 ``model`` as an all-F32 GGUF (Qwen2 q/k are stored unpermuted, as llama.cpp does).

    ``architecture`` overrides ``general.architecture`` (to test unsupported families).
    """
    import gguf
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    cfg = model.config
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny-qwen2")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokens = [*bytes_to_unicode().values(), *(m.replace(" ", "") for m in _MERGES), "<|endoftext|>", "<|im_end|>"]
    assert len(tokens) == cfg.vocab_size == VOCAB
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.NORMAL] * (VOCAB - 2) + [gguf.TokenType.CONTROL] * 2)
    writer.add_token_merges(list(_MERGES))
    writer.add_eos_token_id(VOCAB - 1)
    for name, tensor in model.state_dict().items():
        writer.add_tensor(_gguf_name(name), tensor.detach().float().numpy().copy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _gguf_name(name: str) -> str:
    if name in _GLOBAL:
        return _GLOBAL[name]
    _, _, layer, *module, kind = name.split(".")  # model.layers.<i>.<module...>.<weight|bias>
    return f"blk.{layer}.{_PER_LAYER['.'.join(module)]}.{kind}"

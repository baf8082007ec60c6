"""Fixtures of the real-engine tests: the installed engines (a clear skip naming `make engines` when
absent) and the real SmolLM2 tokenizer the tiny exports carry (llama.cpp's converter needs a tokenizer
it recognises). The tiny models are in :mod:`engine_models`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autocompress_opt.runtimes import install


def engine_or_skip(name: str) -> Any:
    try:
        return install.llamacpp() if name == "llamacpp" else install.vllm()
    except install.EngineMissing as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def llamacpp_engine() -> Any:
    return engine_or_skip("llamacpp")


@pytest.fixture(scope="session")
def vllm_engine() -> Any:
    return engine_or_skip("vllm")


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_gguf: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name, local_files_only=True)

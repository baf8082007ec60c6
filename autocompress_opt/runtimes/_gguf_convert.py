"""Runs llama.cpp's ``convert_hf_to_gguf.py`` in the converter's environment, with one fix.

Not imported by the package: :mod:`autocompress_opt.runtimes.llamacpp` runs it as
``python _gguf_convert.py LLAMA_SRC MODEL_DIR [converter arguments]``.

The fix: the converter's ``DeciModel.set_vocab`` treats every vocabulary other than Llama-3's
(128256 tokens) as SentencePiece (``tokenizer.model``), so a DeciLM checkpoint of a BPE-tokenised
Llama (SmolLM2: ``tokenizer.json`` only) does not convert. Here a DeciLM checkpoint without
``tokenizer.model`` takes the GPT-2-style BPE path, as the converter's own Llama model does
(``conversion/llama.py``: SentencePiece, then the HF tokenizer, then BPE). Nothing else changes.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def main() -> None:
    src = Path(sys.argv[1])
    sys.path[:0] = [str(src), str(src / "gguf-py")]
    import convert_hf_to_gguf
    from conversion.deci import DeciModel

    original = DeciModel.set_vocab

    def set_vocab(self: Any) -> None:
        if self.hparams.get("vocab_size", 128256) == 128256 or (Path(self.dir_model) / "tokenizer.model").is_file():
            original(self)
        else:
            self._set_vocab_gpt2()

    DeciModel.set_vocab = set_vocab
    sys.argv = ["convert_hf_to_gguf.py", *sys.argv[2:]]
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()

"""Old import path of the heterogeneous decoder, kept because exported checkpoints' READMEs say
``import autocompress_opt.hetero_model``; importing it registers ``autocompress_decilm`` with the
transformers Auto classes. The code lives in :mod:`autocompress_opt.hf.hetero_model`."""

from autocompress_opt.hf.hetero_model import *  # noqa: F403
from autocompress_opt.hf.hetero_model import __all__  # noqa: F401

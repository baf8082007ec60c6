"""Installed serving runtimes (vLLM, llama.cpp), as opposed to their cost models
(:mod:`autocompress_opt.serving.engine_models`) and the rules of what they load
(:mod:`autocompress_opt.prune.loadability`): whether they serve an export as the
reference does, and how fast they run it."""

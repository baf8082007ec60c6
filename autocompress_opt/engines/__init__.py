"""Real serving engines (vLLM, llama.cpp): what they can load, whether they serve an export as the
reference does, and how fast they run it."""

"""LLMs: tokenizer and chat template from GGUF metadata, generation, terminal chat and an OpenAI-compatible server."""

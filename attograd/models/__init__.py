"""Models people use, written over the public API (Tensor, nn): bert.py (sentence embeddings from Hugging Face
files), gpt.py (a GPT-2 style model to train), llama.py (llama-family decoders from GGUF files). hf.py reads Hugging
Face-style model directories. Nothing in attograd's core imports this package."""

"""Models people use, written over the public API (Tensor, nn): bert.py (sentence embeddings from Hugging Face
files), gpt.py (a GPT-2 style model to train). hf.py reads Hugging Face-style model directories.
Nothing in attograd imports this package."""

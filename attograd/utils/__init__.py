"""Utilities above the Tensor: data loading (attograd.utils.data, torch.utils.data's names)."""

"""Indexing with tensors: advanced __getitem__, __setitem__, gather, scatter, masked_fill."""
from __future__ import annotations

class IndexingOps:
  __slots__ = ()  # Tensor defines the slots

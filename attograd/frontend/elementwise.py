"""The math and activation set, random creation helpers, and composite nn functions."""
from __future__ import annotations

class ElementwiseOps:
  __slots__ = ()  # Tensor defines the slots

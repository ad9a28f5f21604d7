"""Ops that reorder or combine elements: scans, sort and topk, cat/stack/split, roll, triangles."""
from __future__ import annotations

class ReorderOps:
  __slots__ = ()  # Tensor defines the slots

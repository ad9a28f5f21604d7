"""TinyJit lives here (issue: JIT). For now only the guard that reads inside a capture refuse."""
from __future__ import annotations

_capturing: list[object] = []

def check_not_capturing(what: str) -> None:
  if _capturing: raise RuntimeError(f"{what} inside a TinyJit-captured function would bake a stale value into every replay")

"""torch.return_types: what max/min with a dim, sort, topk, median with a dim, cummax and cummin return, a (values,
indices) pair that also reads as .values and .indices (torch code writes x.topk(k).indices). Its own module so the front
end's mixins (frontend/reorder.py) and tensor.py can both return it."""
from __future__ import annotations
from typing import Any

_VI_HINT = ("max/min with a positional or dim= dimension (and sort, topk, median with a dim, cummax, cummin) return torch's (values, indices) pair, which can't be {what}: "
            "take .values (x.max(1).values, x.sort(1).values, as in torch), or use x.max(axis=1) / x.amax(1) for the tensor (as in tinygrad)")

def _vi_refuse(self: Any, *args: Any) -> Any: raise TypeError(_VI_HINT.format(what="used in arithmetic"))

class ValuesIndices(tuple):
  """A (values, indices) pair that also reads as .values and .indices."""
  __slots__ = ()
  def __new__(cls, values: Any, indices: Any) -> ValuesIndices: return tuple.__new__(cls, (values, indices))
  values = property(lambda self: self[0])
  indices = property(lambda self: self[1])
  # a tuple would silently concatenate (vi + vi) or repeat (vi * 2): in a numeric program that is always a slip
  __add__ = __radd__ = __mul__ = __rmul__ = __sub__ = __rsub__ = __truediv__ = __rtruediv__ = __neg__ = __pow__ = _vi_refuse
  __lt__ = __le__ = __gt__ = __ge__ = _vi_refuse
  def __getattr__(self, name: str) -> Any:  # only reached for names a tuple lacks (x.max(1).exp(), .shape, .numpy()...)
    if name.startswith("__"): raise AttributeError(name)
    raise AttributeError(f"'ValuesIndices' has no attribute {name!r}: " + _VI_HINT.format(what="used as a tensor"))

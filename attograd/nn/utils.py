"""torch.nn.utils: gradient clipping and flat parameter vectors."""
from __future__ import annotations
import math
from typing import Iterable
from attograd.errors import ArgumentError  # a ValueError and a RuntimeError: code written for torch catches it
from attograd.tensor import Tensor

def _tensors(parameters: Tensor | Iterable[Tensor]) -> list[Tensor]:
  return [parameters] if isinstance(parameters, Tensor) else list(parameters)

def get_total_norm(tensors: Tensor | Iterable[Tensor], norm_type: float = 2.0, error_if_nonfinite: bool = False) -> Tensor:
  ts = _tensors(tensors)
  if not ts: return Tensor(0.0)
  if norm_type == math.inf: total = Tensor.stack(*[t.abs().max().float() for t in ts]).max()
  else: total = Tensor.stack(*[t.abs().float().pow(norm_type).sum() for t in ts]).sum().pow(1.0 / norm_type)
  if error_if_nonfinite and not math.isfinite(total.item()):
    raise RuntimeError(f"the total norm of order {norm_type} of the gradients is non-finite, so they can't be clipped")
  return total

def clip_grad_norm_(parameters: Tensor | Iterable[Tensor], max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach: bool | None = None) -> Tensor:
  """Scale every gradient by min(1, max_norm / (total norm + 1e-6)); returns the total norm (lazy, as the new gradients)."""
  ps = [p for p in _tensors(parameters) if p.grad is not None]
  total = get_total_norm([p.grad for p in ps], norm_type, error_if_nonfinite)
  coef = (max_norm / (total + 1e-6)).minimum(1.0)
  for p in ps: p.grad = p.grad * coef.cast(p.grad.dtype)
  return total

def clip_grad_value_(parameters: Tensor | Iterable[Tensor], clip_value: float, foreach: bool | None = None) -> None:
  for p in _tensors(parameters):
    if p.grad is not None: p.grad = p.grad.clip(-clip_value, clip_value)

def parameters_to_vector(parameters: Iterable[Tensor]) -> Tensor:
  ps = _tensors(parameters)
  if not ps: raise ArgumentError("parameters_to_vector of no parameters")
  return Tensor.cat(*[p.flatten() for p in ps])

def vector_to_parameters(vec: Tensor, parameters: Iterable[Tensor]) -> None:
  ps = _tensors(parameters)
  n = sum(p.numel() for p in ps)
  if vec.ndim != 1 or vec.shape[0] != n: raise ArgumentError(f"vector_to_parameters: a vector of shape {vec.shape} for parameters of {n} elements")
  i = 0
  for p in ps:
    p.assign(vec[i:i + p.numel()].reshape(p.shape))
    i += p.numel()

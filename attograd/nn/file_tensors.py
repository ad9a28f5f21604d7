"""Tensors over bytes a loader found: in a file (lazily, read when realized) or in host memory. Shared by nn/state.py
(safetensors, GGUF) and nn/torch_checkpoint.py."""
from __future__ import annotations
import dataclasses
from attograd.dtype import DType
from attograd.helpers import prod
from attograd.uop.ops import UOp, Ops
from attograd.tensor import Tensor
from attograd.schedule.schedule import new_buffer
from attograd.engine.realize import buffer_of

def disk_tensor(path: str, offset: int, dtype: DType, shape: tuple[int, ...]) -> Tensor:
  """A lazy tensor of `shape` whose bytes are at byte `offset` of the file."""
  buf = new_buffer(f"DISK:{path}", prod(shape), dtype)
  buf = buf.replace(arg=dataclasses.replace(buf.arg, offset=offset))
  buffer_of(buf).ensure_allocated()  # binds it to the file as it is now: a later replace doesn't change it
  return Tensor(buf if shape == (buf.arg.size,) else UOp(Ops.RESHAPE, dtype, (buf,), shape))

def cpu_tensor(raw: bytes | memoryview, dtype: DType, shape: tuple[int, ...]) -> Tensor:
  """A tensor of `shape` in CPU memory holding a copy of `raw`."""
  buf = new_buffer("CPU", prod(shape), dtype)
  buffer_of(buf).copyin(memoryview(raw))
  return Tensor(buf if shape == (buf.arg.size,) else UOp(Ops.RESHAPE, dtype, (buf,), shape))

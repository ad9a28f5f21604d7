"""PYTHON device: executes the linear UOps directly. It is slow and it is the reference
semantics: every other backend must agree with it."""
from __future__ import annotations
import itertools, json, struct
from typing import Any, Iterator
from attograd.dtype import DType, dtypes, truncate
from attograd.helpers import bf16_bits_to_float, float_to_bf16_bits
from attograd.uop.ops import UOp, Ops, GroupOp, exec_alu
from attograd.uop.serialize import graph_data, graph_from_data
from attograd.runtime.device import Allocator, Compiler, Compiled
from attograd.renderer import IR_SEMANTICS, Renderer, scalar_args

class PythonAllocator(Allocator):
  def alloc(self, nbytes: int) -> bytearray: return bytearray(nbytes)
  def copyin(self, dest: bytearray, src: memoryview) -> None: dest[:src.nbytes] = src.cast("B")
  def copyout(self, dest: memoryview, src: bytearray) -> None: dest.cast("B")[:] = src[:dest.nbytes]
  def host_view(self, mem: bytearray) -> memoryview: return memoryview(mem)

class PythonRenderer(Renderer):
  """The 'source' is the linear UOp list itself, as data (JSON, uop/serialize.py): it can sit in the program cache."""
  device = "PYTHON"
  native = IR_SEMANTICS  # it defines them (uop/ops.py exec_alu)
  def render(self, name: str, uops: list[UOp]) -> str: return json.dumps(graph_data(uops), separators=(",", ":"))

def _f16_from_bits(b: int) -> float: return struct.unpack("<e", struct.pack("<H", b))[0]
def _f16_to_bits(v: float) -> int: return struct.unpack("<H", struct.pack("<e", truncate(dtypes.float16, v)))[0]
# 16-bit floats live as their bits: memoryview has no bfloat16 and can't cast to "e"
_FROM_BITS = {dtypes.bfloat16: bf16_bits_to_float, dtypes.float16: _f16_from_bits}
_TO_BITS = {dtypes.bfloat16: float_to_bf16_bits, dtypes.float16: _f16_to_bits}

class Memory:
  """A buffer seen as Python values."""
  def __init__(self, raw: bytearray, dtype: DType):
    self.dtype, self.from_bits, self.to_bits = dtype, _FROM_BITS.get(dtype), _TO_BITS.get(dtype)
    raw = memoryview(raw)
    raw = raw[:len(raw) - len(raw) % dtype.itemsize]  # an empty buffer still holds one byte
    self.view = raw.cast("H" if self.from_bits else dtype.fmt)
  def __getitem__(self, i: int) -> Any:
    return self.from_bits(self.view[i]) if self.from_bits else self.view[i]
  def __setitem__(self, i: int, v: Any) -> None:
    self.view[i] = self.to_bits(v) if self.to_bits else truncate(self.dtype, v)

def bitcast(v: Any, frm: DType, to: DType) -> Any:
  fmt = lambda d: "H" if d == dtypes.bfloat16 else d.fmt
  if frm == dtypes.bfloat16: v = float_to_bf16_bits(v)
  out = struct.unpack(fmt(to), struct.pack(fmt(frm), v))[0]
  return bf16_bits_to_float(out) if to == dtypes.bfloat16 else out

class PythonProgram:
  """Runs the uops once, or for a GPU-style program (SPECIAL thread ids) once per thread: the threads of
  a work-group take turns, each running until its next BARRIER, so local memory is shared as on a GPU."""
  def __init__(self, name: str, lib: bytes):
    self.uops: list[UOp] = graph_from_data(json.loads(lib))
  def __call__(self, bufs: list[bytearray], vals: list[int], groups: tuple[int, ...] = (1, 1, 1), local: tuple[int, ...] = (1, 1, 1)) -> None:
    params = sorted((u for u in self.uops if u.op is Ops.PARAM), key=lambda u: u.arg)
    variables = scalar_args(self.uops)
    args: dict[UOp, Any] = {p: Memory(b, p.dtype.base) for p, b in zip(params, bufs)}
    args.update(zip(variables, vals))
    for g in itertools.product(*(range(n) for n in reversed(groups))):
      shared: dict[UOp, Memory] = {}
      threads = [self.thread(dict(args), shared, {**_ids("gidx", g), **_ids("lidx", l)})
                 for l in itertools.product(*(range(n) for n in reversed(local)))]
      while threads: threads = [t for t in threads if next(t, None) is not None]

  def thread(self, val: dict[UOp, Any], shared: dict[UOp, Memory], ids: dict[str, int]) -> Iterator[bool]:
    """One thread's run; yields True at each barrier."""
    uops = self.uops
    range_at = {u: i for i, u in enumerate(uops) if u.op is Ops.RANGE}
    pc = 0
    while pc < len(uops):
      u = uops[pc]; op = u.op
      if op is Ops.CONST: val[u] = u.arg
      elif op is Ops.RANGE:
        if u not in val or val[u] is None: val[u] = 0
        if val[u] >= val[u.src[0]]:  # empty loop: skip to after its END
          pc += 1
          while not (uops[pc].op is Ops.END and uops[pc].src[1] is u): pc += 1
          val[u] = None
      elif op is Ops.END:
        r = u.src[1]
        val[r] += 1
        if val[r] < val[r.src[0]]: pc = range_at[r]; pc += 1; continue
        val[r] = None
      elif op is Ops.SPECIAL: val[u] = ids[u.arg]
      elif op is Ops.DEFINE_REG: val[u] = Memory(bytearray(u.dtype.size * u.dtype.base.itemsize), u.dtype.base)
      elif op is Ops.DEFINE_LOCAL:
        if u not in shared: shared[u] = Memory(bytearray(u.dtype.size * u.dtype.base.itemsize), u.dtype.base)
        val[u] = shared[u]
      elif op is Ops.BARRIER: yield True
      elif op is Ops.AFTER: val[u] = val[u.src[0]]
      elif op is Ops.INDEX: val[u] = (val[u.src[0]], val[u.src[1]], True if u.gate is None else val[u.gate])
      elif op is Ops.LOAD:
        mem, i, ok = val[u.src[0]]
        val[u] = mem[i] if ok else truncate(u.dtype, 0)
      elif op is Ops.STORE:
        mem, i, ok = val[u.src[0]]
        if ok: mem[i] = val[u.src[1]]
      elif op is Ops.CAST: val[u] = truncate(u.dtype, val[u.src[0]])
      elif op is Ops.BITCAST: val[u] = bitcast(val[u.src[0]], u.src[0].dtype, u.dtype)
      elif op in GroupOp.ALU: val[u] = exec_alu(op, u.dtype, [val[s] for s in u.src])
      elif op in (Ops.SINK, Ops.NOOP, Ops.PARAM, Ops.DEFINE_VAR): pass
      else: raise NotImplementedError(f"PYTHON device can't run {op}")
      pc += 1

def _ids(prefix: str, coords: tuple[int, ...]) -> dict[str, int]:
  """Thread ids by SPECIAL name; coords come outermost dimension first."""
  return {f"{prefix}{d}": c for d, c in enumerate(reversed(coords))}

class PythonDevice(Compiled):
  def __init__(self, name: str):
    super().__init__(name, PythonAllocator(), PythonRenderer(), Compiler(), PythonProgram)

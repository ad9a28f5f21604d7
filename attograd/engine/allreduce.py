"""The all-reduce step of a schedule (an ALLREDUCE item, schedule/multi.py): the parts of a sharded reduce, one buffer on
each device, combined in place so that every buffer holds the result. A runner like a kernel or a copy (engine/realize.py
ExecPlan runs it, TinyJit records and replays it). Two algorithms, chosen by size:
- direct (small buffers): every part is reduced into the first, which is then copied to the others: 2(n-1) passes over
  one buffer, the fewest steps (a step costs a call, which dominates for a few bytes);
- ring (large ones): the buffer is cut in n chunks; in n-1 steps each device passes one chunk to the next, which reduces
  it into its own (reduce-scatter: device d ends up owning the total of chunk d+1), then n-1 steps pass the totals on
  (all-gather). Each device sends and receives 2(n-1)/n of the buffer, whatever n: the bandwidth-optimal schedule, and
  each step's n transfers are independent (devices that own their cores can run them side by side).
The reduction is a small C loop over host memory (compiled once); a device whose memory isn't host memory is copied
out and back."""
from __future__ import annotations
import ctypes, functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from attograd.dtype import DType, dtypes
from attograd.uop.ops import Ops
from attograd.runtime.device import Device
from attograd.runtime.cc import find_c_compiler, compile_c, load_library

RING_MIN_BYTES = 1 << 18  # from here the ring: below, its 2(n-1) steps per chunk cost more calls than the direct one's
PARALLEL_MIN_BYTES = 1 << 20  # a ring step's transfers on threads of their own from this chunk size (a thread's wakeup ~50 us)

@functools.cache
def _pool() -> ThreadPoolExecutor: return ThreadPoolExecutor(8, thread_name_prefix="allreduce")

C_TYPES = {dtypes.float32: "float", dtypes.float64: "double", dtypes.int8: "signed char", dtypes.uint8: "unsigned char",
           dtypes.int16: "short", dtypes.uint16: "unsigned short", dtypes.int32: "int", dtypes.uint32: "unsigned int",
           dtypes.int64: "long long", dtypes.uint64: "unsigned long long", dtypes.bool: "unsigned char"}
# d = op(d, s), as the IR computes the reduce (MAX keeps a NaN, as Ops.MAX does); on bools a sum or max is an or
C_OPS = {Ops.ADD: "a + b", Ops.MUL: "a * b", Ops.MAX: "(a != a) ? a : (b != b) ? b : (a > b ? a : b)"}
C_BOOL_OPS = {Ops.ADD: "a | b", Ops.MAX: "a | b", Ops.MUL: "a & b"}

def _fn_name(op: Ops, dtype: DType) -> str: return f"ar_{op.name.lower()}_{dtype.name}"

@functools.cache
def _library() -> ctypes.CDLL:
  src = []
  for dt, ct in C_TYPES.items():
    for op, expr in (C_BOOL_OPS if dt == dtypes.bool else C_OPS).items():
      src.append(f"void {_fn_name(op, dt)}({ct} *restrict d, const {ct} *restrict s, long long n) {{\n"
                 f"  for (long long i = 0; i < n; i++) {{ {ct} a = d[i], b = s[i]; d[i] = {expr}; }}\n}}")
  return load_library(compile_c(find_c_compiler(), "\n".join(src), ["-O3", "-march=native", "-fPIC", "-shared", "-ffp-contract=off"], "the all-reduce"))

def _address(mv: memoryview) -> int: return ctypes.addressof(ctypes.c_char.from_buffer(mv)) if mv.nbytes else 0

class AllReduce:
  """Combine n device buffers of `size` elements in place with the reduce op (ADD, MUL, MAX)."""
  def __init__(self, op: Ops, dtype: DType, devices: tuple[str, ...], size: int):
    if dtype not in C_TYPES: raise NotImplementedError(f"all-reduce of {dtype} tensors isn't supported: cast to float32 first")
    self.op, self.dtype, self.size, self.itemsize = op, dtype, size, dtype.itemsize
    self.allocators = [Device[d].allocator for d in devices]
    self.ring = size * dtype.itemsize >= RING_MIN_BYTES
    self.name = f"allreduce {op.name.lower()} {'ring' if self.ring else 'direct'} x{len(devices)}"
    self.ops = (len(devices) - 1) * size
    self.fn = getattr(_library(), _fn_name(op, dtype))
    self.fn.argtypes, self.fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong], None
  def _reduce(self, dst: memoryview, src: memoryview, start: int, end: int) -> None:
    """dst[start:end] = op(dst, src) over those elements."""
    if end > start: self.fn(_address(dst) + start * self.itemsize, _address(src) + start * self.itemsize, end - start)
  def __call__(self, raw: list[Any], var_vals: Any) -> None:
    views = [a.host_view(m) for a, m in zip(self.allocators, raw)]
    staged = [v is None for v in views]
    for i, a in enumerate(self.allocators):  # memory the host can't touch: through a copy
      if staged[i]:
        views[i] = memoryview(bytearray(self.size * self.itemsize))
        a.copyout(views[i], raw[i])
    views = [v[:self.size * self.itemsize] for v in views]
    (self._ring if self.ring else self._direct)(views)
    for i, a in enumerate(self.allocators):
      if staged[i]: a.copyin(raw[i], views[i])
  def _direct(self, views: list[memoryview]) -> None:
    for v in views[1:]: self._reduce(views[0], v, 0, self.size)
    for v in views[1:]: v[:] = views[0]
  def _ring(self, views: list[memoryview]) -> None:
    n, b = len(views), self.itemsize
    cuts = [self.size * k // n for k in range(n + 1)]
    addrs = [_address(v) for v in views]
    def chunk(k: int) -> tuple[int, int]: return cuts[k % n], cuts[k % n + 1]
    def side_by_side(fns: list) -> None:
      # a step's n transfers touch different chunks: they run on n threads (ctypes lets go of the GIL in each call)
      if len(fns) == 1 or (cuts[1] - cuts[0]) * b < PARALLEL_MIN_BYTES:
        for f in fns: f()
      else:
        for fut in [_pool().submit(f) for f in fns]: fut.result()
    for step in range(n - 1):  # reduce-scatter: device d passes chunk d - step to device d + 1
      side_by_side([functools.partial(self._reduce, views[(d + 1) % n], views[d], *chunk(d - step)) for d in range(n)])
    for step in range(n - 1):  # all-gather: device d passes the total of chunk d + 1 - step on
      side_by_side([functools.partial(ctypes.memmove, addrs[(d + 1) % n] + chunk(d + 1 - step)[0] * b, addrs[d] + chunk(d + 1 - step)[0] * b,
                                      (chunk(d + 1 - step)[1] - chunk(d + 1 - step)[0]) * b) for d in range(n)])

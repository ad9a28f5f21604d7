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
out and back.
float16 and bfloat16 parts are combined in float32 and rounded once at the end, as torch reduces them (torch.sum of a half
tensor accumulates in float): every device's chunk k is widened into a float32 scratch, the others' chunk k added in,
and the total rounded (to nearest even) into every device's chunk k; the chunks are independent and run side by side.
(torch.distributed's gloo and NCCL round after each pairwise add instead: the same for two devices, less exact for more.)"""
from __future__ import annotations
import ctypes, functools
from typing import TYPE_CHECKING, Any
from attograd.dtype import DType, dtypes
from attograd.uop.ops import Ops
from attograd.runtime.device import Device
from attograd.runtime.cc import find_c_compiler, compile_c, load_library

RING_MIN_BYTES = 1 << 18  # from here the ring: below, its 2(n-1) steps per chunk cost more calls than the direct one's
PARALLEL_MIN_BYTES = 1 << 20  # a ring step's transfers on threads of their own from this chunk size (a thread's wakeup ~50 us)

if TYPE_CHECKING: from concurrent.futures import ThreadPoolExecutor

@functools.cache
def _pool() -> ThreadPoolExecutor:
  from concurrent.futures import ThreadPoolExecutor  # (with its logging: 0.75 MiB, imported when a ring first runs)
  return ThreadPoolExecutor(8, thread_name_prefix="allreduce")

C_TYPES = {dtypes.float32: "float", dtypes.float64: "double", dtypes.int8: "signed char", dtypes.uint8: "unsigned char",
           dtypes.int16: "short", dtypes.uint16: "unsigned short", dtypes.int32: "int", dtypes.uint32: "unsigned int",
           dtypes.int64: "long long", dtypes.uint64: "unsigned long long", dtypes.bool: "unsigned char"}
# d = op(d, s), as the IR computes the reduce (MAX keeps a NaN, as Ops.MAX does); on bools a sum or max is an or
C_OPS = {Ops.ADD: "a + b", Ops.MUL: "a * b", Ops.MAX: "(a != a) ? a : (b != b) ? b : (a > b ? a : b)"}
C_BOOL_OPS = {Ops.ADD: "a | b", Ops.MAX: "a | b", Ops.MUL: "a & b"}

def _fn_name(op: Ops, dtype: DType) -> str: return f"ar_{op.name.lower()}_{dtype.name}"

# 16-bit floats as their bits, converted by hand (a compiler's _Float16 may be missing: runtime/ops_cpu.py has_float16).
# half -> float is exact; float -> half and float -> bfloat16 round to nearest even, overflow to inf, keep NaN a NaN
F16_SRC = r"""
static inline float bits_f(unsigned int u) { union { unsigned int u; float f; } x = { u }; return x.f; }
static inline unsigned int f_bits(float f) { union { float f; unsigned int u; } x = { f }; return x.u; }
static inline float from_float16(unsigned short h) {
  unsigned int s = (unsigned int)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0x1f) return bits_f(s | 0x7f800000 | (m << 13));
  if (e) return bits_f(s | ((e + 112) << 23) | (m << 13));
  float v = (float)m * (1.0f / 16777216.0f);  /* a subnormal: m * 2^-24, exact */
  return s ? -v : v;
}
static inline unsigned short to_float16(float f) {
  unsigned int u = f_bits(f), s = (u >> 16) & 0x8000, a = u & 0x7fffffff;
  if (a > 0x7f800000) return (unsigned short)(s | 0x7e00 | ((a >> 13) & 0x3ff));
  if (a >= 0x477ff000) return (unsigned short)(s | 0x7c00);  /* from 65520 on: inf */
  if (a < 0x38800000) {  /* below 2^-14: a subnormal half, m * 2^-24 with m rounded to nearest even */
    unsigned int e = a >> 23, shift = 126 - e;
    if (e == 0 || shift > 24) return (unsigned short)s;
    unsigned int mant = (a & 0x7fffff) | 0x800000, q = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    return (unsigned short)(s | q);
  }
  return (unsigned short)(s | ((a + 0xfff + ((a >> 13) & 1) - 0x38000000) >> 13));
}
static inline float from_bfloat16(unsigned short h) { return bits_f((unsigned int)h << 16); }
static inline unsigned short to_bfloat16(float f) {
  unsigned int u = f_bits(f);
  if ((u & 0x7fffffff) > 0x7f800000) return (unsigned short)((u >> 16) | 0x40);
  return (unsigned short)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
"""
WIDE = {dtypes.float16: "float16", dtypes.bfloat16: "bfloat16"}  # combined in float32 scratch

@functools.cache
def _library() -> ctypes.CDLL:
  src = []
  for dt, ct in C_TYPES.items():
    for op, expr in (C_BOOL_OPS if dt == dtypes.bool else C_OPS).items():
      src.append(f"void {_fn_name(op, dt)}({ct} *restrict d, const {ct} *restrict s, long long n) {{\n"
                 f"  for (long long i = 0; i < n; i++) {{ {ct} a = d[i], b = s[i]; d[i] = {expr}; }}\n}}")
  src.append(F16_SRC)
  for dt, name in WIDE.items():  # acc (float32) = op(acc, s); acc = s; d = acc rounded
    for op, expr in C_OPS.items():
      src.append(f"void {_fn_name(op, dt)}(float *restrict d, const unsigned short *restrict s, long long n) {{\n"
                 f"  for (long long i = 0; i < n; i++) {{ float a = d[i], b = from_{name}(s[i]); d[i] = {expr}; }}\n}}")
    src.append(f"void ar_widen_{name}(float *restrict d, const unsigned short *restrict s, long long n) {{\n"
               f"  for (long long i = 0; i < n; i++) d[i] = from_{name}(s[i]);\n}}")
    src.append(f"void ar_narrow_{name}(unsigned short *restrict d, const float *restrict s, long long n) {{\n"
               f"  for (long long i = 0; i < n; i++) d[i] = to_{name}(s[i]);\n}}")
  return load_library(compile_c(find_c_compiler(), "\n".join(src), ["-O3", "-march=native", "-fPIC", "-shared", "-ffp-contract=off"], "the all-reduce"))

def _address(mv: memoryview) -> int: return ctypes.addressof(ctypes.c_char.from_buffer(mv)) if mv.nbytes else 0

class AllReduce:
  """Combine n device buffers of `size` elements in place with the reduce op (ADD, MUL, MAX)."""
  def __init__(self, op: Ops, dtype: DType, devices: tuple[str, ...], size: int):
    if dtype not in C_TYPES and dtype not in WIDE: raise NotImplementedError(f"all-reduce of {dtype} tensors isn't supported: cast to float32 first")
    if dtype in WIDE and op not in C_OPS: raise NotImplementedError(f"all-reduce {op} of {dtype} tensors isn't supported")
    self.op, self.dtype, self.size, self.itemsize = op, dtype, size, dtype.itemsize
    self.allocators = [Device[d].allocator for d in devices]
    self.ring = size * dtype.itemsize >= RING_MIN_BYTES
    self.wide = dtype in WIDE
    self.name = f"allreduce {op.name.lower()} {'float32 accumulator' if self.wide else 'ring' if self.ring else 'direct'} x{len(devices)}"
    self.ops = (len(devices) - 1) * size
    lib, sig = _library(), [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong]
    self.fn = getattr(lib, _fn_name(op, dtype))
    self.fn.argtypes, self.fn.restype = sig, None
    if self.wide:
      self.widen, self.narrow = getattr(lib, f"ar_widen_{WIDE[dtype]}"), getattr(lib, f"ar_narrow_{WIDE[dtype]}")
      for f in (self.widen, self.narrow): f.argtypes, f.restype = sig, None
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
    (self._wide if self.wide else self._ring if self.ring else self._direct)(views)
    for i, a in enumerate(self.allocators):
      if staged[i]: a.copyin(raw[i], views[i])
  def _wide(self, views: list[memoryview]) -> None:
    n, b = len(views), self.itemsize
    cuts = [self.size * k // n for k in range(n + 1)]
    addrs = [_address(v) for v in views]
    def chunk(k: int) -> None:  # chunk k of every device: widened, combined in float32, rounded once into each
      start, count = cuts[k], cuts[k + 1] - cuts[k]
      if not count: return
      acc = (ctypes.c_float * count)()
      self.widen(acc, addrs[0] + start * b, count)
      for a in addrs[1:]: self.fn(acc, a + start * b, count)
      for a in addrs: self.narrow(a + start * b, acc, count)
    if (cuts[1] - cuts[0]) * 4 < PARALLEL_MIN_BYTES:
      for k in range(n): chunk(k)
    else:
      for fut in [_pool().submit(chunk, k) for k in range(n)]: fut.result()
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

"""CPU device: C source compiled by the system compiler (runtime/cc.py) into a shared library, cached on disk by
source hash, and called in-process through ctypes."""
from __future__ import annotations
import ctypes, functools, mmap, os, shutil
from attograd.runtime.device import Allocator, Compiler, Compiled
from attograd.renderer.cstyle import CStyleRenderer
from attograd.runtime import threadpool
from attograd.runtime.cc import find_c_compiler, compile_c, compile_c_batch, load_library

# mapped before and after every buffer: a kernel may read them (and ignore what it read) where it would need a gated
# read (uop/symbolic.py ungate_load). A page on each side covers a padded conv's reads above its first and below its
# last row (rows of up to 1000 floats) and a row padded to a multiple of 16 floats
SPARE_BYTES = (4096, 4096)

class MemoryPool:
  """Big blocks of freed memory, kept for the next allocation of the same size. A fresh mapping costs a
  page fault per page on first touch (23 ms for 64 MiB in 2 MiB pages, 64 ms in 4 KiB ones: more than the
  kernel that fills it); a reused one costs nothing. Reused memory holds old bytes, as torch.empty's does. Blocks are counted by the
  bytes they hold for a buffer, without the spare ones."""
  MIN_BYTES, MAX_BYTES = 1 << 16, 1 << 30
  def __init__(self):
    self.free: dict[int, list[tuple[mmap.mmap, int]]] = {}
    self.held = 0
  def take(self, nbytes: int) -> tuple[mmap.mmap, int] | None:
    if not (blocks := self.free.get(nbytes)): return None
    self.held -= nbytes
    return blocks.pop()
  def give(self, mem: mmap.mmap, addr: int) -> None:
    nbytes = len(mem) - sum(SPARE_BYTES)
    if nbytes < self.MIN_BYTES or self.held + nbytes > self.MAX_BYTES: return  # dropped: unmapped by its own refcount
    self.free.setdefault(nbytes, []).append((mem, addr))
    self.held += nbytes
POOL = MemoryPool()

HUGE_PAGE = 1 << 21

class CPUMemory:
  """Memory that kernels may vectorize over (64-byte aligned), and its address (zero-filled when fresh). A big buffer is
  a private mapping, page aligned: only private anonymous memory can be backed by 2 MiB pages (the kernel's transparent
  huge pages, asked for with madvise as numpy does). With 4 KiB pages a stream over 64 MiB spends half its time in TLB
  misses (sum of 16M floats, one core: 4.3 vs 2.2 ms) and first touch costs 3x more. A small one comes from the Python
  heap: a mapping of its own is a system call and a page fault, 7 us for a few bytes."""
  __slots__ = ("mem", "addr", "start", "nbytes")
  def __init__(self, nbytes: int):
    self.nbytes = nbytes
    if nbytes < MemoryPool.MIN_BYTES:
      self.mem: mmap.mmap | bytearray = bytearray(nbytes + sum(SPARE_BYTES) + 64)
      heap = ctypes.addressof(ctypes.c_char.from_buffer(self.mem))
      self.start = SPARE_BYTES[0] + (-(heap + SPARE_BYTES[0]) % 64)
      self.addr = heap + self.start
      return
    self.start = SPARE_BYTES[0]
    if (block := POOL.take(nbytes)) is not None: self.mem, self.addr = block
    else:
      self.mem = mmap.mmap(-1, nbytes + sum(SPARE_BYTES), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
      if nbytes >= HUGE_PAGE and hasattr(mmap, "MADV_HUGEPAGE"): self.mem.madvise(mmap.MADV_HUGEPAGE)
      self.addr = ctypes.addressof(ctypes.c_char.from_buffer(self.mem)) + SPARE_BYTES[0]
  @property
  def data(self) -> memoryview:
    """The buffer's bytes, without the spare ones around them."""
    return memoryview(self.mem)[self.start:self.start + self.nbytes]
  def __del__(self):
    if not isinstance(self.mem, mmap.mmap): return
    try: POOL.give(self.mem, self.addr)
    except Exception: pass  # interpreter shutdown: the pool may already be gone

class CPUAllocator(Allocator):
  def alloc(self, nbytes: int) -> CPUMemory: return CPUMemory(nbytes)
  def copyin(self, dest: CPUMemory, src: memoryview) -> None: dest.data[:src.nbytes] = src.cast("B")
  def copyout(self, dest: memoryview, src: CPUMemory) -> None: dest.cast("B")[:] = src.data[:dest.nbytes]

class CPUCompiler(Compiler):
  batches = True
  def __init__(self, prelude: str = ""):
    self.prelude = prelude  # what every kernel's source starts with: once in a batch's translation unit
    self.cc = find_c_compiler()
    # no fast-math family flags: they let the compiler drop NaN and signed-zero semantics (x*0 -> 0).
    # no -fwrapv either: it stops vectorization of index math; the renderer wraps data math itself.
    # -fno-trapping-math only says no kernel reads FP exception flags: it lets truncf vectorize (exp needs it)
    self.flags = ["-O3", "-march=native", "-fPIC", "-shared", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off", "-lm"]
    # gcc's default vectorizer cost model spent seconds on a row of 32 written-out sums (6.8 s for one kernel; a small
    # transformer's first 10 steps 12.6 -> 6.8 s with it cheap), for no measured difference in speed (bench/all.py,
    # bench/transformer.py). clang has no such flag
    if "gcc" in os.path.basename(os.path.realpath(shutil.which(self.cc) or self.cc)): self.flags.insert(1, "-fvect-cost-model=very-cheap")
  def compile(self, src: str) -> bytes: return compile_c(self.cc, src, self.flags, "a kernel")
  def compile_batch(self, srcs: list[str]) -> list[bytes]: return compile_c_batch(self.cc, srcs, self.flags, "kernels", self.prelude)

class CPUProgram:
  var_type = ctypes.c_int32  # the C renderer declares kernel variables int
  def __init__(self, name: str, lib: bytes):
    self.name, self.lib = name, load_library(lib)
    self.fxn = getattr(self.lib, name)
    self.fxn.restype = None
  def __call__(self, bufs: list[CPUMemory], vals: list[int]) -> None:
    self.fxn(*[ctypes.c_void_p(b.addr) for b in bufs], *[self.var_type(v) for v in vals])
  @functools.cached_property
  def slice_entry(self) -> int:
    """The address of the entry point the renderers give a threaded kernel (the core id is its argument)."""
    return ctypes.cast(getattr(self.lib, f"{self.name}_slice"), ctypes.c_void_p).value
  def run_slices(self, bufs: list[CPUMemory], vals: list[int], n: int, cores: int) -> None:
    """A threaded kernel's n slices (core_id 0..n-1) on up to `cores` cores, results as if run one after another."""
    threadpool.run_slices(self.slice_entry, [b.addr for b in bufs], vals, n, cores)

def simd_floats() -> int:
  """Floats in one vector register of this CPU, which -march=native compiles for: 16 with AVX-512, else 8 (AVX2)."""
  try: cpuinfo = open("/proc/cpuinfo").read()
  except OSError: return 8
  return 16 if " avx512f" in cpuinfo else 8

class CpuDevice(Compiled):
  def __init__(self, name: str):
    renderer = CStyleRenderer(SPARE_BYTES, simd_floats())
    super().__init__(name, CPUAllocator(), renderer, CPUCompiler(renderer.prelude), CPUProgram)

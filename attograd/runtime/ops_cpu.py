"""CPU device: C source compiled by the system compiler (runtime/cc.py) into a shared library, cached on disk by
source hash, and called in-process through ctypes."""
from __future__ import annotations
import ctypes, functools, math, mmap, os, re, shutil, struct, threading
from typing import Any
from attograd.helpers import CACHELEVEL, Context, cache_path, cache_read, cache_write, content_hash
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
  def clear(self) -> None: self.free, self.held = {}, 0  # each block is unmapped by its own refcount
POOL = MemoryPool()

class SmallHeap:
  """Memory for buffers under MemoryPool.MIN_BYTES: chunks of a power of two bytes (64 at least: the alignment kernels
  vectorize for) carved from shared mappings of SLAB_BYTES, the spare pages only at each mapping's ends. A buffer's
  neighbours are its spare bytes inside a mapping: a kernel's over-read lands in them and ignores what it read, as
  anywhere in the spare. With a bytearray each, every small buffer carried (and zero-filled) both spare pages: SmolLM2's
  197 small buffers, 1.55 MiB. A freed chunk waits for the next buffer of its size class, zero-filled again when taken;
  a mapping's pages nobody wrote (a tail too short for the next chunk, a chunk's end past its buffer) stay unbacked."""
  SLAB_BYTES = 1 << 18
  def __init__(self):
    self.free: dict[int, list[tuple[int, int, mmap.mmap]]] = {}  # by size class: (address, offset, mapping)
    self.slab: mmap.mmap | None = None
    self.base = self.top = 0
    self.lock = threading.Lock()  # (buffers are allocated from the compile and lane threads too)
  @staticmethod
  def chunk(nbytes: int) -> int: return 1 << max(6, (nbytes - 1).bit_length())
  def take(self, nbytes: int) -> tuple[int, int, mmap.mmap]:
    size = self.chunk(nbytes)
    with self.lock:
      if blocks := self.free.get(size):
        addr, start, mem = blocks.pop()
        ctypes.memset(addr, 0, size)  # zero-filled, as a fresh small buffer always was
        return addr, start, mem
      if self.slab is None or self.top + size > SPARE_BYTES[0] + self.SLAB_BYTES:
        self.slab = mmap.mmap(-1, self.SLAB_BYTES + sum(SPARE_BYTES), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.base, self.top = ctypes.addressof(ctypes.c_char.from_buffer(self.slab)), SPARE_BYTES[0]
      start, self.top = self.top, self.top + size
      return self.base + start, start, self.slab
  def give(self, addr: int, start: int, mem: mmap.mmap, nbytes: int) -> None:
    with self.lock: self.free.setdefault(self.chunk(nbytes), []).append((addr, start, mem))
SMALL = SmallHeap()

HUGE_PAGE = 1 << 21

class CPUMemory:
  """Memory that kernels may vectorize over (64-byte aligned), and its address (zero-filled when fresh). A big buffer is
  a private mapping, page aligned: only private anonymous memory can be backed by 2 MiB pages (the kernel's transparent
  huge pages, asked for with madvise as numpy does). With 4 KiB pages a stream over 64 MiB spends half its time in TLB
  misses (sum of 16M floats, one core: 4.3 vs 2.2 ms) and first touch costs 3x more. A small one is a chunk of a shared
  mapping (SmallHeap): a mapping of its own is a system call and a page fault, 7 us for a few bytes."""
  __slots__ = ("mem", "addr", "start", "nbytes")
  def __init__(self, nbytes: int):
    self.nbytes = nbytes
    if nbytes < MemoryPool.MIN_BYTES:
      self.addr, self.start, self.mem = SMALL.take(nbytes)
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
    try:
      if self.nbytes < MemoryPool.MIN_BYTES: SMALL.give(self.addr, self.start, self.mem, self.nbytes)
      else: POOL.give(self.mem, self.addr)
    except Exception: pass  # interpreter shutdown: the pool may already be gone

class CPUAllocator(Allocator):
  def alloc(self, nbytes: int) -> CPUMemory: return CPUMemory(nbytes)
  def release_cached(self) -> None: POOL.clear()
  # the host's reads and writes wait for the kernels in flight on a runner thread that write that memory (or, for a write,
  # that touch it): threadpool.Deferred
  def discard(self, mem: CPUMemory) -> None:
    threadpool.wait_for(mem, True)
    # a mapping of its own drops its pages (zero-filled on the next touch); a small buffer's chunk of a shared one stays
    if mem.nbytes >= MemoryPool.MIN_BYTES and hasattr(mmap, "MADV_DONTNEED"): mem.mem.madvise(mmap.MADV_DONTNEED)
  def copyin(self, dest: CPUMemory, src: memoryview) -> None:
    threadpool.wait_for(dest, True)
    dest.data[:src.nbytes] = src.cast("B")
  def copyout(self, dest: memoryview, src: CPUMemory) -> None:
    threadpool.wait_for(src, False)
    dest.cast("B")[:] = src.data[:dest.nbytes]
  def host_view(self, mem: CPUMemory) -> memoryview:
    threadpool.wait_for(mem, True)  # (the view may be written)
    return mem.data

def _is_gcc(cc: str) -> bool: return "gcc" in os.path.basename(os.path.realpath(shutil.which(cc) or cc))

def c_flags(cc: str) -> list[str]:
  """The flags kernels are compiled with by cc."""
  # no fast-math family flags: they let the compiler drop NaN and signed-zero semantics (x*0 -> 0).
  # no -fwrapv either: it stops vectorization of index math; the renderer wraps data math itself.
  # -fno-trapping-math only says no kernel reads FP exception flags: it lets truncf vectorize (exp needs it)
  flags = ["-O3", "-march=native", "-fPIC", "-shared", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off", "-lm"]
  # gcc's default vectorizer cost model spent seconds on a row of 32 written-out sums (6.8 s for one kernel; a small
  # transformer's first 10 steps 12.6 -> 6.8 s with it cheap), for no measured difference in speed (bench/all.py,
  # bench/transformer.py). clang has no such flag
  # and gcc's unroll-and-jam (on at -O3) fuses two iterations of a reduce's outer loop into its inner SIMD loop, where a
  # value read once per outer iteration (a quantized block's scale, at r>>1) becomes a load the vectorizer can't
  # analyse: the inner loop stayed scalar (a Q8_0 matvec of 49152 x 576, one core: 38.7 -> 9.7 ms; Q4_1's 1.4x)
  if _is_gcc(cc): flags[1:1] = ["-fvect-cost-model=very-cheap", "-fno-loop-unroll-and-jam"]
  # -march=native on an AVX-512 CPU still vectorizes with 256-bit registers (gcc and clang prefer them, for the clock
  # drop of older Xeons), while the heuristics tile for 16-float registers (simd_floats): whole-width vectors took a
  # small transformer's kernels from 35.0 to 33.3 ms a step (one process, each plan run in turn), an erf-GELU 639 -> 438 us
  if simd_floats() == 16: flags.insert(1, "-mprefer-vector-width=512")
  return flags

# kernels that another compiler than the default (gcc) builds better: (what their source has, the compilers to try in
# order). gcc 12 widens bytes to 32-bit lanes element by element (a 16-byte vector's __builtin_convertvector to int
# was 16 scalar moves and inserts), so a kernel that decodes quantized weights from bytes vectorizes poorly; clang uses
# one vpmovzxbd. One core: SmolLM2's Q4_1 gate+up matvec 1231 -> 531 us, down 293 -> 178 us, its Q8_0 output 8.6 -> 5.9 ms
BETTER_COMPILER: list[tuple[re.Pattern, tuple[str, ...]]] = [
  (re.compile(r"\bchar\* restrict data"), ("clang-15", "clang")),
  # a loop whose trip count reads a Variable (a KV cache's length) has gcc's loop vectorizer off (the renderer's
  # GCC_SYMBOLIC_LOOPS: gcc 12.2 miscompiled such a loop), so every other loop of the kernel stayed scalar too, its
  # UPCAST lanes included; clang vectorizes them (and gets that loop right). One core, each kernel alone, a SmolLM2 decode
  # step's attention at 205 keys, 30 layers: scores 4.55 -> 1.05 ms, softmax 1.18 -> 0.97, weighted values 2.56 -> 0.60;
  # its 128-token prompt (one pass, the position a Variable) 1533 -> 930-976 ms
  (re.compile(r'optimize\("no-tree-loop-vectorize"\)'), ("clang-15", "clang")),
]

# kernels gcc vectorizes only with its dynamic cost model (its rule: what their source has). A store gated inside a loop
# that also updates accumulators (softmax's exp kept for the output, STASH, over a row padded to 16s: PP-OCR rec's 6625
# classes) becomes a masked store whose address gcc 12 can't analyse against the loop's other memory: it would version
# the loop for that, which the very-cheap model (c_flags) never does, and the exp loop stayed scalar. One core, bit-identical:
# rec's (40, 6625) softmax kernel 1.6-3.9 -> 0.33-0.41 ms; softmax realized, scheduling included, (1024, 65) 1.1-1.3 ->
# 0.26-0.34 ms, (256, 1001) 2.4 -> 0.5-0.6. Gated stores after a sum (padded conv outputs) gained or lost (PP-OCR det's
# 3x3 conv 1.08 -> 1.62 ms), so only this shape of loop
# Also a kernel whose accumulators are all one scalar (no Opt gave it lanes): a window sum over strided reads, a depthwise
# conv of stride 2 along its width (window_loop needs whole vectors along it), whose small window gcc writes out, leaving
# a loop over the outputs that reads every second element: very-cheap refuses the loads' shuffles, and each output was a
# scalar chain of multiply-adds. One core, 3x3 depthwise convs of PP-OCR (rec's 128 channels at 12x160 -> 12x80, det's 48 at
# 160x160 -> 80x80, 96 at 80x80 -> 40x40, 32 at 320x320 -> 160x160): 0.6-1.0 -> 0.24-0.31 ms, 2.0-2.3 -> 0.5-0.7, 1.1-1.2 ->
# 0.27-0.33, 4.6-5.5 -> 2.8; a 5x5 the same (192 at 40x40 -> 20x20: gcc keeps that window a loop). Only kernels with no
# accumulator of lanes: the dynamic model's compile time grows with written-out rows of sums (c_flags)
GCC_DYNAMIC_COST: list[re.Pattern] = [re.compile(r"if \(alu\d+\) \*\(data\d+\+[^;\n]*;\n\s*\*\(acc\d+"),
                                      re.compile(r"\A(?![\s\S]*\bacc\d+\[(?!1\])\d+\];)[\s\S]*\bfloat acc\d+\[1\];")]

class CPUCompiler(Compiler):
  batches = True
  def __init__(self, prelude: str = "", cc: str | None = None, f16_bits: bool = True):
    self.prelude = prelude  # what every kernel's source starts with: once in a batch's translation unit
    self.cc = cc or find_c_compiler()
    self.flags = c_flags(self.cc)
    # the compiler each BETTER_COMPILER rule picks here: only when the default is gcc that no one chose (CC chooses for
    # every kernel), and only one that compiles the renderer's float16 (its bits, or _Float16 where it has that)
    self.routes: list[tuple[re.Pattern, str, list[str]]] = []
    if cc is None and not os.getenv("CC") and _is_gcc(self.cc):
      for pattern, names in BETTER_COMPILER:
        alt = next((n for n in names if shutil.which(n)), None)
        if alt is not None and (f16_bits or has_float16(alt, tuple(c_flags(alt)))): self.routes.append((pattern, alt, c_flags(alt)))
    if _is_gcc(self.cc) and "-fvect-cost-model=very-cheap" in self.flags:
      dynamic = [f if f != "-fvect-cost-model=very-cheap" else "-fvect-cost-model=dynamic" for f in self.flags]
      self.routes += [(pattern, self.cc, dynamic) for pattern in GCC_DYNAMIC_COST]
  def compiler_for(self, src: str) -> tuple[str, list[str]]:
    """The compiler (and its flags) that builds this kernel."""
    return next(((cc, flags) for pattern, cc, flags in self.routes if pattern.search(src)), (self.cc, self.flags))
  def compile(self, src: str) -> bytes:
    cc, flags = self.compiler_for(src)
    return compile_c(cc, src, flags, "a kernel")
  def compile_batch(self, srcs: list[str]) -> list[bytes]:
    # one batch per compiler and flags, each in one translation unit
    groups: dict[tuple[str, tuple[str, ...]], list[int]] = {}
    for i, s in enumerate(srcs):
      cc, flags = self.compiler_for(s)
      groups.setdefault((cc, tuple(flags)), []).append(i)
    out: list[bytes] = [b""] * len(srcs)
    for (cc, flags), idx in groups.items():
      for i, lib in zip(idx, compile_c_batch(cc, [srcs[i] for i in idx], list(flags), "kernels", self.prelude)): out[i] = lib
    return out

class CPUProgram:
  var_type = ctypes.c_int32  # the C renderer declares kernel variables int
  def __init__(self, name: str, lib: bytes, pool: str = ""):
    self.name, self.lib, self.pool = name, load_library(lib), pool  # pool: the device's threads (runtime/threadpool.py)
    self.fxn = getattr(self.lib, name)
    self.fxn.restype = None
    self._call: Any = None
  def __call__(self, bufs: list[CPUMemory], vals: list[int]) -> None:
    # argument types declared once: ctypes converts plain ints in C, where making a c_void_p object per buffer in Python
    # cost more than a small kernel's work (~3x the call; a PP-OCR cls run launches 76 kernels). On a prototype of this
    # program's own: the library's function object is shared by every program whose library has the same bytes, and two
    # kernels of one name and different arguments can compile alike (isnan(x) == (x == x) folded to a constant 0 left
    # x unread: E(out, x) and E(out) both store 0), where argtypes set on the shared object refused the other's call
    if threadpool._inflight is not None: threadpool.wait_all()  # (kernels run in order)
    if (fn := self._call) is None:
      proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * len(bufs) + [self.var_type] * len(vals)))
      fn = self._call = proto(ctypes.cast(self.fxn, ctypes.c_void_p).value)
    fn(*[b.addr for b in bufs], *vals)
  @functools.cached_property
  def slice_entry(self) -> int | None:
    """The address of the entry point the renderers give every kernel (a threaded one's core id is its argument), or None
    for a library without one (source written by hand or by an older renderer): the run loop then calls it from Python."""
    try: return ctypes.cast(getattr(self.lib, f"{self.name}_slice"), ctypes.c_void_p).value
    except AttributeError: return None
  def run_slices(self, bufs: list[CPUMemory], vals: list[int], n: int, cores: int) -> None:
    """A threaded kernel's n slices (core_id 0..n-1) on up to `cores` cores, results as if run one after another."""
    threadpool.run_slices(self.slice_entry, [b.addr for b in bufs], vals, n, cores, self.pool)

# _Float16 converted from and to float and double: clang before 15 rejects the type on x86-64 ("_Float16 is not supported on
# this target"), and a compiler could take it and convert wrongly (clang 14's __fp16 from double: 1.0009765625 -> 6e-08,
# a calling convention libgcc doesn't share). The inputs round differently when converted twice (double -> float -> half).
# And a loop of round trips float -> half -> float that the vectorizer may take for a copy (gcc 12.2 with -march=native on
# a CPU with AVX512-FP16 drops the pair in a loop of 12 or 11: x.half().float() gave x back)
F16_PROBE = """void probe(unsigned short *out, const double *d, const float *f, int n) {
  for (int i = 0; i < n; i++) {
    union { _Float16 h; unsigned short u; } a = { .h = (_Float16)d[i] }, b = { .h = (_Float16)f[i] };
    out[2 * i] = a.u; out[2 * i + 1] = b.u;
    if ((float)a.h != (float)(_Float16)d[i] || (double)b.h != (double)(float)b.h) out[2 * i] ^= 1;
  }
}
void probe_loop(float *restrict out, const float *restrict f) { for (int i = 0; i < 12; i++) out[i] = (float)(_Float16)f[i]; }
"""
F16_PROBE_VALUES = (1 + 2**-11 + 2**-40, 65519.99, 65520.0, -2**-25 - 2**-40, 1 / 3, -0.0, float("inf"), 2.0**-20)

@functools.cache
def has_float16(cc: str, flags: tuple[str, ...]) -> bool:
  """Does cc with these flags compile _Float16 and convert floats and doubles to it with one correct rounding? Tried once per
  compiler binary (its path, size and time are in the key: an upgrade tries again), the answer kept beside the compiler's
  output in the disk cache."""
  try: st = os.stat(path := os.path.realpath(shutil.which(cc) or cc))
  except OSError: return False
  key = content_hash("float16", F16_PROBE, path, str(st.st_size), str(st.st_mtime_ns), *flags)
  entry = cache_path("cc", f"{key}.probe") if CACHELEVEL >= 1 else None
  if entry is not None and (known := cache_read(entry)) in (b"yes", b"no"): return known == b"yes"
  try:
    with Context(CACHELEVEL=0): lib = load_library(compile_c(cc, F16_PROBE, list(flags), "the float16 probe"))  # the answer is kept
    n = len(F16_PROBE_VALUES)
    out = (ctypes.c_uint16 * (2 * n))()
    lib.probe(out, (ctypes.c_double * n)(*F16_PROBE_VALUES), (ctypes.c_float * n)(*F16_PROBE_VALUES), n)
    want = [w for v in F16_PROBE_VALUES for w in (struct.unpack("<H", struct.pack("<e", v if abs(v) < 65520 else math.copysign(math.inf, v)))[0],
            struct.unpack("<H", struct.pack("<e", float(ctypes.c_float(v).value) if abs(v) < 65520 else math.copysign(math.inf, v)))[0])]
    loop_in = (ctypes.c_float * 12)(*(1 / 3 + i for i in range(12)))
    loop_out = (ctypes.c_float * 12)()
    lib.probe_loop(loop_out, loop_in)
    ok = list(out) == want and list(loop_out) == [float(struct.unpack("<e", struct.pack("<e", v))[0]) for v in loop_in]
  except (RuntimeError, OSError, AttributeError): ok = False  # doesn't compile, doesn't load
  if entry is not None: cache_write(entry, b"yes" if ok else b"no")
  return ok

def simd_floats() -> int:
  """Floats in one vector register of this CPU, which -march=native compiles for: 16 with AVX-512, else 8 (AVX2)."""
  try:
    with open("/proc/cpuinfo") as f: cpuinfo = f.read()
  except OSError: return 8
  return 16 if " avx512f" in cpuinfo else 8

class CpuDevice(Compiled):
  def __init__(self, name: str):
    cc = find_c_compiler()
    # without _Float16 (clang before 15), float16 is stored as its bits and converted by functions of the C prelude
    renderer = CStyleRenderer(SPARE_BYTES, simd_floats(), f16_bits=not has_float16(cc, tuple(c_flags(cc))))
    # each device's kernels on threads of its own: CPU:0 and CPU:1 side by side don't share a pool
    super().__init__(name, CPUAllocator(), renderer, CPUCompiler(renderer.prelude, f16_bits=renderer.f16_bits), functools.partial(CPUProgram, pool=name))

"""This machine's roofline for DEBUG=2: the peak float32 FLOPS and memory bandwidth of the cores kernels run on, measured
once by a tiny C microbenchmark and kept in the disk cache beside the compiled kernels (cache/roofline/). A kernel's
line then says what fraction of the roof it reached: of the peak FLOPS when its ops per byte are above the ridge point,
else of what the bandwidth allows at its ops per byte.

Only DEBUG>=2 ever asks (ExecPlan's per-kernel line), so nothing here runs otherwise. The host's devices (CPU, LLVM) share
one roof; a device without a measured one (PYTHON, GPUs) prints no fraction."""
from __future__ import annotations
import ctypes, json, mmap, os, platform, time
from dataclasses import dataclass
from attograd.helpers import CACHELEVEL, cache_path, cache_read, cache_write, content_hash
from attograd.codegen.opt import THREADS
from attograd.runtime.cc import compile_c, find_c_compiler, load_library
from attograd.runtime import threadpool

# the devices that run on the host's cores, and so share its roof
HOST_DEVICES = {"CPU", "LLVM"}

@dataclass(frozen=True)
class Roof:
  gflops: float  # peak float32 GFLOPS (a fused multiply-add is 2), all cores
  gbs: float     # memory read bandwidth, GB/s, all cores
  cores: int
  def fraction(self, ops: int, nbytes: int, seconds: float) -> tuple[float, str]:
    """What share of the attainable rate a run of `ops` ops over `nbytes` bytes in `seconds` reached, and the bound
    ("mem" below the ridge point, "flops" above it)."""
    t = max(seconds, 1e-9)
    if ops == 0 or ops * self.gbs < nbytes * self.gflops:  # ops/byte under the ridge point gflops/gbs: memory bound
      return nbytes / t * 1e-9 / self.gbs, "mem"
    return ops / t * 1e-9 / self.gflops, "flops"

# Independent chains of vector FMAs (8: enough to hide the FMA's latency on 2 ports) for the FLOPS, and a read of a
# buffer far bigger than the caches, summed in 4 vector chains, for the bandwidth. Entry points of the thread pool's
# type, so the slices run on every core at once. Vector types of the CPU's width: the heuristics' simd_floats.
SRC = r"""
typedef float vf __attribute__((vector_size(WIDTH * 4)));
void flops_slice(void *const *bufs, const long long *vals, long long core) {
  vf a0, a1, a2, a3, a4, a5, a6, a7, m, c;
  for (int j = 0; j < WIDTH; j++) { a0[j] = a1[j] = a2[j] = a3[j] = j; a4[j] = a5[j] = a6[j] = a7[j] = -j; m[j] = 0.9999999f; c[j] = 1e-7f; }
  for (long long n = 0; n < vals[0]; n++) {
    a0 = a0 * m + c; a1 = a1 * m + c; a2 = a2 * m + c; a3 = a3 * m + c;
    a4 = a4 * m + c; a5 = a5 * m + c; a6 = a6 * m + c; a7 = a7 * m + c;
  }
  vf s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
  float t = 0; for (int j = 0; j < WIDTH; j++) t += s[j];
  ((float *)bufs[0])[core] = t;  /* kept: the compiler can't drop the loop */
}
void fill_slice(void *const *bufs, const long long *vals, long long core) {
  long long per = vals[0] / vals[1];
  vf *p = (vf *)bufs[1] + core * per;
  vf one = {0}; one += 1.0f;
  for (long long i = 0; i < per; i++) p[i] = one;
}
void read_slice(void *const *bufs, const long long *vals, long long core) {
  long long per = vals[0] / vals[1];
  const vf *p = (const vf *)bufs[1] + core * per;
  vf s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
  for (long long i = 0; i + 3 < per; i += 4) { s0 += p[i]; s1 += p[i + 1]; s2 += p[i + 2]; s3 += p[i + 3]; }
  vf s = s0 + s1 + s2 + s3;
  float t = 0; for (int j = 0; j < WIDTH; j++) t += s[j];
  ((float *)bufs[0])[core] = t;
}
"""
FLOPS_ITERS = 2_000_000  # per core: 16M vector FMAs, ~10-25 ms
READ_BYTES = 256 << 20   # well over the L3 (105 MiB on this machine's Xeon)
ROUNDS = 3               # the best of: the machine is shared, the roof is what it can do

_roofs: dict[str, Roof | None] = {}

def _cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f: return next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), platform.processor())
  except OSError: return platform.processor()

def measure(cores: int) -> Roof:
  """Run the microbenchmark on `cores` cores now (about half a second)."""
  from attograd.runtime.ops_cpu import simd_floats
  width, cc = simd_floats(), find_c_compiler()
  # the kernels' compiler and -march=native, with FMA contraction on here (the kernels keep it off for exact sums)
  lib = load_library(compile_c(cc, SRC.replace("WIDTH", str(width)), ["-O2", "-march=native", "-fPIC", "-shared", "-ffp-contract=fast"], "the roofline benchmark"))
  entry = {n: ctypes.cast(getattr(lib, f"{n}_slice"), ctypes.c_void_p).value for n in ("flops", "fill", "read")}
  out = (ctypes.c_float * max(cores, 1))()
  mem = mmap.mmap(-1, READ_BYTES)
  try:
    addr = ctypes.addressof(ctypes.c_char.from_buffer(mem))
    bufs, vecs = [ctypes.addressof(out), addr], READ_BYTES // (width * 4)
    def best(name: str, vals: list[int]) -> float:
      times = []
      for _ in range(ROUNDS):
        st = time.perf_counter()
        threadpool.run_slices(entry[name], bufs, vals, cores, cores)
        times.append(time.perf_counter() - st)
      return min(times)
    threadpool.run_slices(entry["fill"], bufs, [vecs, cores], cores, cores)  # written first: unwritten pages all read as one
    t_flops = best("flops", [FLOPS_ITERS])
    t_read = best("read", [vecs, cores])
  finally: mem.close()
  return Roof(FLOPS_ITERS * 8 * width * 2 * cores / t_flops * 1e-9, READ_BYTES / t_read * 1e-9, cores)

def roof(device: str) -> Roof | None:
  """The roof of the cores `device` runs on (None: not a host device), measured the first time it is asked for on this
  machine (CPU model, core count, vector width) and then read from the disk cache."""
  if device.split(":")[0] not in HOST_DEVICES: return None
  cores = THREADS.value
  if (key := f"{cores}") in _roofs: return _roofs[key]
  from attograd.runtime.ops_cpu import simd_floats  # (a host device's: imported when one is used)
  name = content_hash("roofline", SRC, _cpu_model(), str(cores), str(simd_floats()), str(os.cpu_count()))[:32]
  path = cache_path("roofline", f"{name}.json")
  r = cache_read(path, lambda raw: Roof(**json.loads(raw))) if CACHELEVEL >= 1 else None
  if r is None:
    print(f"roofline: measuring this machine's peak FLOPS and memory bandwidth on {cores} cores (once; kept in {path.parent})", flush=True)
    r = measure(cores)
    print(f"roofline: {r.gflops:.1f} GFLOPS, {r.gbs:.1f} GB/s (ridge at {r.gflops / r.gbs:.1f} FLOP/byte)", flush=True)
    if CACHELEVEL >= 1: cache_write(path, json.dumps({"gflops": r.gflops, "gbs": r.gbs, "cores": r.cores}).encode())
  _roofs[key] = r
  return r

def describe(device: str, ops: int, nbytes: int, seconds: float) -> str:
  """The DEBUG=2 line's roofline part: ' 12% of roof (mem)', or '' on a device without one."""
  if (r := roof(device)) is None: return ""
  frac, bound = r.fraction(ops, nbytes, seconds)
  return f" {frac * 100:5.1f}% of roof ({bound})"

"""Devices: each owns an allocator, a renderer, a compiler (source -> binary, cached on disk by
content hash) and a program runner (DESIGN §3.7)."""
from __future__ import annotations
import functools, importlib, os, pkgutil, time
from typing import Any, Callable
from attograd.dtype import DType
from attograd.helpers import getenv, GlobalCounters, cached_property
from attograd.uop import trace

class Allocator:
  def alloc(self, nbytes: int) -> Any: raise NotImplementedError
  def copyin(self, dest: Any, src: memoryview) -> None: raise NotImplementedError
  def copyout(self, dest: memoryview, src: Any) -> None: raise NotImplementedError
  def alloc_at(self, nbytes: int, offset: int) -> Any:
    """Memory at a fixed byte offset of storage the device already holds (a window into a file on
    DISK). Devices that only hand out fresh memory have no such thing."""
    raise RuntimeError(f"{type(self).__name__} can't place a buffer at byte offset {offset}")
  def host_view(self, mem: Any) -> memoryview | None:
    """mem's bytes in place, when the device keeps them in host memory; None when they can only be copied out."""
    return None
  def release_cached(self) -> None:
    """Give back to the system the freed memory kept for reuse (torch.cuda.empty_cache): after a one-off phase (loading
    a model through temporary buffers) whose sizes won't come again."""
  def discard(self, mem: Any) -> None:
    """mem's contents are no longer needed: the device may give its pages back to the system while it stays allocated at
    the same address (a later write faults fresh pages in). Devices that can't do that keep it as it is."""

class Compiler:
  # True when compile_batch builds several sources in one call for less than one by one (CPU: one gcc process)
  batches = False
  def compile(self, src: str) -> bytes: return src.encode()
  def compile_batch(self, srcs: list[str]) -> list[bytes]:
    """compile of each source. The sources define distinct names (two kernels of one name go to different batches)."""
    return [self.compile(s) for s in srcs]

def _release(nbytes: int) -> None:
  GlobalCounters.mem_used -= nbytes
  if trace.current is not None: trace.current.mem(GlobalCounters.mem_used)  # VIZ: memory in use over time

class Buffer:
  """Device memory for `size` elements of `dtype`, allocated on first use; a nonzero `offset` names
  bytes the device already holds (alloc_at) instead of fresh memory. A buffer with a `base` uses the
  base's memory: the memory planner gives buffers whose lifetimes don't overlap one allocation."""
  def __init__(self, device: str, size: int, dtype: DType, offset: int = 0, base: Buffer | None = None):
    self.device, self.size, self.dtype, self.offset, self.base = device, size, dtype, offset, base
    self.nbytes = size * dtype.itemsize  # (a field, not a property: a run sums every buffer's bytes for its counters)
    if base is not None: assert base.device == device and base.nbytes >= self.nbytes, f"{self} doesn't fit in {base}"
    self._buf: Any = None
    self._counted = False  # fresh memory, counted in GlobalCounters.mem_used until this buffer dies (__del__)
  def __del__(self) -> None:
    # (a method, not a weakref.finalize per allocation: that took 6 us and five objects the cycle collector walks, for
    # each of the ~130 allocations a training step's memory plan makes)
    if self._counted: _release(self.nbytes)
  @property
  def allocated(self) -> bool: return self._buf is not None
  def ensure_allocated(self) -> Buffer:
    if self._buf is None:
      if self.base is not None: self._buf = self.base.ensure_allocated()._buf; return self
      a = Device[self.device].allocator
      self._buf = a.alloc_at(max(self.nbytes, 1), self.offset) if self.offset else a.alloc(max(self.nbytes, 1))
      if not self.offset:  # fresh memory is counted while it lives; windows into a file are not
        GlobalCounters.mem_used += self.nbytes
        GlobalCounters.mem_peak = max(GlobalCounters.mem_peak, GlobalCounters.mem_used)
        self._counted = True
        if trace.current is not None: trace.current.mem(GlobalCounters.mem_used)
    return self
  def copyin(self, data: memoryview) -> Buffer:
    assert data.nbytes == self.nbytes, f"copyin of {data.nbytes} bytes into a buffer of {self.nbytes}"
    mem, t0 = self.ensure_allocated()._buf, time.perf_counter()
    Device[self.device].allocator.copyin(mem, data)
    if trace.current is not None: trace.current.transfer(self.device, f"host -> {self.device}", t0, time.perf_counter() - t0, self.nbytes, GlobalCounters.mem_used)
    return self
  def discard(self) -> None:
    """Forget the contents of this buffer's own memory (allocated, not a view of a base) and let the device give its pages
    back: scratch between the runs that fill it (Allocator.discard); it stays allocated, at the same address."""
    if self._buf is not None and self.base is None and not self.offset: Device[self.device].allocator.discard(self._buf)
  def host_view(self) -> memoryview | None:
    """The buffer's own bytes, writable and without a copy, when its device keeps them in host memory (CPU, LLVM,
    PYTHON); else None. A transport (MPI, nn/distributed.py) reads and writes them in place: no copy of 64 MiB."""
    mv = Device[self.device].allocator.host_view(self.ensure_allocated()._buf)
    return None if mv is None else mv[:self.nbytes]
  def as_bytes(self) -> memoryview:
    out, mem = memoryview(bytearray(self.nbytes)), self.ensure_allocated()._buf
    t0 = time.perf_counter()
    if self.nbytes: Device[self.device].allocator.copyout(out, mem)
    if trace.current is not None: trace.current.transfer(self.device, f"{self.device} -> host", t0, time.perf_counter() - t0, self.nbytes, GlobalCounters.mem_used)
    return out
  def __repr__(self) -> str: return f"<Buffer {self.device} {self.size} {self.dtype}" + (f" at byte {self.offset}>" if self.offset else ">")

class Compiled:
  """A backend: what a device needs to turn a kernel into something it can run. A storage-only
  device (DISK) has renderer None: it holds bytes and runs no kernels."""
  def __init__(self, name: str, allocator: Allocator, renderer: Any, compiler: Compiler, runtime: Callable[[str, bytes], Any]):
    self.name, self.allocator, self.renderer, self.compiler, self.runtime = name, allocator, renderer, compiler, runtime
  def synchronize(self) -> None: pass

# CUDA is compile-only here (no driver): kernels render and compile with nvcc
# DISK:<path> is storage only: a file seen as bytes, read by copying to a compute device
class _Device:
  """Device[name] -> the backend. Each module attograd/runtime/ops_<name>.py is a device and defines <Name>Device;
  adding a backend is adding its file (or a directory holding ops_<name>.py to attograd.runtime.__path__)."""
  @functools.cache
  def __getitem__(self, name: str) -> Compiled:
    name = self.canonicalize(name)
    mod = importlib.import_module(f"attograd.runtime.ops_{name.split(':')[0].lower()}")
    return getattr(mod, f"{name.split(':')[0].title()}Device")(name)
  @cached_property
  def backends(self) -> tuple[str, ...]:
    # names come from module files, not imports: a backend needing an optional package (llvmlite, wgpu) costs
    # nothing until it is used, and says what to install then
    pkg = importlib.import_module(__package__)
    return tuple(sorted(m.name[4:].upper() for m in pkgutil.iter_modules(pkg.__path__) if m.name.startswith("ops_")))
  def canonicalize(self, name: str | None | tuple[str, ...] | list[str]) -> str:
    if name is None: return self.DEFAULT
    if isinstance(name, (tuple, list)):  # several devices: a sharded tensor's
      devices = tuple(self.canonicalize(n) for n in name)
      if len(set(devices)) != len(devices) or not devices: raise ValueError(f"devices {tuple(name)} must be distinct and at least one")
      return devices  # type: ignore[return-value]
    # only the backend is case-insensitive: what follows the colon may be a file path (DISK:/a/B.bin)
    base, _, rest = name.partition(":")
    base = base.upper()
    if base not in self.backends: raise ValueError(f"unknown device {name!r}; available: {', '.join(self.backends)}")
    return base if rest in ("", "0") else f"{base}:{rest if base == 'DISK' else rest.upper()}"
  @cached_property
  def DEFAULT(self) -> str:
    if (dev := os.getenv("DEV")): return self.canonicalize(dev)
    for b in self.backends:
      if b != "DISK" and getenv(b, 0) == 1: return b  # DISK runs no kernels, it can't be the default
    return "CPU"
Device = _Device()

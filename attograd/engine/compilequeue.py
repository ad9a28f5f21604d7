"""Sources waiting for a device compiler that builds several in one call (the CPU's C compiler: one translation unit,
one process, one shared library), and the compile time each kernel is charged."""
from __future__ import annotations
import threading, time
from typing import TYPE_CHECKING, Any, Callable
from attograd.runtime.cc import compiler_cpu
# concurrent.futures (with logging, 0.75 MiB) is imported by the first compile: a process whose kernels all come from
# the caches never does
if TYPE_CHECKING: from concurrent.futures import Future, ThreadPoolExecutor

class CompileQueue:
  """Sources waiting for a device compiler that builds several in one call (Compiler.batches), built on a pool's
  workers. While Python is still lowering the schedule (`lowering`), one worker compiles at a time and takes everything
  that waits: the C compiler has the other core, and batches grow as big as lowering gets ahead of it (one process
  per batch instead of one per kernel: ~35 ms each, as much as compiling a small kernel). Once lowering is done, every
  worker takes its share of what is left, so the last kernels compile on all cores. Kernels of one name go to
  different batches (a batch is one translation unit)."""
  MAX_BATCH = 32
  def __init__(self, compiler: Any, pool: ThreadPoolExecutor, workers: int):
    self.compiler, self.pool, self.workers = compiler, pool, workers
    self.waiting: list[tuple[str, str, Future]] = []
    self.lock = threading.Lock()
    self.running, self.lowering = 0, False
  def submit(self, name: str, src: str) -> Future:
    """A future of (binary, seconds of compiling that are this source's share)."""
    from concurrent.futures import Future
    fut: Future = Future()
    with self.lock: self.waiting.append((name, src, fut))
    self.pool.submit(self._work)
    return fut
  def lowered(self) -> None:
    """Lowering is done: let every worker take a share of what waits."""
    with self.lock:
      self.lowering = False
      # a worker for each source left, up to all of them: none when nothing waits (a schedule whose every kernel came
      # from the program cache), so a process that compiles nothing starts no compiler thread
      wanted = min(self.workers, len(self.waiting))
    for _ in range(wanted): self.pool.submit(self._work)
  def _take(self) -> list[tuple[str, str, Future]]:
    """The next batch (empty: nothing waits, or enough workers are compiling); the caller must hold the lock."""
    free = (1 if self.lowering else self.workers) - self.running
    if free <= 0 or not self.waiting: return []
    n = min(self.MAX_BATCH, len(self.waiting) if self.lowering else -(-len(self.waiting) // free))
    batch, names, rest = [], set(), []
    for item in self.waiting:
      defines = {item[0], f"{item[0]}_slice"}  # a threaded kernel's second entry point (renderer/cstyle.py)
      if len(batch) < n and names.isdisjoint(defines): batch.append(item); names |= defines
      else: rest.append(item)
    self.waiting = rest
    return batch
  def _work(self) -> None:
    while True:
      with self.lock:
        if not (batch := self._take()): return
        self.running += 1
      try: self._build(batch)
      finally:
        with self.lock: self.running -= 1
  def _build(self, batch: list[tuple[str, str, Future]]) -> None:
    st = compiler_cpu()
    try: libs = self.compiler.compile_batch([src for _, src, _ in batch])
    except Exception:  # a source that doesn't compile: each alone, so its error reaches its own kernel
      for _, src, fut in batch:
        try: fut.set_result(timed_compile(self.compiler.compile, src))
        except Exception as e: fut.set_exception(e)
      return
    et, size = compiler_cpu() - st, sum(len(src) for _, src, _ in batch)
    for (_, src, fut), lib in zip(batch, libs): fut.set_result((lib, et * len(src) / size))

def timed_compile(compile: Callable[[str], bytes], src: str) -> tuple[bytes, float]:
  """compile(src) and the seconds it took: CPU seconds of the C compiler's processes, else (a compiler in this process)
  the wall time."""
  st, wall = compiler_cpu(), time.perf_counter()
  lib = compile(src)
  return lib, (compiler_cpu() - st) or (time.perf_counter() - wall)
_queues: dict[str, CompileQueue] = {}

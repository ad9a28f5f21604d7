"""Batched compilation (runtime/cc.py compile_c_batch, engine/realize.py CompileQueue): several kernels built by one
compiler call into one shared library compute what each built alone computes, their cache entries are checked when
read (a damaged or missing shared library is rebuilt with one warning), a source that doesn't compile gets its own
error, and two kernels of one name never share a library."""
from __future__ import annotations
import ctypes, gc, re, threading, time
from concurrent.futures import ThreadPoolExecutor
import numpy as np
import pytest
from attograd import Tensor
import attograd.runtime.cc as cc
from attograd.runtime.ops_cpu import CPUCompiler, CPUProgram
from attograd.engine import realize
from attograd.engine.compilequeue import CompileQueue
from attograd.helpers import gc_paused
import attograd.schedule.schedule as schedule
from attograd.runtime.device import Device

PRELUDE = "static inline float twice(float x) { return 2.0f * x; }\n"

def kernel(name: str, k: float) -> str:
  """A source in the shape the C renderer writes: the prelude, then a function of the kernel's name."""
  return PRELUDE + f"void {name}(float* restrict out, float* restrict a) {{ for (int i = 0; i < 8; i++) out[i] = twice(a[i]) + {k}f; }}\n"

def kernels_in(src: str) -> int: return len([n for n in re.findall(r"^void (\w+)\(", src, re.M) if not n.endswith("_slice")])

def run(name: str, lib: bytes, xs: list[float]) -> list[float]:
  prog = CPUProgram(name, lib)
  a, out = (ctypes.c_float * 8)(*xs), (ctypes.c_float * 8)()
  prog.fxn(ctypes.cast(out, ctypes.c_void_p), ctypes.cast(a, ctypes.c_void_p))
  return list(out)

@pytest.fixture
def cache(tmp_path, monkeypatch):
  monkeypatch.setenv("ATTOGRAD_CACHE", str(tmp_path))
  monkeypatch.setattr(cc, "_linked", {})
  monkeypatch.setattr(cc, "_broken", set())
  calls: list[str] = []
  build = cc._build
  def counted(c, src, flags, what):
    calls.append(src)
    return build(c, src, flags, what)
  monkeypatch.setattr(cc, "_build", counted)
  return tmp_path, calls

def test_batch_is_one_compiler_call_and_computes_what_each_alone_does(cache):
  tmp, calls = cache
  comp = CPUCompiler(PRELUDE)
  names, ks = ["k_a", "k_b", "k_c"], [1.0, 2.5, -3.0]
  libs = comp.compile_batch([kernel(n, k) for n, k in zip(names, ks)])
  assert len(calls) == 1 and calls[0].count(PRELUDE) == 1  # one translation unit, the prelude once
  assert libs[0] is libs[1] is libs[2]
  xs = [float(i) for i in range(8)]
  for n, k, lib in zip(names, ks, libs):
    assert run(n, lib, xs) == [2 * x + k for x in xs]
  # each source's cc/ entry names the shared library: a new read finds it without compiling
  cc._linked.clear()
  again = comp.compile_batch([kernel(n, k) for n, k in zip(names, ks)])
  assert len(calls) == 1 and again == libs
  assert comp.compile(kernel("k_b", 2.5)) == libs[1] and len(calls) == 1

def test_cached_sources_are_not_built_again_in_a_batch(cache):
  tmp, calls = cache
  comp = CPUCompiler(PRELUDE)
  alone = comp.compile(kernel("k_a", 1.0))
  libs = comp.compile_batch([kernel("k_a", 1.0), kernel("k_b", 2.0), kernel("k_c", 3.0)])
  assert len(calls) == 2 and "k_a" not in calls[1] and libs[0] == alone
  assert run("k_c", libs[2], [1.0] * 8) == [5.0] * 8

@pytest.mark.parametrize("damage", ["truncate", "garble", "delete"])
def test_damaged_shared_library_is_rebuilt_with_one_warning(cache, capsys, damage):
  tmp, calls = cache
  comp = CPUCompiler(PRELUDE)
  srcs = [kernel(f"k_{i}", float(i)) for i in range(4)]
  comp.compile_batch(srcs)
  (lib_file,) = [p for p in (tmp / "lib").iterdir() if not p.name.startswith(".")]
  data = lib_file.read_bytes()
  if damage == "truncate": lib_file.write_bytes(data[:len(data) // 2])
  elif damage == "garble": lib_file.write_bytes(data[:100] + bytes(x ^ 0x5A for x in data[100:164]) + data[164:])
  else: lib_file.unlink()
  cc._linked.clear()  # a new process
  capsys.readouterr()
  libs = [comp.compile(s) for s in srcs]  # as a warm process reads them: one by one
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 1 and err[0].startswith("attograd: warning: cache entry") and str(lib_file) in err[0] and "rebuilding" in err[0]
  assert len(calls) == 1 + len(srcs)  # each kernel built again
  for i, lib in enumerate(libs): assert run(f"k_{i}", lib, [0.0] * 8) == [float(i)] * 8
  # rebuilt on disk: read again, nothing is built and nothing is said
  cc._linked.clear(); cc._broken.clear()
  assert [comp.compile(s) for s in srcs] == libs and len(calls) == 1 + len(srcs)
  assert capsys.readouterr().err == ""

def test_a_source_that_fails_gets_its_own_error(cache):
  comp = CPUCompiler(PRELUDE)
  bad = PRELUDE + "void k_bad(float* out) { out[0] = undefined_thing; }\n"
  with pytest.raises(RuntimeError, match="undefined_thing"): comp.compile_batch([kernel("k_ok", 1.0), bad])
  # the queue gives every other kernel its binary and the bad one its error
  queue = CompileQueue(comp, ThreadPoolExecutor(1), 1)
  futs = [queue.submit("k_ok2", kernel("k_ok2", 2.0)), queue.submit("k_bad", bad)]
  assert run("k_ok2", futs[0].result()[0], [1.0] * 8) == [4.0] * 8
  with pytest.raises(RuntimeError, match="undefined_thing"): futs[1].result()

def test_queue_batches_what_waits_and_never_two_kernels_of_one_name(cache):
  tmp, calls = cache
  comp = CPUCompiler(PRELUDE)
  pool = ThreadPoolExecutor(1)
  gate = threading.Event()
  pool.submit(gate.wait)  # the worker is busy: everything submitted meanwhile waits
  queue = CompileQueue(comp, pool, 1)
  futs = [queue.submit(n, kernel(n, k)) for n, k in [("k_x", 1.0), ("k_y", 2.0), ("k_x", 3.0), ("k_z", 4.0)]]
  gate.set()
  results = [f.result(timeout=60) for f in futs]
  assert len(calls) == 2  # (k_x, k_y, k_z), then the second k_x
  assert results[0][0] is results[1][0] is results[3][0] and results[2][0] is not results[0][0]
  assert run("k_x", results[0][0], [1.0] * 8) == [3.0] * 8 and run("k_x", results[2][0], [1.0] * 8) == [5.0] * 8
  assert all(r[1] > 0 for r in results)  # each has its share of the compile time

def test_schedule_compiled_in_batches_gives_the_same_results(cache, monkeypatch):
  tmp, calls = cache
  rng = np.random.default_rng(0)
  xs = [rng.standard_normal((16, 24)).astype(np.float32) for _ in range(3)]
  def f(a, b, c):  # a dozen kernels of different shapes in one schedule
    out = [(a @ b.T).relu().sum(1), (a * 3).exp().max(axis=0), (b.sin() + c).mean(1), (a - c).square().sum(), a.softmax(1) @ c.T,
           (a.abs() + 1).log().sum(0), (b * c).tanh(), (a.T @ c).amax(1)]
    Tensor.realize_all(out)
    return [t.numpy() for t in out]
  def fresh(where: str, batches: bool) -> None:
    monkeypatch.setenv("ATTOGRAD_CACHE", str(tmp / where))
    monkeypatch.setattr(CPUCompiler, "batches", batches)
    realize._kernel_cache.clear()
    calls.clear()
  def kernel_calls() -> list[str]: return [c for c in calls if c.startswith(Device["CPU"].renderer.prelude)]  # not the thread pool's
  fresh("alone", False)
  expect = f(*(Tensor(x) for x in xs))
  assert len(kernel_calls()) == len(realize._kernel_cache) >= 8 and all(kernels_in(c) == 1 for c in kernel_calls())
  fresh("batched", True)
  monkeypatch.setattr(CompileQueue, "MAX_BATCH", 4)
  got = f(*(Tensor(x) for x in xs))
  assert any(kernels_in(c) > 1 for c in kernel_calls()) and len(kernel_calls()) < len(realize._kernel_cache)
  for g, e in zip(got, expect): np.testing.assert_array_equal(g, e)  # the same binaries' code: the same bits

class FakeCompiler:
  """Records each batch and how many ran at once; compiling takes a little while."""
  batches = True
  def __init__(self):
    self.calls: list[list[str]] = []
    self.active = self.most = 0
    self.lock = threading.Lock()
  def compile_batch(self, srcs: list[str]) -> list[bytes]:
    with self.lock: self.active += 1; self.most = max(self.most, self.active); self.calls.append(srcs)
    time.sleep(0.05)
    with self.lock: self.active -= 1
    return [s.encode() for s in srcs]
  def compile(self, src: str) -> bytes: return self.compile_batch([src])[0]

def test_queue_compiles_one_batch_at_a_time_while_lowering_and_batches_grow():
  comp, pool = FakeCompiler(), ThreadPoolExecutor(2)
  queue = CompileQueue(comp, pool, 2)
  queue.lowering = True
  futs = []
  for i in range(12):  # lowering: a source now and then
    futs.append(queue.submit(f"k{i}", f"src{i}"))
    time.sleep(0.01)
  futs += [queue.submit(f"k{i}", f"src{i}") for i in range(12, 20)]  # the last ones at once, then lowering ends
  time.sleep(0.2)
  assert comp.most == 1  # Python has the other core while it lowers
  queue.lowered()
  assert [f.result(timeout=60)[0] for f in futs] == [f"src{i}".encode() for i in range(20)]
  assert len(comp.calls) < 12 and sorted(s for c in comp.calls for s in c) == sorted(f"src{i}" for i in range(20))
  assert max(len(c) for c in comp.calls) > 1

def test_scheduling_and_lowering_pause_the_cycle_collector(cache, monkeypatch):
  # graphs hold no cycles; with a training step's graphs alive, full collections during lowering cost a quarter of a
  # cold start's Python time. The collector must be back on afterwards (and stay off if the user turned it off).
  seen: list[tuple[str, bool]] = []
  for mod, name in ((realize, "lower_kernel"), (schedule, "_template")):
    def spy(*a, _f=getattr(mod, name), _n=name, **k):
      seen.append((_n, gc.isenabled()))
      return _f(*a, **k)
    monkeypatch.setattr(mod, name, spy)
  realize._kernel_cache.clear()
  a = Tensor(np.arange(96, dtype=np.float32).reshape(8, 12))
  out = [(a * 2).sum(1), (a.exp() + 1).max(axis=0), a.T @ a]
  Tensor.realize_all(out)
  assert {n for n, _ in seen} == {"lower_kernel", "_template"} and not any(on for _, on in seen)
  assert gc.isenabled()
  gc.disable()
  try:
    with gc_paused(): pass
    assert not gc.isenabled()
  finally: gc.enable()

def test_kernels_are_lowered_while_the_rest_is_scheduled(cache, monkeypatch):
  # a realize lowers each new kernel (and queues its source for the compiler) as the scheduler makes it, so the compiler
  # works while the rest is scheduled (with LOWER_CHILD kernels, the lowering child lowers them while this process
  # schedules); a schedule only asked for (Tensor.schedule) lowers nothing
  events: list[str] = []
  for mod, name in ((realize, "_lower_ahead"), (schedule, "kernel_ast")):
    def spy(*a, _f=getattr(mod, name), _n=name, **k):
      events.append(_n)
      return _f(*a, **k)
    monkeypatch.setattr(mod, name, spy)
  realize._kernel_cache.clear()
  a = Tensor(np.arange(96, dtype=np.float32).reshape(8, 12) / 96)
  out = [(a * 2).sum(1), (a.exp() + 1).max(axis=0), (a.T @ a).sin(), a.softmax(1)]
  (a * 5).sum(0).schedule((a + 3).exp().max(axis=1))
  assert "kernel_ast" in events and "_lower_ahead" not in events
  events.clear()
  Tensor.realize_all(out)
  assert events.count("_lower_ahead") >= 3 and events.index("_lower_ahead") < len(events) - 1 - events[::-1].index("kernel_ast")
  x = a.numpy()
  e = np.exp(x - x.max(1, keepdims=True))
  for got, want in zip(out, [(x * 2).sum(1), (np.exp(x) + 1).max(0), np.sin(x.T @ x), e / e.sum(1, keepdims=True)]):
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)

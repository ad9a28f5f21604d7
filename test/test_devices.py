"""Devices: the PYTHON emulator (the reference semantics), CPU and LLVM agree; copies between them;
the compilers' disk caches; DEBUG=4 shows the source."""
import ctypes, importlib.util, mmap, os, pathlib, re, subprocess, sys
import numpy as np
import pytest
from attograd import Tensor, GlobalCounters

REPO = pathlib.Path(__file__).resolve().parents[1]
rng = np.random.default_rng(1)

HAS_LLVM = importlib.util.find_spec("llvmlite") is not None
COMPILED = ["CPU"] + (["LLVM"] if HAS_LLVM else [])
needs_llvm = pytest.mark.skipif(not HAS_LLVM, reason="llvmlite is not installed (pip install 'attograd[llvm]')")

def on_all(f, *arrays):
  """f applied to the arrays as tensors on PYTHON and on each compiled device: {device: result as numpy}."""
  return {d: f(*[Tensor(x, device=d) for x in arrays]).numpy() for d in ["PYTHON", *COMPILED]}

def check(f, *arrays, want=None, exact=False):
  out = on_all(f, *arrays)
  py = out.pop("PYTHON")
  cmp = np.testing.assert_equal if exact else lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)
  for dev, got in out.items():
    assert got.shape == py.shape and got.dtype == py.dtype, dev
    cmp(got, py)
  if want is not None: cmp(py, want)

na, nb = rng.standard_normal((5, 6)).astype(np.float32), rng.standard_normal((6, 4)).astype(np.float32)
ia, ib = rng.integers(-50, 50, (4, 6)).astype(np.int32), rng.integers(-7, 8, (4, 6)).astype(np.int32)
ib[ib == 0] = 3

def test_elementwise():
  check(lambda x: (x * 2 + 1).relu() - x.exp() / (x.abs() + 1), na, want=np.maximum(na * 2 + 1, 0) - np.exp(na) / (np.abs(na) + 1))
  check(lambda x: (x > 0).where(x.sqrt(), -x), na, want=np.where(na > 0, np.sqrt(np.abs(na)), -na))
  check(lambda x: x.cast("int32") + (x < 0), na, want=na.astype(np.int32) + (na < 0), exact=True)

def test_minus_a_negative_literal():
  # written without spaces, a - -1.5 is a decrement (a--1.5): a negative literal is an operand in parentheses
  check(lambda x: x - (-1.5), na, want=na + 1.5)
  check(lambda x: x - float("-inf"), na, want=na + np.inf)
  check(lambda x: x - (-3), ia, want=ia + 3, exact=True)
  check(lambda x: x.cast("int64") - (-(1 << 40)), ia, want=ia.astype(np.int64) + (1 << 40), exact=True)
  check(lambda x: x[:0].softmax(1), na, want=na[:0])  # the max over no rows is -inf, subtracted from each

def test_reduce():
  check(lambda x: x.sum(1), na, want=na.sum(1))
  check(lambda x: x.max(axis=0) + x.min(axis=1).sum(), na, want=na.max(0) + na.min(1).sum())
  check(lambda x: x.argmax(1), na, want=na.argmax(1), exact=True)
  check(lambda x: x.softmax(0), na, want=np.exp(na) / np.exp(na).sum(0))
  check(lambda x: x.sum(), ia, want=ia.sum(), exact=True)

def test_matmul():
  check(lambda x, y: x @ y, na, nb, want=na @ nb)
  check(lambda x, y: (x @ y).relu().sum(0), na, nb, want=np.maximum(na @ nb, 0).sum(0))

def test_movement_chains():
  want = np.pad(na, ((1, 2), (3, 0)))[::-1][1:7, 2:8][:, ::-2]
  check(lambda x: x.pad(((1, 2), (3, 0))).flip(0).shrink(((1, 7), (2, 8)))[:, ::-2], na, want=want, exact=True)
  check(lambda x: x.T.reshape(3, 10).permute(1, 0)[::3] + 1, na, want=na.T.reshape(3, 10).T[::3] + 1, exact=True)
  check(lambda x: x.reshape(5, 1, 6).expand(5, 2, 6).reshape(10, 6).flip(1), na, want=np.repeat(na, 2, 0)[:, ::-1], exact=True)

def test_int_division():
  check(lambda x, y: x // y, ia, ib, want=ia // ib, exact=True)  # floor, as numpy and torch
  check(lambda x, y: x % y, ia, ib, want=ia % ib, exact=True)
  check(lambda x, y: x.div(y, rounding_mode="trunc"), ia, ib, want=np.trunc(ia / ib).astype(np.int32), exact=True)
  check(lambda x: x // 4 + x % -3, ia, want=ia // 4 + ia % -3, exact=True)
  check(lambda x: (x.reshape(24) // 5).reshape(6, 4)[::2], ia, want=(ia.reshape(24) // 5).reshape(6, 4)[::2], exact=True)

u8, two = np.array([0, 10, 100, 128, 200, 255], np.uint8), np.full(6, 2, np.uint8)
i8, hundred = np.array([100, 127, -128, 5], np.int8), np.full(4, 100, np.int8)
@pytest.mark.parametrize("f, x, y, want", [  # like C on the stored type, numpy and torch: results wrap
  pytest.param(lambda x, y: (x * y) // y, u8, two, (u8 * two) // two, id="u8 (x*y)//y"),
  pytest.param(lambda x, y: (x * y) > y * 100, u8, two, (u8 * two) > two * np.uint8(100), id="u8 x*y>y*100"),
  pytest.param(lambda x, y: (x + y) < y * 0, i8, hundred, (i8 + hundred) < 0, id="i8 x+y<0"),
])
def test_narrow_ints_wrap(f, x, y, want): check(f, x, y, want=want, exact=True)

@pytest.mark.parametrize("dtype", [np.uint32, np.uint64])
def test_unsigned_division_by_max_value(dtype):
  big = np.iinfo(dtype).max
  x, m = np.array([5, big, 7, 0], dtype), np.full(4, big, dtype)
  check(lambda a, b: a // b, x, m, want=x // m, exact=True)
  check(lambda a, b: a % b, x, m, want=x % m, exact=True)

def test_random_numbers_are_the_same_on_every_device():
  def draw(device):
    Tensor.manual_seed(3)
    return [t.numpy() for t in (Tensor.rand(5, device=device), Tensor.randn(3, device=device), Tensor.randint(4, high=100, device=device))]
  for dev in COMPILED:
    for got, py in zip(draw(dev), draw("PYTHON")): np.testing.assert_allclose(got, py, rtol=1e-6)

def test_copy_between_devices():
  x = Tensor(na, device="CPU")
  y = x.to("PYTHON")
  assert y.device == "PYTHON" and x.device == "CPU" and x.to("cpu") is x
  np.testing.assert_equal(y.numpy(), na)
  z = (y * 2).to("CPU") + x
  assert z.device == "CPU"
  np.testing.assert_allclose(z.numpy(), na * 3, rtol=1e-6)
  GlobalCounters.reset()
  w = (x.T + 1).to("PYTHON").realize()  # a lazy view is computed, then copied
  assert GlobalCounters.kernel_count == 2
  np.testing.assert_allclose(w.numpy(), na.T + 1, rtol=1e-6)

# ***** CPU compiler: disk cache and DEBUG output, each in a fresh process *****

CACHE_SCRIPT = """
import subprocess
calls = []
real = subprocess.Popen  # (runtime/cc.py imports subprocess where it runs a compiler: the module's Popen is the one it calls)
subprocess.Popen = lambda *a, **k: calls.append(a) or real(*a, **k)
from attograd import Tensor
x = Tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.5]])
print((x * 3 + 17.25).sum(1).tolist(), (x.T @ x).max().item())
print("compiles", len(calls))
"""

def run_python(script: str, **env) -> str:
  out = subprocess.run([sys.executable, "-c", script], cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  return out.stdout

DISCOVERY_SCRIPT = """
import sys, attograd.runtime
sys.argv[1:] and attograd.runtime.__path__.append(sys.argv[1])  # a directory of out-of-tree backends
from attograd import Device, Tensor
print(Device.backends, Device.canonicalize("webgpu"), Device.DEFAULT)
print(sorted(m for m in sys.modules if ".ops_" in m))  # naming every backend imported none of them
try: Device["NOPE"]
except ValueError as e: print(e)
if len(sys.argv) > 1: print((Tensor([1.0, 2.0], device="echo") * 3).tolist(), type(Device["ECHO"]).__name__)
"""

def test_devices_are_discovered_by_module_file(tmp_path):
  # a new backend is one file, ops_<name>.py defining <Name>Device: no list to edit
  (tmp_path / "ops_echo.py").write_text("from attograd.runtime.ops_python import PythonDevice\nclass EchoDevice(PythonDevice): pass\n")
  out = subprocess.run([sys.executable, "-c", DISCOVERY_SCRIPT, str(tmp_path)], cwd=REPO, env={**os.environ, "ECHO": "1"},
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  names, imported, unknown, result = out.stdout.splitlines()
  assert names == "('CL', 'CPU', 'CUDA', 'DISK', 'ECHO', 'LLVM', 'PYTHON', 'WEBGPU') WEBGPU ECHO", names  # ECHO=1 picks it
  assert imported == "[]"
  assert unknown == "unknown device 'NOPE'; available: CL, CPU, CUDA, DISK, ECHO, LLVM, PYTHON, WEBGPU"
  assert result == "[3.0, 6.0] EchoDevice", result
  # without the extra directory the backends are the shipped files, and the default is CPU
  names, imported, unknown = run_python(DISCOVERY_SCRIPT).splitlines()
  assert names == "('CL', 'CPU', 'CUDA', 'DISK', 'LLVM', 'PYTHON', 'WEBGPU') WEBGPU CPU" and imported == "[]", names

def test_cpu_compiler_caches_on_disk(tmp_path):
  first = run_python(CACHE_SCRIPT, ATTOGRAD_CACHE=str(tmp_path), DEBUG="0")
  files = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
  assert any(f.startswith("cc/") and f.endswith(".so") for f in files), files
  assert int(re.search(r"compiles (\d+)", first).group(1)) >= 2
  second = run_python(CACHE_SCRIPT, ATTOGRAD_CACHE=str(tmp_path), DEBUG="0")
  assert re.search(r"compiles (\d+)", second).group(1) == "0", "the second process compiled again"
  assert first == second.replace("compiles 0", re.search(r"compiles \d+", first).group(0))
  assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == files  # nothing new on disk

def test_debug4_prints_source(tmp_path):
  out = run_python("from attograd import Tensor\nx = Tensor([1.0, 2.0, 3.0])\n(x + 1).realize(); x.sum().realize()",
                   DEBUG="4", ATTOGRAD_CACHE=str(tmp_path))
  assert "void " in out
  # one function per kernel, and its slice entry (the thread pool's and a replay's native run loop's)
  names = re.findall(r"^void (\w+)\(", out, re.M)
  assert len(names) == 4 and sorted(n for n in names if not n.endswith("_slice")) == sorted(n[:-6] for n in names if n.endswith("_slice")), out

def test_cpu_memory_maps_spare_bytes_fresh_or_pooled(monkeypatch):
  # kernels may read SPARE_BYTES before and after a buffer (codegen drops such reads' gates); the pool reuses a block for
  # a buffer of the same size and counts what it holds without them (1 GiB of 64 MiB buffers is 16 blocks)
  import attograd.runtime.ops_cpu as cpu
  monkeypatch.setattr(cpu, "POOL", cpu.MemoryPool())
  before, after = cpu.SPARE_BYTES
  assert before > 0 and after > 0
  a = cpu.CPUMemory(1 << 20)
  base = ctypes.addressof(ctypes.c_char.from_buffer(a.mem))
  assert len(a.mem) == before + (1 << 20) + after and a.addr == base + before and a.addr % 64 == 0
  a.data[:] = b"\1" * (1 << 20)  # the buffer's bytes are the middle of the mapping
  assert bytes(a.mem[before - 1:before + 1]) == b"\0\1" and bytes(a.mem[before + (1 << 20) - 1:before + (1 << 20) + 1]) == b"\1\0"
  mem, addr = a.mem, a.addr
  del a
  b = cpu.CPUMemory(1 << 20)
  assert (b.mem, b.addr) == (mem, addr)
  pool = cpu.MemoryPool()
  for _ in range(17): pool.give(mmap.mmap(-1, (64 << 20) + sum(cpu.SPARE_BYTES)), 0)
  assert sum(len(v) for v in pool.free.values()) == 16 and pool.held == 1 << 30 and pool.take(64 << 20) is not None

# ***** LLVM: the casts C leaves undefined, threads, its disk cache *****

def test_small_buffers_share_a_mapping_with_spare_bytes_at_its_ends(monkeypatch):
  # buffers under MemoryPool.MIN_BYTES are chunks of one mapping: each 64-byte aligned, in the mapping's interior (its
  # neighbours or the mapping's own spare pages are what a kernel's over-read reads), zero-filled when taken again
  import attograd.runtime.ops_cpu as cpu
  heap = cpu.SmallHeap()
  monkeypatch.setattr(cpu, "SMALL", heap)
  before, after = cpu.SPARE_BYTES
  a, b, c = cpu.CPUMemory(10), cpu.CPUMemory(100), cpu.CPUMemory(cpu.MemoryPool.MIN_BYTES - 1)
  assert a.mem is b.mem is c.mem and len(a.mem) == before + heap.SLAB_BYTES + after
  base = ctypes.addressof(ctypes.c_char.from_buffer(a.mem))
  for m in (a, b, c): assert m.addr % 64 == 0 and m.addr == base + m.start and before <= m.start <= len(m.mem) - after - m.nbytes
  assert len({a.start, b.start, c.start}) == 3 and b.start >= a.start + 64 and c.start >= b.start + 128
  b.data[:] = b"\7" * 100
  start = b.start
  del b
  d = cpu.CPUMemory(120)  # the same size class: the freed chunk, zeroed
  assert d.start == start and bytes(d.data) == b"\0" * 120
  # a slab too full for the next chunk gives way to a new mapping
  rest = [cpu.CPUMemory(cpu.MemoryPool.MIN_BYTES // 2 + 1) for _ in range(heap.SLAB_BYTES // cpu.MemoryPool.MIN_BYTES + 1)]
  assert rest[-1].mem is not a.mem and before <= rest[-1].start
  # values through kernels on small buffers side by side (a padded read crosses into the neighbours)
  x, y = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4)), Tensor(np.full((3, 4), 5, np.float32))
  np.testing.assert_equal(x.pad(((1, 1), (2, 2))).numpy(), np.pad(np.arange(12, dtype=np.float32).reshape(3, 4), ((1, 1), (2, 2))))
  np.testing.assert_equal((x + y).numpy(), np.arange(12).reshape(3, 4) + 5)

@needs_llvm
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "bool", "float16", "bfloat16"])
def test_llvm_casts_match_the_reference(dtype):
  """Float to integer is poison in LLVM out of range; the LLVM device wraps like the emulator for every
  value an int64 holds (and NaN gives 0), and rounds double -> half once."""
  x = np.array([0.0, -0.0, 1.5, -1.5, 127.9, 128.5, -129.0, 255.5, 65535.7, 3e9, -3e9, 1e18, -1e18, 2.0**63 + 2**11,
                np.nan, 1 + 2**-11 + 2**-40, 65519.99, 6e-8, 2.9e-8, 1e-300], np.float64)
  as_f32 = lambda t: t.cast("float32") if dtype == "bfloat16" else t  # numpy has no bfloat16
  got = as_f32(Tensor(x, device="LLVM").cast(dtype)).numpy()
  ref = as_f32(Tensor(x, device="PYTHON").cast(dtype)).numpy()
  keep = x < 2.0**63 if dtype != "uint64" else np.ones(len(x), bool)  # beyond int64 the result is saturated, not wrapped
  np.testing.assert_equal(got[keep], ref[keep])
  for narrow in ("float16", "bfloat16"):  # from the 16-bit floats too (computed through float32)
    h = np.array([0.0, -1.5, 200.7, -129.2, 65504.0, np.nan, -40000.0])
    got, ref = (as_f32(Tensor(h, device=d).cast(narrow).cast(dtype)).numpy() for d in ("LLVM", "PYTHON"))
    np.testing.assert_equal(got, ref)

@needs_llvm
def test_llvm_threads_agree_with_one_thread():
  from attograd import Context
  from attograd.engine import realize
  x = rng.standard_normal((256, 512)).astype(np.float32)
  def run(threads):
    realize._kernel_cache.clear()
    with Context(THREADS=threads): return (Tensor(x, device="LLVM").sin() * 3).sum(1).numpy()
  one, two = run(1), run(2)
  assert any(ck.threads == 2 for ck in realize._kernel_cache.values()), "the heuristic should thread a kernel this big"
  np.testing.assert_array_equal(one, two)
  np.testing.assert_allclose(one, (np.sin(x) * 3).sum(1), rtol=1e-4, atol=1e-4)

LLVM_CACHE_SCRIPT = """
import os
from attograd import Tensor
x = Tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.5]], device="LLVM")
print((x * 3 + 17.25).sum(1).tolist(), (x.T @ x).max().item())
print("libraries", len(os.listdir(os.path.join(os.environ["ATTOGRAD_CACHE"], "llvm"))))
"""

@needs_llvm
def test_llvm_compiler_caches_on_disk(tmp_path):
  first = run_python(LLVM_CACHE_SCRIPT, ATTOGRAD_CACHE=str(tmp_path), DEBUG="0")
  n = int(re.search(r"libraries (\d+)", first).group(1))
  assert n >= 2, first
  files = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
  second = run_python(LLVM_CACHE_SCRIPT, ATTOGRAD_CACHE=str(tmp_path), DEBUG="0")
  assert first == second and sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == files  # read back, nothing new

@needs_llvm
def test_llvm_debug4_prints_ir(tmp_path):
  out = run_python("from attograd import Tensor\nx = Tensor([1.0, 2.0, 3.0], device='LLVM')\n(x + 1).realize(); x.sum().realize()",
                   DEBUG="4", ATTOGRAD_CACHE=str(tmp_path))
  names = re.findall(r"^define void @(\w+)\(", out, re.M)  # each kernel and its slice entry
  assert len(names) == 4 and sorted(n for n in names if not n.endswith("_slice")) == sorted(n[:-6] for n in names if n.endswith("_slice")), out

def test_llvm_without_llvmlite_says_how_to_install():
  script = "import sys; sys.modules['llvmlite'] = None\nfrom attograd import Tensor\ntry: Tensor([1.0], device='LLVM').realize()\n" \
           "except RuntimeError as e: print(e)"
  assert "pip install 'attograd[llvm]'" in run_python(script)

@needs_llvm
@pytest.mark.skipif(__import__("platform").machine() not in ("x86_64", "AMD64"), reason="reads x86 assembly")
def test_llvm_code_uses_vectors_and_fma():
  """Elementwise loops are vectorized; a sum's 16 partial accumulators and a matmul's register tile are packed into
  vector registers, its multiply-adds FMAs (as gcc does), not vectorized across the reduce loop's iterations with
  gathers of every 16th or 32nd value (5-7x slower)."""
  from attograd.runtime.device import Device
  from attograd.codegen import to_program
  from attograd.codegen.heuristic import cpu_opts
  from attograd.runtime.ops_llvm import _llvm
  dev = Device["LLVM"]
  x = Tensor.empty(64, 256, device="LLVM")
  def asm(t):
    ast = t.schedule()[-1].ast
    return dev.compiler.assembly(to_program(ast, dev.renderer, cpu_opts(ast, 1))[1])
  assert re.search(r"\bv?(mul|add)ps\b", asm(x * 2 + 1)), "elementwise float math isn't vectorized"
  for code in (asm(x.sum(1)), asm(Tensor.empty(1 << 16, device="LLVM").sum())):
    assert re.search(r"\bv?addps\b", code) and "gather" not in code, "a float sum's partial sums aren't a vector register"
  if "+fma" in _llvm().get_host_cpu_features().flatten():
    code = asm(x @ Tensor.empty(256, 64, device="LLVM"))
    assert re.search(r"\bvfmadd\d+ps\b", code) and not re.search(r"\bvfmadd\d+ss\b", code) and "gather" not in code, \
      "a matmul's register tile isn't packed FMAs"

def test_llvm_accumulates_products_with_fmuladd():
  """Lowering makes a float accumulator's acc + a*b one MULACC, which LLVM IR writes as llvm.fmuladd (rounded once, as C's
  fmaf): no renderer pass of LLVM's own is needed for it (one that did this after lowering never fired, and was removed)."""
  from attograd.codegen import to_program
  from attograd.codegen.heuristic import cpu_opts
  from attograd.renderer.llvmir import LLVMRenderer
  ast, r = (Tensor.empty(16, 32) @ Tensor.empty(32, 8)).schedule()[-1].ast, LLVMRenderer()
  for opts in ([], cpu_opts(ast, 1, r.simd_floats)):  # one accumulator; a register tile of them
    assert re.search(r"call \S+ @llvm\.fmuladd\.(f32|v\d+f32)\(", to_program(ast, r, opts)[1]), opts

@needs_llvm
def test_llvm_float_sums_are_the_c_backends():
  """The LLVM device adds in the order the kernel gives, as C does (no reassociation): the same bits."""
  x, a, b = (rng.standard_normal(s).astype(np.float32) for s in ((1 << 16,), (64, 256), (256, 64)))
  for f, args in ((lambda v: v.sum(), (x,)), (lambda v: v.reshape(256, 256).sum(1), (x,)), (lambda p, q: p @ q, (a, b))):
    c, llvm = (f(*[Tensor(v, device=d) for v in args]).numpy() for d in ("CPU", "LLVM"))
    np.testing.assert_array_equal(c, llvm)

"""The CPU device with each C compiler found here (gcc, clang: scripts/install_deps.sh installs both), and its float16:
_Float16 where the compiler has it, else (clang before 15 on x86-64) float16 stored as its bits with conversions in the C
prelude. Both ways must give numpy's bits."""
import json, os, re, shutil, subprocess, sys
import numpy as np
import pytest
from attograd import Tensor, dtypes
from attograd.codegen import to_program
from attograd.engine.realize import buffer_of, run_schedule
from attograd.renderer.cstyle import CStyleRenderer
from attograd.runtime import ops_cpu
from attograd.runtime.device import Buffer
from attograd.runtime.ops_cpu import CPUCompiler, CPUProgram, has_float16

def _compilers() -> list[str]:
  """The C compilers on PATH, one name per binary."""
  found: dict[str, str] = {}
  for cc in ("gcc", "clang", *(f"clang-{v}" for v in range(11, 21))):
    if (path := shutil.which(cc)) is not None: found.setdefault(os.path.realpath(path), cc)
  return sorted(found.values())

# every value rounds differently if converted twice (double -> float -> half), or sits at an edge: the largest half and
# the first value past it, subnormals and ties between them, the smallest normal, -0, inf, nan
EDGES = [1 + 2**-11 + 2**-40, 65504.0, 65519.99, 65520.0, -2**-25 - 2**-40, 2**-25, 2**-24 * 1.5, 2**-24 * 2.5, 2**-14 * (1 - 2**-12),
         6.1e-5, 1 / 3, -0.0, 1e-9, -1e6, float("inf"), float("-inf"), float("nan")]

SCRIPT = """
import json, numpy as np
from attograd import Tensor, dtypes
from attograd.runtime.device import Device
rng = np.random.default_rng(0)
a, b = rng.standard_normal((33, 20)).astype(np.float16), rng.standard_normal((20, 17)).astype(np.float16)
x = rng.standard_normal((64, 48)).astype(np.float32)
edges = np.array(EDGES)
with np.errstate(over="ignore"):
  want64, want32 = edges.astype(np.float16), edges.astype(np.float32).astype(np.float16)
ok = {
  "half matmul": bool(np.allclose((Tensor(a) @ Tensor(b)).numpy(), a.astype(np.float32) @ b.astype(np.float32), atol=2e-2, rtol=1e-2)),
  "half from double": Tensor(edges).cast(dtypes.float16).numpy().view(np.uint16).tolist() == want64.view(np.uint16).tolist(),
  "half from float": Tensor(edges.astype(np.float32)).cast(dtypes.float16).numpy().view(np.uint16).tolist() == want32.view(np.uint16).tolist(),
  "half sum": bool(np.isclose(Tensor(a).sum().item(), a.astype(np.float32).sum(), rtol=1e-2)),
  "softmax": bool(np.allclose(Tensor(x).softmax(1).numpy(), np.exp(x) / np.exp(x).sum(1, keepdims=True), atol=1e-6)),
  "matmul": bool(np.allclose((Tensor(x) @ Tensor(x.T)).numpy(), x @ x.T, atol=1e-4)),
  "int division": (Tensor([7, -7, 9]) // Tensor([2, 2, -4])).tolist() == [3, -4, -3],
}
dev = Device["CPU"]
print(json.dumps({"cc": dev.compiler.cc, "f16_bits": dev.renderer.f16_bits, "ok": ok}))
""".replace("EDGES", repr(EDGES).replace("inf", "float('inf')").replace("nan", "float('nan')"))

@pytest.mark.parametrize("cc", _compilers())
def test_each_compiler_runs_float16_and_ops(cc, tmp_path):
  # a fresh cache: the compiler's float16 probe runs, and every kernel is compiled by this compiler
  env = {**os.environ, "CC": cc, "ATTOGRAD_CACHE": str(tmp_path)}
  proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out["cc"] == cc and all(out["ok"].values()), out
  assert out["f16_bits"] == (not has_float16(cc, tuple(CPUCompiler(cc=cc).flags)))

def _run(t: Tensor, renderer: CStyleRenderer) -> np.ndarray:
  """t's last kernel rendered by renderer and compiled by the CPU device's compiler (the kernels before it run as usual)."""
  sched = t.schedule()
  run_schedule(sched[:-1])
  si = sched[-1]
  name, src, _ = to_program(si.ast, renderer, [])
  prog = CPUProgram(name, CPUCompiler(renderer.prelude).compile(src))
  out = Buffer("CPU", si.bufs[0].arg.size, si.bufs[0].dtype).ensure_allocated()
  prog([out._buf] + [buffer_of(b).ensure_allocated()._buf for b in si.bufs[1:]], [])
  return np.frombuffer(out.as_bytes(), dtype=np.float16 if t.dtype == dtypes.float16 else np.dtype(t.dtype.fmt)).copy()

def test_float16_as_bits_converts_as_numpy():
  # the fallback for a compiler without _Float16, checked with whichever compiler is here
  r = CStyleRenderer(f16_bits=True)
  rng = np.random.default_rng(1)
  every = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
  back = _run(Tensor(every).cast(dtypes.float32), r)
  nan = np.isnan(every)  # a signaling NaN comes back quiet: only its being NaN is checked
  assert np.array_equal(back[~nan].view(np.uint32), every[~nan].astype(np.float32).view(np.uint32)) and np.isnan(back[nan]).all()
  back64 = _run(Tensor(every).cast(dtypes.float64), r)
  assert np.array_equal(back64[~nan].view(np.uint64), every[~nan].astype(np.float64).view(np.uint64)) and np.isnan(back64[nan]).all()
  x32 = np.concatenate([np.array(EDGES, np.float32), rng.standard_normal(100000).astype(np.float32) * np.exp2(rng.integers(-30, 18, 100000)).astype(np.float32)])
  x64 = np.concatenate([np.array(EDGES), x32[len(EDGES):].astype(np.float64) * (1 + rng.standard_normal(100000) * 1e-9)])
  with np.errstate(over="ignore"):
    for x in (x32, x64):
      got, want = _run(Tensor(x).cast(dtypes.float16), r), x.astype(np.float16)
      assert np.array_equal(got[~np.isnan(want)].view(np.uint16), want[~np.isnan(want)].view(np.uint16)) and np.isnan(got[np.isnan(want)]).all()
  h = np.array([1.5, -2, 0.1, 65504], np.float16)
  assert _run(Tensor(h).bitcast(dtypes.int16), r).tolist() == h.view(np.int16).tolist()
  with np.errstate(over="ignore"): assert _run(Tensor(h) * 2 + 1, r).tolist() == (h * np.float16(2) + np.float16(1)).tolist()
  assert _run(Tensor.full((3,), 2.5, dtype=dtypes.float16).contiguous(), r).tolist() == [2.5] * 3

def test_float16_probe_is_kept(tmp_path, monkeypatch):
  monkeypatch.setenv("ATTOGRAD_CACHE", str(tmp_path))
  cc = CPUCompiler()
  first = has_float16.__wrapped__(cc.cc, tuple(cc.flags))
  assert [p.suffix for p in tmp_path.rglob("*") if p.is_file()] == [".probe"]  # the answer alone: the probe's binary isn't kept
  assert has_float16.__wrapped__("/bin/false", tuple(cc.flags)) is False  # not a compiler: no _Float16
  def no_compiler(*args): raise AssertionError("probed again")
  monkeypatch.setattr(ops_cpu, "compile_c", no_compiler)
  assert has_float16.__wrapped__(cc.cc, tuple(cc.flags)) == first and has_float16.__wrapped__("/bin/false", tuple(cc.flags)) is False

# math built from selects and bit tricks (uop/mathlib.py, frontend/elementwise.py) that gcc must still vectorize: a float
# abs written as max(x, -x) put a NaN test into a select chain gcc 12 can't if-convert, and a tanh-GELU ran scalar
# (26 ns a value, a GPT's MLP 4x slower than torch's)
VECTOR_MATH = {"gelu_tanh": lambda x: x.gelu(approximate="tanh"), "gelu": lambda x: x.gelu(), "expm1": Tensor.expm1,
               "tanh": Tensor.tanh, "asin": Tensor.asin, "atan": Tensor.atan, "sinh": Tensor.sinh, "abs": Tensor.abs}

@pytest.mark.parametrize("name", VECTOR_MATH)
def test_math_function_loops_vectorize(name, tmp_path):
  from attograd.engine.realize import get_kernel
  from attograd.runtime.device import Device
  dev = Device["CPU"]
  cc = getattr(dev.compiler, "cc", "")
  if "gcc" not in os.path.basename(os.path.realpath(shutil.which(cc) or cc)): pytest.skip("the CPU compiler is not gcc")
  x = Tensor(np.linspace(-3, 3, 64 * 512, dtype=np.float32).reshape(64, 512)).realize()
  src = get_kernel(VECTOR_MATH[name](x).schedule()[-1].ast, "CPU").src
  (tmp_path / "k.c").write_text(src)
  flags = [f for f in dev.compiler.flags if f not in ("-shared", "-lm")]
  out = subprocess.run([cc, *flags, "-c", str(tmp_path / "k.c"), "-o", str(tmp_path / "k.o"), "-fopt-info-vec-optimized"],
                       capture_output=True, text=True, check=True)
  assert "loop vectorized" in out.stderr, f"{name}: no loop vectorized\n{src}"

@pytest.mark.skipif(bool(os.getenv("CC")) or not shutil.which("gcc") or not (shutil.which("clang-15") or shutil.which("clang")),
                    reason="the default compiler is gcc, with clang beside it")
def test_byte_decoding_kernels_are_built_by_clang():
  # a quantized matvec (bytes -> nibbles -> floats, times a vector): gcc 12 widens the bytes lane by lane, clang in one
  # instruction, so such a kernel goes to clang; a float kernel stays with gcc. Both in one batch, both right
  from attograd.engine.realize import get_kernel
  from attograd.runtime.device import Device
  rng = np.random.default_rng(0)
  q, x = rng.integers(0, 256, (96, 32), dtype=np.uint8), rng.standard_normal((1, 96)).astype(np.float32)
  quant = Tensor(x) @ ((Tensor(q) >> 4).cast(dtypes.float32) * 0.5)
  plain = Tensor(x) @ Tensor(x.T)
  comp = Device["CPU"].compiler
  srcs = [get_kernel(t.schedule()[-1].ast, "CPU").src for t in (quant, plain)]
  assert comp.compiler_for(srcs[0])[0].startswith("clang") and comp.compiler_for(srcs[1])[0] == comp.cc == "gcc"
  assert all(isinstance(lib, bytes) and lib for lib in comp.compile_batch(srcs))
  np.testing.assert_allclose(quant.numpy(), x @ ((q >> 4).astype(np.float32) * 0.5), rtol=1e-5)
  np.testing.assert_allclose(plain.numpy(), x @ x.T, rtol=1e-5)

def test_programs_sharing_a_library_take_their_own_arguments():
  # two kernels of one name gcc compiles to the same bytes (one leaves an argument unread) share the loaded library and
  # its function object: each program's argument types are its own (argtypes on the shared object refused the other)
  from attograd.runtime.device import Device
  comp = Device["CPU"].compiler
  lib = comp.compile(comp.prelude + "void k(long long* restrict data0, float* restrict data1) { *(data0+0) = 7ll; }\n")
  two, one = CPUProgram("k", lib), CPUProgram("k", lib)
  a, b = Buffer("CPU", 1, dtypes.int64).ensure_allocated(), Buffer("CPU", 1, dtypes.float32).ensure_allocated()
  two([a._buf, b._buf], [])
  one([a._buf], [])
  assert np.frombuffer(a.host_view(), np.int64).tolist() == [7]

@pytest.mark.skipif(bool(os.getenv("CC")) or not shutil.which("gcc"), reason="the default compiler is gcc")
def test_softmax_over_a_padded_row_vectorizes_its_exp(tmp_path):
  # softmax over rows no 4 divides, padded to 16s (PP-OCR rec's 6625 classes): the exp is stored for the output (STASH) inside the sum's
  # loop, gated by the padding; gcc's very-cheap model left that loop scalar (the masked store's aliasing needs a
  # versioned loop), the dynamic one (GCC_DYNAMIC_COST) vectorizes it: one core, rec's (40, 6625) 1.6-3.9 -> 0.33-0.41 ms
  from attograd.engine.realize import get_kernel
  from attograd.runtime.device import Device
  dev = Device["CPU"]
  if "gcc" not in os.path.basename(os.path.realpath(shutil.which(dev.compiler.cc) or dev.compiler.cc)): pytest.skip("the CPU compiler is not gcc")
  x = np.random.default_rng(0).standard_normal((8, 1001)).astype(np.float32)
  padded, whole = Tensor(x).softmax(-1), Tensor(x[:, :992]).softmax(-1)
  srcs = [get_kernel(t.schedule()[-1].ast, "CPU").src for t in (padded, whole)]
  (cc, flags), (_, plain) = (dev.compiler.compiler_for(s) for s in srcs)
  assert "-fvect-cost-model=dynamic" in flags and "-fvect-cost-model=very-cheap" in plain, srcs[0]
  lines = srcs[0].splitlines()
  gated = next(i for i, l in enumerate(lines) if l.lstrip().startswith("if (alu") and "*(data" in l)
  loop = max(i for i in range(gated) if lines[i].lstrip().startswith("for ("))
  (tmp_path / "k.c").write_text(srcs[0])
  out = subprocess.run([cc, *[f for f in flags if f not in ("-shared", "-lm")], "-c", str(tmp_path / "k.c"), "-o", str(tmp_path / "k.o"),
                        "-fopt-info-vec-optimized"], capture_output=True, text=True, check=True)
  assert f"k.c:{loop + 1}:" in out.stderr and "loop vectorized" in out.stderr, f"the exp loop stayed scalar\n{out.stderr}\n{srcs[0]}"
  assert all(isinstance(lib, bytes) and lib for lib in dev.compiler.compile_batch(srcs))  # one batch, two flag sets
  def softmax(a: np.ndarray) -> np.ndarray: return np.exp(a - a.max(-1, keepdims=True)) / np.exp(a - a.max(-1, keepdims=True)).sum(-1, keepdims=True)
  np.testing.assert_allclose(padded.numpy(), softmax(x), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(whole.numpy(), softmax(x[:, :992]), rtol=1e-5, atol=1e-7)

@pytest.mark.skipif(bool(os.getenv("CC")) or not shutil.which("gcc"), reason="the default compiler is gcc")
def test_strided_depthwise_conv_vectorizes_its_outputs(tmp_path):
  # a depthwise conv of stride 2 along its width (PP-OCR rec's 128 channels 3x3 at 12x160 -> 12x80) has no lanes from the
  # heuristics (its reads along the width are every second element): its accumulators are one scalar, so gcc's dynamic
  # cost model (GCC_DYNAMIC_COST) builds it, which vectorizes the loop over the outputs (very-cheap left it scalar: one
  # core 0.6-1.0 -> 0.24-0.31 ms); a kernel with an accumulator of lanes keeps the very-cheap model
  from attograd.engine.realize import get_kernel
  from attograd.runtime.device import Device
  torch = pytest.importorskip("torch")
  dev = Device["CPU"]
  if "gcc" not in os.path.basename(os.path.realpath(shutil.which(dev.compiler.cc) or dev.compiler.cc)): pytest.skip("the CPU compiler is not gcc")
  rng = np.random.default_rng(0)
  xn, wn = rng.standard_normal((1, 16, 12, 40), dtype=np.float32), rng.standard_normal((16, 1, 3, 3), dtype=np.float32)
  y = Tensor(xn).conv2d(Tensor(wn), stride=(1, 2), padding=1, groups=16)
  src = get_kernel(y.schedule()[-1].ast, "CPU").src
  cc, flags = dev.compiler.compiler_for(src)
  assert "-fvect-cost-model=dynamic" in flags, src
  lines = src.splitlines()
  loop = next(i for i, l in enumerate(lines) if re.match(r"\s*for \(int r\d+ = 0; r\d+ < 20;", l))  # over a row's 20 outputs
  (tmp_path / "k.c").write_text(src)
  out = subprocess.run([cc, *[f for f in flags if f not in ("-shared", "-lm")], "-c", str(tmp_path / "k.c"), "-o", str(tmp_path / "k.o"),
                        "-fopt-info-vec-optimized"], capture_output=True, text=True, check=True)
  assert f"k.c:{loop + 1}:" in out.stderr and "loop vectorized" in out.stderr, f"the output loop stayed scalar\n{out.stderr}\n{src}"
  want = torch.nn.functional.conv2d(torch.from_numpy(xn), torch.from_numpy(wn), stride=(1, 2), padding=1, groups=16).numpy()
  np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-5)
  # a 5x5 window padded, stride 1 along the width (a SIMD loop of lanes: acc[16]) keeps the very-cheap model
  lanes = get_kernel(Tensor(xn).conv2d(Tensor(rng.standard_normal((16, 1, 5, 5), dtype=np.float32)), padding=2, groups=16).schedule()[-1].ast, "CPU").src
  assert "-fvect-cost-model=very-cheap" in dev.compiler.compiler_for(lanes)[1], lanes

# a library that calls libm (log2), needs libgcc's helpers (128-bit division; double -> _Float16 where the compiler has
# _Float16) and libc (memset, for a big zeroed array): cc.py links a kernel's object with ld itself, naming those
LINKED = """
float lg(float x) { return log2f(x); }
long long div128(long long a, long long b) { return (long long)((__int128)a * 1000000007 / (__int128)b); }
void zero(float *restrict out, int n) { float acc[4096] = {0}; acc[n & 4095] = (float)n; for (int i = 0; i < 4096; i++) out[i] = acc[i]; }
#ifdef HALF
unsigned short half(double d) { union { _Float16 h; unsigned short u; } v = { .h = (_Float16)d }; return v.u; }
#endif
"""

@pytest.mark.parametrize("cc", _compilers())
def test_kernel_objects_link_with_their_libraries(cc):
  import ctypes
  from attograd.helpers import Context
  from attograd.runtime.cc import _linker, compile_c, load_library
  if _linker(cc) is None: pytest.skip(f"{cc} doesn't name its linker and libraries: the driver links")
  flags = ops_cpu.c_flags(cc)
  half = has_float16(cc, tuple(flags))
  with Context(CACHELEVEL=0):
    lib = load_library(compile_c(cc, "float log2f(float);\n" + "#define HALF\n" * half + LINKED, flags, "the link test"))
  lib.lg.restype, lib.lg.argtypes = ctypes.c_float, [ctypes.c_float]
  assert lib.lg(8.0) == 3.0
  lib.div128.restype, lib.div128.argtypes = ctypes.c_longlong, [ctypes.c_longlong, ctypes.c_longlong]
  assert lib.div128(10**12, 10**6 + 3) == 10**12 * 1000000007 // (10**6 + 3)
  out = (ctypes.c_float * 4096)()
  lib.zero(out, 5)
  assert list(out[:7]) == [0, 0, 0, 0, 0, 5, 0]
  if half:
    lib.half.restype, lib.half.argtypes = ctypes.c_ushort, [ctypes.c_double]
    assert lib.half(1 + 2**-11 + 2**-40) == np.array([1 + 2**-11 + 2**-40]).astype(np.float16).view(np.uint16)[0]

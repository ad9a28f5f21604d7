"""PTX: every kernel the op suite (test_ops.py) runs, and those of a set of ops in every dtype, render
and assemble with ptxas for sm_80 and sm_90 (one module per architecture, one ptxas run) (nothing can run them here: there is no GPU). The float64 math library the
PTX renderer uses is checked for accuracy where it can run, on CPU."""
import functools, math, re, shutil, subprocess
import numpy as np
import pytest
from attograd import Tensor, Variable, dtypes
from attograd.uop.ops import Ops
from attograd.codegen import to_program
from attograd.codegen.heuristic import gpu_opts
from attograd.engine import realize
from attograd.renderer.ptx import PTXRenderer
from attograd.runtime.device import Device
from attograd.schedule.schedule import create_schedule
from attograd.engine.realize import runnable
from attograd.uop.mathlib import float64_math
from op_suite_kernels import op_suite_asts, render_each

ALL = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32", "float64"]
FLOATS = ["float16", "bfloat16", "float32", "float64"]

def op_kernels() -> list:
  """(AST, opts) of every kernel a representative set of ops schedules."""
  rng = np.random.default_rng(0)
  outs = []
  for name in ALL:
    dt = getattr(dtypes, name)
    a = Tensor(rng.integers(-5, 6, (3, 5)), device="CPU").cast(dt)
    b = Tensor(rng.integers(1, 6, (3, 5)), device="CPU").cast(dt)
    outs += [a + b, a * b, a.max(axis=1), a.sum(0), a.pad(((1, 1), (0, 2))), (a < b).where(a, b), a.flip(0).T, a == b, a != b]
    # a scatter-add (a gather's transpose): each row of a added into the row its index picks, in serial loops
    outs.append((Tensor([4, 0, 4], device="CPU").reshape(3, 1, 1) == Tensor.arange(5, device="CPU").reshape(1, 5, 1)).where(a.reshape(3, 1, 5), 0).sum(0))
    outs += [a.cast(other) for other in ALL] + [a.bitcast(other) for other in ALL if getattr(dtypes, other).itemsize == dt.itemsize]
    if name != "bool": outs += [a - b, -a, a.maximum(b), a.minimum(b), a.prod(1), a.cumsum(1), a.argmax(1)]
    if dtypes.is_int(dt): outs += [a // b, a % b, a << 2, a >> b.cast("int64").cast(dt), a & b, a | b, a ^ b, a // 3, a % -3]
    if name in FLOATS:
      outs += [a.exp(), a.log(), a.sin(), a.cos(), a.sqrt(), a / b, a.softmax(1), a.trunc(), a.tanh(), a.sigmoid(), a.erf(), a.reciprocal()]
      outs += [a @ b.T, a.mean(), a.var(1), (a.reshape(1, 1, 3, 5).conv2d(b.reshape(1, 1, 3, 5)[:, :, :2, :2]))]
  idx = Tensor([2, 0, 1], device="CPU")
  x = Tensor(rng.standard_normal((4, 6)).astype(np.float32), device="CPU")
  outs += [x[idx], x.gather(1, idx.reshape(3, 1).expand(3, 6).pad(((0, 1), (0, 0)))), x[1:3, ::-2], x.sort(1)[0], x.topk(2)[0]]
  kernels = []
  for t in outs:
    kernels += [(si.ast, []) for si in t.schedule() if si.ast.op is Ops.SINK]
  # sizes where work-groups split axes and reductions (GROUP: shared memory and a barrier)
  for dt in ("float32", "float16", "int64"):
    big = Tensor.empty(256, 1024, device="CPU", dtype=dt)
    for t in (big * 2, big.sum(), big.max(axis=1), big[:64, :64] @ big[:64, :32], big.sum(0)):
      kernels += [(si.ast, []) for si in t.schedule() if si.ast.op is Ops.SINK]
  # a kernel variable: a symbolic size, unbound as realize() gets it
  rows = Tensor.empty(64, 1024, device="CPU").realize()[:Variable("n", 1, 64).bind(10)] * 2
  kernels += [(si.ast, []) for si in create_schedule(list(runnable(rows.uop.sink())[0].src))[0]]
  return kernels

# kernels the PTX renderer refuses, by error message (each must name the problem): none today
EXPECTED_REFUSALS: dict[str, int] = {}

@functools.cache  # the entries don't depend on the architecture (only the header does): render once
def entries() -> tuple[list[str], dict[str, int]]:
  """Every kernel's PTX entry, named k<i>, with the opts a CUDA device would pick (work-group sizes,
  reductions split across a work-group) unless the kernel names its own; and the refusals."""
  renderer = PTXRenderer()
  kernels = op_kernels() + [(ast, []) for ast in dict.fromkeys(op_suite_asts())]
  def render(k) -> str: return renderer.render_entry("k", to_program(k[0], renderer, k[1] or gpu_opts(k[0], renderer))[2])
  ents, refused = render_each(kernels, render)
  return [e.replace(".entry k(", f".entry k{i}(", 1) for i, e in enumerate(ents)], refused

def test_refusals_are_listed():
  ents, refused = entries()
  assert len(ents) > 2000  # the op suite makes about 2300 distinct kernels
  assert refused == EXPECTED_REFUSALS, "the PTX renderer refused:\n" + "\n".join(f"{n:4d} x {m}" for m, n in refused.items())

@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas (CUDA toolkit) is not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_op_kernels_assemble(arch, tmp_path):
  src = PTXRenderer(arch).header() + "\n".join(entries()[0])
  f = tmp_path / "ops.ptx"
  f.write_text(src)
  out = subprocess.run(["ptxas", f"-arch={arch}", "-o", str(tmp_path / "ops.cubin"), str(f)], capture_output=True, text=True, timeout=600)
  if out.returncode != 0:
    lines = src.splitlines()
    where = [int(m) for m in re.findall(r"line (\d+)", out.stderr)[:3]]
    context = "\n".join(f"{n}: {lines[n - 1]}" for n in where if 0 < n <= len(lines))
    pytest.fail(f"ptxas -arch={arch} rejected the module:\n{out.stderr[:3000]}\n{context}")
  assert (tmp_path / "ops.cubin").stat().st_size > 0

def test_ptx_is_deterministic():
  ast, opts = op_kernels()[0]
  assert to_program(ast, PTXRenderer(), opts)[1] == to_program(ast, PTXRenderer(), list(opts))[1]

# ***** the float64 math library, run on CPU *****

@pytest.fixture
def cpu_with_series(monkeypatch):
  """The CPU device computing float64 exp2/log2/sin with the series PTX uses instead of libm."""
  monkeypatch.setattr(Device["CPU"].renderer, "rewrites", float64_math)
  realize._kernel_cache.clear()
  yield
  realize._kernel_cache.clear()

def ulp_error(got: np.ndarray, want: np.ndarray) -> np.ndarray:
  same = (got == want) | (np.isnan(got) & np.isnan(want))
  with np.errstate(invalid="ignore"): return np.where(same, 0, np.abs(got - want) / np.spacing(np.abs(want)))

@pytest.mark.parametrize("name, ref, x, max_ulp", [
  ("exp2", np.exp2, np.concatenate([np.linspace(-30, 30, 5001), np.linspace(-1100, 1100, 2001),
                                    [0, -0.0, 1023.9, 1024, -1074, -1075, -1022.5, math.inf, -math.inf, math.nan]]), 1),
  ("log2", np.log2, np.concatenate([np.exp(np.linspace(-700, 700, 5001)), np.linspace(0.5, 2, 2001),
                                    [0, -0.0, 1, 5e-324, 1e-310, -1, math.inf, -math.inf, math.nan]]), 3),
  ("sin", np.sin, np.concatenate([np.linspace(-10, 10, 5001), np.linspace(-1e5, 1e5, 2001), [0, -0.0, 1e-300, math.inf, -math.inf, math.nan]]), 2),
])
def test_float64_series_accuracy(cpu_with_series, name, ref, x, max_ulp):
  got = getattr(Tensor(x, device="CPU"), name)().numpy()
  with np.errstate(all="ignore"): want = ref(x)
  err = ulp_error(got, want)
  # near a multiple of pi, sin is small and the reduction's last 1e-32 of pi shows: compare absolutely there
  if name == "sin": err = np.where(np.abs(want) < 1e-8, np.abs(got - want) / 1e-30, err)
  assert err.max() <= max_ulp, f"{name}({x[err.argmax()]}) = {got[err.argmax()]!r}, want {want[err.argmax()]!r}"

def test_ptx_refuses_old_architectures():
  for arch in ("sm_70", "sm_75", "compute_80"):
    with pytest.raises(ValueError, match="sm_80 and newer"): PTXRenderer(arch)
  assert ".target sm_120" in PTXRenderer("sm_120").header()

"""CUDA is compile-only here: every kernel the op suite (test_ops.py) runs, and those of a set of ops
in every dtype, render to CUDA C and compile with nvcc to cubins for sm_80 and sm_90. All kernels go
to nvcc in one file per architecture (one nvcc start costs seconds)."""
import functools, re
import numpy as np
import pytest
from attograd import Tensor, dtypes
from attograd.codegen import to_program
from attograd.codegen.heuristic import gpu_opts
from attograd.codegen.opt import Opt, OptOps
from attograd.renderer.cuda import CUDARenderer
from attograd.runtime.ops_cuda import find_nvcc, nvcc
from attograd.uop.ops import Ops
from helpers import ALL_DTYPES
from op_suite_kernels import op_suite_asts, render_each

FLOATS = [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64]
INTS = [d for d in ALL_DTYPES if dtypes.is_int(d)]

def tensors_of_every_op() -> list[Tensor]:
  """Lazy results covering elementwise math, casts, bitcasts, reductions, movement and indexing in
  every dtype (nothing runs: only their kernels are wanted)."""
  rng = np.random.default_rng(0)
  out = []
  for dt in ALL_DTYPES:
    x = Tensor(rng.uniform(-3, 3, (6, 10)).astype(np.float32)).cast(dt).realize()
    y = Tensor(rng.uniform(1, 3, (6, 10)).astype(np.float32)).cast(dt).realize()
    out += [x + y, x * y, x.maximum(y), x < y, x == y, (x < y).where(x, y), x.sum(1), x.max(axis=0), x.sum(), x.cumsum(1),
            x.pad(((1, 1), (2, 0))).flip(0), Tensor.cat(x, y, dim=1), x[::2, 1:7].T, x.gather(1, Tensor(rng.integers(0, 10, (6, 3)).astype(np.int32)))]
    if dt != dtypes.bool: out.append(x - y)
    # a scatter-add (a gather's transpose): each row of x added into the row its index picks, in serial loops
    out.append((Tensor([9, 0, 3, 9, 9, 1]).reshape(6, 1, 1) == Tensor.arange(10).reshape(1, 10, 1)).where(x.reshape(6, 1, 10), 0).sum(0))
    out += [x.cast(to) for to in ALL_DTYPES if to != dt]
    out += [x.bitcast(to) for to in ALL_DTYPES if to != dt and to.itemsize == dt.itemsize and dtypes.bool not in (dt, to)]
    if dtypes.is_float(dt):
      out += [x.exp(), x.log(), x.sin(), x.sqrt(), x / y, x.sigmoid(), x.floor(), x.abs(), x.softmax(1), x @ y.T, x.mean(1), x.isnan()]
    if dtypes.is_int(dt):
      out += [x // y, x % y, x & y, x | y, x ^ y, x << 1, x >> 1, -x, x.prod(1), x.argmax(1)]
  return out

# kernels the CUDA renderer refuses, by error message (each must name the problem): none today
EXPECTED_REFUSALS: dict[str, int] = {}

@functools.cache  # the source doesn't depend on the architecture: render once for both
def kernels() -> tuple[list[str], dict[str, int]]:
  """The source of every kernel the op suite runs and the ops above schedule, with the heuristics' Opts,
  and some with explicit LOCAL and GROUP; and the refusals."""
  renderer = CUDARenderer()
  asts = {ast: None for ast in op_suite_asts()} | {si.ast: None for t in tensors_of_every_op() for si in t.schedule() if si.ast.op is Ops.SINK}
  srcs, refused = render_each(list(asts), lambda ast: to_program(ast, renderer, gpu_opts(ast, renderer))[1])
  a, b = Tensor.empty(64, 32).realize(), Tensor.empty(32, 48).realize()
  srcs.append(to_program((a @ b).schedule()[-1].ast, renderer, [Opt(OptOps.LOCAL, 1, 16), Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.GROUP, 2, 8)])[1])
  srcs.append(to_program(a.sum().schedule()[-1].ast, renderer, [Opt(OptOps.GROUP, 0, 32)])[1])  # (its two axes are one loop)
  return srcs, refused

def one_file(srcs: list[str], prelude: str) -> str:
  """Many kernels in one translation unit: one prelude, each kernel renamed k<i>."""
  bodies = []
  for i, s in enumerate(srcs):
    assert s.startswith(prelude)
    bodies.append(re.sub(r"(__global__ void __launch_bounds__\(\d+\) )\w+\(", rf"\1k{i}(", s[len(prelude):], count=1))
  return prelude + "".join(bodies)

def test_refusals_are_listed():
  _, refused = kernels()
  assert refused == EXPECTED_REFUSALS, "the CUDA renderer refused:\n" + "\n".join(f"{n:4d} x {m}" for m, n in refused.items())

@pytest.mark.skipif(find_nvcc() is None, reason="nvcc (the CUDA toolkit) isn't installed here")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_kernel_compiles(arch):
  srcs, _ = kernels()
  assert len(srcs) > 2000  # the op suite makes about 2300 distinct kernels
  assert any("__shared__" in s and "__syncthreads();" in s for s in srcs) and any("threadIdx.y" in s for s in srcs)
  src = one_file(srcs, CUDARenderer.prelude)
  try: cubin = nvcc(src, arch)
  except RuntimeError as e:  # the message ends with the whole source: show the lines nvcc names instead
    err, lines = str(e).split("--- source ---")[0], src.splitlines()
    where = [int(n) for n in re.findall(r"k\.cu\((\d+)\)", err)[:5]]
    pytest.fail(err[:4000] + "\n" + "\n".join(f"{n}: {lines[n - 1]}" for n in where if 0 < n <= len(lines)))
  assert cubin[:4] == b"\x7fELF"  # a cubin is an ELF file

def test_source_spells_cuda():
  a, b = Tensor.empty(64, 32).realize(), Tensor.empty(32, 48).realize()
  src = to_program((a @ b).schedule()[-1].ast, CUDARenderer(), [Opt(OptOps.LOCAL, 1, 16), Opt(OptOps.GROUP, 2, 8)])[1]
  assert '__launch_bounds__(128)' in src and "blockIdx.y" in src and "threadIdx.x" in src and "threadIdx.y" in src
  assert "__shared__ float temp0[128];" in src and src.count("__syncthreads();") == 1
  half = to_program((Tensor.empty(8, dtype=dtypes.float16).realize() * 2).schedule()[-1].ast, CUDARenderer(), [])[1]
  assert "__half2float(" in half and "__float2half_rn(" in half

def test_running_says_compile_only():
  with pytest.raises(RuntimeError, match="CUDA is compile-only"): Tensor([1.0, 2.0], device="CUDA").numpy()

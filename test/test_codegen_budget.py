"""Code generation stays small (issue 14: lowering + compile of a kernel under 100 ms): what lowering, rendering and the C
compiler do grows with the lowered program, so the heuristics' programs for big kernels are held under ceilings here.
bench/codegen.py measures the times themselves."""
import numpy as np
import pytest
from attograd import Tensor
from attograd.uop.ops import Ops
from attograd.codegen import to_program
from attograd.codegen.heuristic import cpu_opts
from attograd.runtime.device import Device

def _ast(t: Tensor):
  return next(si.ast for si in t.schedule() if si.ast.op is not Ops.COPY)

# uops of a register-tiled matmul once lowered: written out, a 32x8 tile (AVX-512) was ~3600 and took 250-350 ms to lower
# and 400-700 ms to compile; 16x8 (AVX2) ~1900. As a SIMD loop by rows it is ~180
TILE_UOPS = 400

@pytest.mark.parametrize("simd", [8, 16])
@pytest.mark.parametrize("shape", ["matmul", "linear"])
def test_register_tile_lowers_small(simd: int, shape: str):
  a = Tensor.empty(512, 512)
  t = a @ Tensor.empty(512, 512) if shape == "matmul" else a @ Tensor.empty(384, 512).T  # x @ w.T packs its panels
  ast = _ast(t)
  _, src, uops = to_program(ast, Device["CPU"].renderer, cpu_opts(ast, 2, simd))
  assert len(uops) <= TILE_UOPS, (len(uops), cpu_opts(ast, 2, simd))
  # the tile's accumulators are set by a loop, not one store each (256 of them cost gcc 150 ms)
  assert src.count("= 0.0f;") <= 16, src

def test_small_column_sum_lowers_small():
  # a bias gradient (1024 tokens x 256): 64 columns written out, not 128 (~2070 uops; as fast, WIDE_COLUMN_SUM)
  ast = _ast(Tensor.empty(1024, 256).sum(0))
  _, _, uops = to_program(ast, Device["CPU"].renderer, cpu_opts(ast, 2, 16))
  assert len(uops) <= 1100, len(uops)

def test_loop_tiles_compute_the_product():
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((200, 96), dtype=np.float32), rng.standard_normal((96, 320), dtype=np.float32)
  w = rng.standard_normal((160, 96), dtype=np.float32)
  np.testing.assert_allclose((Tensor(a) @ Tensor(b)).relu().numpy(), np.maximum(a @ b, 0), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose((Tensor(a) @ Tensor(w).T).numpy(), a @ w.T, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(Tensor(a).sum(0).numpy(), a.sum(0), rtol=1e-5, atol=1e-4)

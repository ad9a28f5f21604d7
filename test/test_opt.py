"""Opts change how a kernel runs, never what it computes."""
import numpy as np
import pytest
from attograd import Tensor, Context
from attograd.codegen import to_program
from attograd.codegen.opt import Opt, OptOps, KernelOptError, THREADS
from attograd.engine import realize
from attograd.runtime.device import Device

def _run(make, threads):
  realize._kernel_cache.clear()
  x = Tensor(np.random.default_rng(0).standard_normal((640, 256)).astype(np.float32))  # new buffer: nothing memoized
  with Context(THREADS=threads): return make(x).numpy()

@pytest.mark.parametrize("name, make", [
  ("matmul_relu", lambda x: (x[:96, :64] @ x[:64, 100:180]).relu()),
  ("reduce_rows", lambda x: (x.sin() * 3).sum(1)),
  ("pad_flip_elementwise", lambda x: x.pad(((2, 2), (1, 0))).flip(0).exp2() * 1e-3),
])
def test_threaded_equals_single_threaded(name, make):
  one, two = _run(make, 1), _run(make, 2)
  np.testing.assert_array_equal(one, two)
  assert any(ck.threads == 2 for ck in realize._kernel_cache.values()), "the heuristic should thread a kernel this big"

def test_illegal_opts_raise():
  x = Tensor.rand(6, 5).realize()
  ast = (x + 1).schedule()[-1].ast
  renderer = Device["CPU"].renderer
  with pytest.raises(KernelOptError, match="global axes"): to_program(ast, renderer, [Opt(OptOps.THREAD, 2, 2)])
  with pytest.raises(KernelOptError, match="doesn't split"): to_program(ast, renderer, [Opt(OptOps.THREAD, 1, 2)])
  with pytest.raises(KernelOptError, match="already threaded"): to_program(ast, renderer, [Opt(OptOps.THREAD, 0, 2), Opt(OptOps.THREAD, 0, 3)])

def test_same_ast_and_opts_give_same_source():
  x = Tensor.rand(64, 64).realize()
  ast = (x @ x).schedule()[-1].ast
  opts = [Opt(OptOps.THREAD, 0, 2)]
  assert to_program(ast, Device["CPU"].renderer, opts)[1] == to_program(ast, Device["CPU"].renderer, list(opts))[1]

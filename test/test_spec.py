"""Every kernel the scheduler builds, and its lowered form, is legal by uop/spec.py."""
import pytest
from attograd import Tensor, dtypes
from attograd.uop.spec import verify_kernel
from attograd.uop.ops import UOp, Ops
from attograd.codegen import lowered
from attograd.runtime.device import Device

def graphs():
  x, y = Tensor.rand(4, 8).realize(), Tensor.rand(8, 3).realize()
  i = Tensor.arange(12).reshape(3, 4).realize()
  return {
    "matmul_relu_sum": (x @ y).relu().sum(0) + x.max(),
    "softmax_pad_flip": x.softmax(1).pad(((1, 1), (2, 0))).flip(0),
    "int_floordiv_mod": (i // 3 + i % -5).cast(dtypes.float16).sum(1),
    "slices": x[1:, ::3] * x[:-1, 1::3],
    "rand": Tensor.rand(5) + Tensor.randn(5),
  }

@pytest.mark.parametrize("name", list(graphs()))
def test_kernels_are_legal(name):
  for si in graphs()[name].schedule():
    verify_kernel(si.ast)
    verify_kernel(lowered(si.ast, Device["CPU"].renderer))

def test_spec_rejects_mismatched_alu():
  a, b = UOp.const(dtypes.float32, 1.0), UOp.const(dtypes.int32, 1)
  with pytest.raises(AssertionError, match="illegal Ops.ADD"):
    verify_kernel(UOp(Ops.ADD, dtypes.float32, (a, b)).sink())

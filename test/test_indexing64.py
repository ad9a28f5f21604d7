"""64-bit indexing where 32-bit could overflow (DESIGN invariant 8), decided from the bounds of the
index math; validity-aware simplification under a pad's gate; and the index expressions that common
reshape/permute/pad chains simplify to, pinned as text."""
import numpy as np
import pytest
from attograd import Tensor, dtypes
from helpers import DEVICES
from attograd.uop.ops import UOp, Ops
from attograd.renderer.cstyle import CStyleRenderer
from attograd.codegen import to_program

def kernels(t: Tensor) -> list[UOp]: return [si.ast for si in t.schedule() if si.ast.op is Ops.SINK]
def source(t: Tensor) -> str: return "\n".join(to_program(ast, CStyleRenderer())[1] for ast in kernels(t))
def index_dtypes(t: Tensor) -> set:
  return {u.dtype for ast in kernels(t) for u in ast.toposort if u.op is Ops.RANGE}
def indices(t: Tensor) -> list[str]:
  """The index of every load and store of the (one) kernel, as text."""
  (ast,) = kernels(t)
  return [u.src[1].render() for u in ast.toposort if u.op is Ops.INDEX and u.src[0].op is Ops.PARAM]

# ***** int64 where int32 could overflow; int32 everywhere else *****

def test_over_2_31_elements_uses_int64():
  t = Tensor.empty(65537, 32768, dtype=dtypes.uint8)  # 2**31 + 32768 elements, never allocated
  src = source(t + 1)
  assert "long long r0" in src and "for (int " not in src
  assert index_dtypes(t + 1) == {dtypes.int64}

def test_small_tensors_keep_int32():
  t = Tensor.empty(64, 32)
  src = source((t + 1).sum(1))
  src = src[src.index("void "):src.index("_slice(")]  # the kernel, not the prelude's helpers nor its slice entry's arrays
  assert "long long" not in src and "for (int r0" in src
  assert index_dtypes(t.permute(1, 0) * 2) == {dtypes.int32}

def test_intermediate_over_2_31_uses_int64():
  # every buffer and loop is small, but the reshape of the expand indexes 2**32 virtual elements:
  # r0*1024 + r1 wraps in int32 (and % of a wrapped value is negative), so the index math is int64
  a = Tensor.empty(1, 65536).expand(65536, 65536).reshape(2**22, 1024).sum(1)
  assert index_dtypes(a) == {dtypes.int64}
  # the same chain 256 times smaller stays int32
  b = Tensor.empty(1, 4096).expand(4096, 4096).reshape(2**14, 1024).sum(1)
  assert index_dtypes(b) == {dtypes.int32}

def test_big_constant_uses_int64():
  # a pad of 2**31 shrunk away again: nothing is big but the offset, which int32 can't even hold
  t = Tensor.empty(16).pad(((2**31, 0),))[2**31:] + 1
  assert index_dtypes(t) == {dtypes.int64}

@pytest.mark.parametrize("device", DEVICES)
def test_int64_choice_is_correct_on_small_data(device):
  # the same index pattern at a size that runs: values match numpy
  a = np.arange(16, dtype=np.float32).reshape(1, 16)
  got = Tensor(a, device=device).expand(16, 16).reshape(64, 4).sum(1).numpy()
  np.testing.assert_allclose(got, np.broadcast_to(a, (16, 16)).reshape(64, 4).sum(1))

# ***** validity-aware simplification: inside a pad's gate *****

def test_gate_simplifies_index():
  # pad, then reshape: without the gate the load index is ((((r0*4)+r1)+-2)/4%4)*4 + ...; inside the
  # gate (2 <= r0*4+r1 < 18) it is the plain offset, so the two loops read as one (schedule.py, merge_loops)
  t = Tensor.empty(16).pad(((2, 2),)).reshape(5, 4) + 1
  assert indices(t) == ["r0", "(r0+-2)"]

def test_gate_narrows_range():
  t = Tensor.empty(4, 4).pad(((0, 0), (3, 1))).reshape(4, 2, 4)[:, 1:, :] + 1  # reads columns r2 >= 3 only
  (load,) = [i for i in indices(t)[1:]]
  assert load == "(((r0*4)+r2)+1)"  # column 4+r2 of the pad is column r2+1 of the tensor

@pytest.mark.parametrize("device", DEVICES)
def test_gated_values(device):
  x = np.arange(16, dtype=np.float32)
  np.testing.assert_equal((Tensor(x, device=device).pad(((2, 2),)).reshape(5, 4) + 1).numpy(), np.pad(x, (2, 2)).reshape(5, 4) + 1)
  y = np.arange(16, dtype=np.float32).reshape(4, 4)
  got = (Tensor(y, device=device).pad(((0, 0), (3, 1))).reshape(4, 2, 4)[:, 1:, :] + 1).numpy()
  np.testing.assert_equal(got, np.pad(y, ((0, 0), (3, 1))).reshape(4, 2, 4)[:, 1:, :] + 1)

# ***** simplification quality: reshape/permute chains collapse *****

@pytest.mark.parametrize("build, want", [
  # a chain that reads every element where it writes it is one loop (merge_loops)
  (lambda t: t.reshape(16, 4).reshape(8, 8), ["r0"] * 2),
  # (L//16)*16 + ((L//4)%4)*4 + L%4 = L, though L//4 and L%4 were simplified before the sum saw them
  (lambda t: t.reshape(4, 4, 4).reshape(64).reshape(8, 8), ["r0"] * 2),
  (lambda t: t[:60].reshape(3, 4, 5).reshape(60).reshape(6, 10), ["r0"] * 2),
  (lambda t: t.reshape(4, 4, 4).reshape(64).reshape(2, 32), ["r0"] * 2),
  (lambda t: t.reshape(8, 8).permute(1, 0).permute(1, 0), ["r0"] * 2),
  (lambda t: t.reshape(2, 4, 8).permute(1, 0, 2).reshape(4, 16), ["((r0*16)+r1)", "((((r1/8)*32)+(r1%8))+(r0*8))"]),
  (lambda t: t.reshape(8, 8).permute(1, 0).reshape(64).reshape(8, 8), ["((r0*8)+r1)", "(r0+(r1*8))"]),
  (lambda t: t.reshape(4, 16).reshape(4, 4, 4).permute(0, 2, 1).reshape(4, 16),
   ["((r0*16)+r1)", "(((r1/4)+((r1%4)*4))+(r0*16))"]),
  (lambda t: t.reshape(8, 8)[2:6, 1:7], ["((r0*6)+r1)", "(((r0*8)+r1)+17)"]),
  (lambda t: t.reshape(8, 8).flip(1), ["((r0*8)+r1)", "(((r0*8)+(r1*-1))+7)"]),
])
def test_reshape_chain_index(build, want):
  assert indices(build(Tensor.empty(64)) + 1) == want
